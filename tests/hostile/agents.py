"""What the hostile agent tests share: real users, a share folder they can reach, an agent,
and their processes (each a real process of that user, see as_user.py). Root only."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from jax_nbmem.agent.server import AgentServer, Registry
from tests.agent.namespaces import CLIENT, need_namespaces
from tests.jupyterlab import REPO_ROOT
from tests.users import add_user, remove_user

AS_USER = Path(__file__).with_name("as_user.py")
IDLE = Path(__file__).with_name("idle_caller.py")

__all__ = ["AS_USER", "CLIENT", "IDLE", "as_user", "reachable_share", "running", "serving", "users"]


@pytest.fixture(scope="module")
def users():
    """Two throwaway users, mallory and bob."""
    need_namespaces()
    made = add_user("mallory"), add_user("bob")
    yield made
    for user in made:
        remove_user(user)


@pytest.fixture
def reachable_share():
    """A share folder (1777) under a folder every user can reach (pytest's own is root's)."""
    top = Path(tempfile.mkdtemp(prefix="jn-hostile-"))
    top.chmod(0o755)
    share = top / "share"
    share.mkdir()
    share.chmod(0o1777)
    yield share
    shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def serving(share: Path | None, **limits):
    """An agent on ``share`` (and TCP where ``tcp=`` is given), stopped afterwards."""
    agent = AgentServer(None if share is None else str(share), Registry(), **limits)
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


def as_user(user, script: Path, *args) -> list[str]:
    """The command line that runs ``script ARGS`` as ``user`` (from root's Python)."""
    return [sys.executable, str(AS_USER), str(user.uid), str(user.gid), str(script),
            *map(str, args)]  # fmt: skip


@contextlib.contextmanager
def running(args: list[str]):
    """``args`` as a process (its lines on stdout), killed afterwards."""
    popen = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                             start_new_session=True)  # fmt: skip
    try:
        yield popen
    finally:
        os.killpg(popen.pid, signal.SIGKILL)  # it and what it forked
        popen.wait(20)
