"""The node agent started as docs/containers.md says where systemd does not run it.

The page's block runs as written, as root, in a mount namespace whose /var/tmp is a fresh
tmpfs (so its folders are the documented ones, /var/tmp/jax_nbmem and its agent/), on a free
port instead of 9840. Then a throwaway user, with no flag, reads the agent's resolution in
the documented folder, and Prometheus' scrape of the page's address answers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.admin.test_docs_commands import _blocks
from tests.jupyterlab import REPO_ROOT
from tests.users import add_user, python_for, remove_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None,
    reason="needs root, unshare and nsenter: the documented folders in a mount namespace",
)


def _block() -> str:
    (block,) = [b for page, b in _blocks()
                if page == "docs/containers.md" and "jax-nbmem exporter --listen" in b]  # fmt: skip
    return block


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scrape(port: int) -> str:
    """/metrics once its first look at the node is taken (at most 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        if re.search(r"^jax_nbmem_snapshot_timestamp_seconds ", text, re.M):
            return text
        if time.monotonic() > deadline:
            return text
        time.sleep(0.5)


@pytest.fixture
def user():
    made = add_user("jnbadm")
    yield made
    remove_user(made)


@pytest.fixture
def readable() -> Path:
    """A folder the throwaway user reaches (not under /var/tmp, which the namespace hides)."""
    folder = Path(tempfile.mkdtemp(prefix="jnm-admin-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_page_s_block_starts_the_agent_that_a_user_s_status_reads(tmp_path, user, readable):
    port = _free_port()
    block = _block()
    assert "127.0.0.1:9840" in block and "/var/tmp/jax_nbmem" in block
    shim = tmp_path / "bin" / "jax-nbmem"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m jax_nbmem.cli "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    env.pop("JAX_NBMEM_SHARE_DIR", None)
    script = 'mount -t tmpfs -o mode=1777 tmpfs /var/tmp && exec bash -euc "$0"'
    agent = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
         block.replace("127.0.0.1:9840", f"127.0.0.1:{port}")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = agent.stdout.readline()
        assert line.startswith("jax-nbmem exporter: serving http://127.0.0.1:"), agent.stderr.read()
        assert re.search(r"^jax_nbmem_up 1(\.0)?$", _scrape(port), re.M), _scrape(port)
        python, user_env = python_for(user, readable, env)
        user_env.pop("JAX_NBMEM_SHARE_DIR", None)
        status = [python, "-m", "jax_nbmem.cli", "status", "--json"]
        deadline, report = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            done = subprocess.run(
                ["nsenter", "--target", str(agent.pid), "--mount", "--",
                 "setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
                 *status],
                env=user_env, cwd="/", capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            report = json.loads(done.stdout)
            if (report.get("agent") or {}).get("state") == "fresh":
                break
            time.sleep(1)
        assert (report.get("agent") or {}).get("state") == "fresh", report
        notes = " ".join(report.get("notes") or [])
        assert "Node agent not consulted" not in notes, notes
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(15)
