"""Issue 24, item 6: however a kernel ends where Python still runs, its beacon goes with it.

Real kernels: one shut down by its frontend (a ``shutdown_request`` through jupyter_client, as
the notebook's "Shut Down Kernel", a restart or the server's culling sends), one whose parent
(its Jupyter server) is killed, which ipykernel ends with ``os._exit``, skipping ``atexit``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.ipython_session import clean_environ
from tests.kernels import execute, running_kernel
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel

# Another library's clean-up at exit that takes its time (JAX's own tears its backend down),
# registered before jax_nbmem loads, so that it runs after jax_nbmem's own at exit.
SLOW_EXIT = "import atexit, time\natexit.register(time.sleep, 1.5)\n"


def _beacons(pid: int, *folders) -> list[Path]:
    return [Path(folder) / f"jax_nbmem-beacon-{pid}.json" for folder in folders]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_kernel_shut_down_by_its_frontend_leaves_no_beacon(tmp_path):
    share = tmp_path / "share"
    with running_kernel(env={"JAX_NBMEM_SHARE_DIR": str(share)}) as (manager, client):
        out, error = execute(client, SLOW_EXIT + "%load_ext jax_nbmem")
        assert error is None, out
        process = manager.provisioner.process
        paths = _beacons(process.pid, os.environ["JUPYTER_RUNTIME_DIR"], share)
        wait_for("its beacon in both folders", lambda: all(p.exists() for p in paths), 20)
        client.shutdown()  # a shutdown_request
        wait_for("the kernel's own exit", lambda: process.poll() is not None, 30)
        assert process.returncode == 0  # it ended itself, cleanly: nothing was killed
        assert [p for p in paths if p.exists()] == []


# The Jupyter server in small: starts a kernel, loads jax_nbmem in it, says the kernel's PID,
# and waits to be killed.
_PARENT = textwrap.dedent(
    """
    import json, os, sys, time
    from tests.kernels import execute, running_kernel
    with running_kernel(env=json.loads(sys.argv[1])) as (manager, client):
        out, error = execute(client, "%load_ext jax_nbmem\\nimport os; print(os.getpid())")
        print(json.dumps({"pid": int(out.split()[-1]), "error": error}), flush=True)
        time.sleep(600)
    """
)


def test_a_kernel_whose_server_died_leaves_no_beacon(tmp_path):
    share = tmp_path / "share"
    kernel_env = {"JAX_NBMEM_SHARE_DIR": str(share)}
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, json.dumps(kernel_env)],
        stdout=subprocess.PIPE, text=True, env=clean_environ(), cwd=Path(__file__).parents[2],
    )  # fmt: skip
    pid = None
    try:
        said = json.loads(parent.stdout.readline() or "{}")
        assert said.get("error") is None and said.get("pid"), said
        pid = said["pid"]
        assert psutil.Process(pid).ppid() == parent.pid
        paths = _beacons(pid, os.environ["JUPYTER_RUNTIME_DIR"], share)
        wait_for("its beacon in both folders", lambda: all(p.exists() for p in paths), 20)
        os.kill(parent.pid, signal.SIGKILL)  # the server dies; nothing of it runs again
        parent.wait(10)
        wait_for("the kernel's exit after its parent's", lambda: _gone(pid), 20)
        assert [p for p in paths if p.exists()] == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if pid is not None and not _gone(pid):
            os.kill(pid, signal.SIGKILL)
