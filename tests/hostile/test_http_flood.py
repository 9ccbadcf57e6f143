"""Issue 52 item 1: mallory's slow HTTP connections never starve the node agent.

The exporter (root, with the node agent in the same process) runs under a lowered limit of 256
open files, as the unit's 4096 scaled down. Mallory, a real user, keeps 600 connections to its
HTTP port, each with a request she never finishes (a slowloris client: a header line every
2 s), and opens another whenever one is closed. Meanwhile a kernel in a container of its own
registers with the agent, again and again, and ``/metrics`` answers, every time. Before, her
connections took every descriptor: the agent's accept failed (EMFILE, logged in a loop) and
neither the kernel nor a scrape was answered. Root only; the figures (at 4096, each answer
within 1 s) are benchmarks/agent_attack.py's ``--http-flood``.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.agent.namespaces import client_args, contained
from tests.hostile.agents import as_user, running
from tests.jupyterlab import REPO_ROOT

pytestmark = pytest.mark.timeout(240)

SLOW_HTTP = Path(__file__).with_name("slow_http.py")
FD_LIMIT = 256


def _lowered() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@contextlib.contextmanager
def _exporter(share: Path, log: Path):
    """Root's exporter and node agent on ``share`` at 256 open files; yields its /metrics URL."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "w") as stderr:  # a file: a log in a loop never fills a pipe and stops it
        exporter = subprocess.Popen(
            [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
             "--share-dir", str(share), "--interval", "1"],
            env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, preexec_fn=_lowered,
        )  # fmt: skip
    try:
        line = exporter.stdout.readline()
        assert line.startswith("jax-nbmem exporter: serving "), line + log.read_text()
        yield line.split("serving ", 1)[1].strip(), exporter.pid
    finally:
        exporter.kill()
        exporter.wait(30)


def _line_within(popen: subprocess.Popen, seconds: float) -> str | None:
    ready, _, _ = select.select([popen.stdout], [], [], seconds)
    return popen.stdout.readline().strip() if ready else None


def _files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _scraped(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status == 200 and b"jax_nbmem_up" in reply.read()
    except OSError:
        return False


def test_a_slow_http_flood_at_the_descriptor_limit_leaves_the_agent_and_metrics_answering(
    node, tmp_path
):
    log = tmp_path / "exporter.log"
    with _exporter(node.share, log) as (url, exporter_pid):
        agent_socket = node.share / "agent" / "agent.sock"
        assert _scraped(url)
        port = url.split(":")[2].split("/")[0]
        with running(as_user(node.mallory, SLOW_HTTP, "127.0.0.1", port, 600)) as flood:
            # Her flood at full strength: the exporter's files all taken (before), or each of
            # her connections cut and opened again, hundreds of times (now).
            reopened, deadline = 0, time.monotonic() + 120
            while time.monotonic() < deadline:
                if reopened >= 600 or _files(exporter_pid) >= FD_LIMIT - 16:
                    break
                reopened = json.loads(_line_within(flood, 30) or "{}").get("reopened", 0)
            else:
                pytest.fail("her flood never took hold")
            for attempt in range(3):
                with contained(client_args(agent_socket), hostname=f"bob-{attempt}") as box:
                    said = _line_within(box.popen, 15)
                    assert said is not None, "the agent never answered bob's kernel"
                    assert json.loads(said) == {"ok": True, "pid": box.host_pid}
                assert _scraped(url), "/metrics did not answer under the flood"
            assert flood.poll() is None  # her flood ran throughout
    said = log.read_text()
    assert said.count("accept failed") <= 5, said[-2000:]  # said at a bounded rate, if at all
