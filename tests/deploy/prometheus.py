"""Debian's prometheus and promtool for the deploy tests: where they are, or why a test skips.

`.ci/prometheus-deps.sh` installs them (scripts/test.sh runs it); without them the tests that
need them skip, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "jax_nbmem.rules.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "jax_nbmem.rules.test.yml"


def tool(name: str) -> str:
    """The path of Debian's ``name`` (prometheus, promtool), or skip the test saying why."""
    found = shutil.which(name) or (
        f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None
    )
    if found is None:
        pytest.skip(f"{name} is missing (run .ci/prometheus-deps.sh)")
    return found


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run promtool; its output and exit status come back."""
    return subprocess.run(
        [tool("promtool"), *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Prometheus:
    """A prometheus on loopback with a given config, asked through its HTTP API."""

    def __init__(self, config: str, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(config)
        if RULES.exists():
            shutil.copy(RULES, workdir / RULES.name)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        self._log = self.log.open("wb")
        self.process = subprocess.Popen(
            [tool("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
             f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            cwd=workdir, stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"prometheus did not get ready:\n{self.log.read_text()[-3000:]}")

    def api(self, endpoint: str, **params) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{endpoint}?{query}", timeout=10) as reply:
            answer = json.loads(reply.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[tuple[dict, float]]:
        """An instant query's ``(labels, value)`` samples."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def targets(self) -> list[dict]:
        return self.api("targets")["activeTargets"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
