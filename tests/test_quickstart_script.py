"""The README's product command: scripts/quickstart.sh starts JupyterLab on the quickstart."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.ipython_session import clean_environ

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _api(port: int, token: str, path: str, body: dict | None = None, method: str | None = None):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        method=method or ("GET" if body is None else "POST"),
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read())


def test_quickstart_script_serves_a_copy_of_the_notebook_on_a_simulated_gpu(tmp_path):
    tracked = ROOT / "notebooks" / "quickstart.ipynb"
    tracked_before = tracked.read_bytes()
    port, token = _free_port(), "quickstart-test-token"
    env = {**clean_environ(), "JAX_NBMEM_NO_INSTALL": "1", "TMPDIR": str(tmp_path)}
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    command = ["bash", "scripts/quickstart.sh", "--simulated-gpu", "--no-browser",
               f"--port={port}", f"--IdentityProvider.token={token}",
               "--LabApp.news_url=None", "--ServerApp.open_browser=False"]  # fmt: skip
    server = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _api(port, token, "status")
                break
            except OSError:
                assert server.poll() is None, server.stdout.read()
                assert time.monotonic() < deadline, "JupyterLab did not answer"
                time.sleep(0.5)
        # The server serves the copy's folder, build/quickstart/, as a file argument makes it.
        copy = "quickstart.ipynb"
        assert [item["name"] for item in _api(port, token, "contents")["content"]] == [copy]
        session = _api(
            port,
            token,
            "sessions",
            {"path": copy, "type": "notebook", "kernel": {"name": "python3"}},
        )
        assert session["path"] == copy
        # The user runs the cells and JupyterLab saves them, outputs and all: into the copy.
        model = _api(port, token, f"contents/{copy}")
        model["content"]["cells"][1]["outputs"] = [
            {"output_type": "stream", "name": "stdout", "text": "a run's output\n"}
        ]
        _api(
            port,
            token,
            f"contents/{copy}",
            {"type": "notebook", "content": model["content"]},
            "PUT",
        )
        assert "a run's output" in (ROOT / "build" / "quickstart" / copy).read_text()
        assert tracked.read_bytes() == tracked_before  # the repository's notebook is untouched
        # --simulated-gpu built the stand-in library in this user's own folder, labelled.
        state = tmp_path / f"jax_nbmem-simgpu-{os.getuid()}" / "gpu.state"
        assert "NVIDIA H200 (simulated)" in state.read_text()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
