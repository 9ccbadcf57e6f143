"""Issue 22: people are named as the hub knows them, and the one who can act is told how.

In a container hub every Unix user may be ``jovyan``: the hub's user name (``JUPYTERHUB_USER``,
in a kernel's beacon or its environment) is what tells alice's kernel from bob's. Another
user's notebook is shown under their home (``~alice/...``), never as the reader's ``~/``.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time

import psutil
import pytest

from jax_nbmem.gpu.nvml import GpuMemory, GpuProcess
from jax_nbmem.node.beacons import SCHEMA, read_beacons
from jax_nbmem.simgpu import GIB
from jax_nbmem.tenants import advice
from jax_nbmem.tenants.advice import warnings_for
from jax_nbmem.tenants.attribution import attribute, inspect_process, shown_notebook
from jax_nbmem.tenants.status import format_status
from tests.waiting import wait_for

TOTAL = 80 * GIB
UUID = "GPU-22222222-3434-5656-7878-909090909090"
POOL = int(0.75 * TOTAL) + (300 << 20)


def _gpu(free: int) -> GpuMemory:
    return GpuMemory(0, UUID, "NVIDIA H200 (simulated)", TOTAL, TOTAL - free, free)


@pytest.fixture
def alices_kernel(tmp_path):
    """A live process of this Unix user that says, in its beacon, it is hub user alice's."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        started = wait_for("its start time", lambda: psutil.Process(process.pid).create_time())
        beacon = {
            "schema": SCHEMA, "pid": process.pid, "started_at": started,
            "user": psutil.Process().username(), "hub_user": "alice", "kernel_id": "k-alice",
            "notebook": "hog.ipynb", "mode_requested": "on", "mode_in_effect": "on",
            "pool_fraction": 0.75, "gpus": {UUID: {"bytes_in_use": GIB, "pool_bytes": POOL}},
            "cell_running": False, "last_cell_finished_at": time.time() - 3600,
            "written_at": time.time(),
        }  # fmt: skip
        (tmp_path / f"jax_nbmem-beacon-{process.pid}.json").write_text(json.dumps(beacon))
        yield process.pid, read_beacons([str(tmp_path)])
    finally:
        process.kill()
        process.wait()


def _warning(pid, beacons):
    gpu = _gpu(TOTAL - POOL - GIB)
    (tenant,) = attribute([GpuProcess(pid, 0, POOL)], [gpu], own_pid=1, beacons=beacons)
    (warning,) = [
        w for w in warnings_for([tenant], [gpu], own_backend_started=True)
        if w.kind == "blocking-preallocation"
    ]  # fmt: skip
    return tenant, warning


def test_the_same_unix_user_under_another_hub_name_is_someone_else(alices_kernel, monkeypatch):
    pid, beacons = alices_kernel
    monkeypatch.setenv("JUPYTERHUB_USER", "bob")  # bob reads; both are the same Unix user
    monkeypatch.setattr(advice, "may_stop_others", lambda: False)
    tenant, warning = _warning(pid, beacons)
    assert tenant.hub_user == "alice" and tenant.to_dict()["hub_user"] == "alice"
    unix = psutil.Process().username()
    assert f"hub user alice (Unix user {unix})" in warning.message
    assert "Ask its owner (alice)" in warning.message
    assert f"`jax-nbmem shutdown {pid} --yes`" in warning.message  # what the administrator runs
    assert "%jaxmem shutdown" in warning.message  # and why bob cannot
    line = format_status({
        "nvml": {"available": True}, "gpus": [{
            "index": 0, "name": "H200", "ours": True, "used_bytes": POOL, "total_bytes": TOTAL,
            "free_bytes": TOTAL - POOL,
        }], "processes": [tenant.to_dict()], "warnings": [], "notes": [],
    })  # fmt: skip
    assert f"hub user alice (Unix user {unix})" in line

    # Alice reads her own kernel: nobody else's, so no owner named and her own command.
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    tenant, warning = _warning(pid, beacons)
    assert "hub user" not in warning.message and "Ask its owner" not in warning.message
    assert "Stop it, or start it with" in warning.message  # a process of her own


def test_an_administrator_is_told_the_command_that_stops_it(alices_kernel, monkeypatch):
    pid, beacons = alices_kernel
    monkeypatch.setenv("JUPYTERHUB_USER", "bob")
    monkeypatch.setattr(advice, "may_stop_others", lambda: True)
    _, warning = _warning(pid, beacons)
    assert f"As an administrator, stop it with `jax-nbmem shutdown {pid} --yes`" in warning.message
    assert "ask an administrator" not in warning.message


def test_the_hub_name_is_read_from_a_readable_environment():
    env = {**os.environ, "JUPYTERHUB_USER": "carol"}
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        info = wait_for(
            "its environment",
            lambda: (i := inspect_process(process.pid, own_pid=1)).hub_user and i,
        )
        assert info.hub_user == "carol"
    finally:
        process.kill()
        process.wait()
    assert inspect_process(os.getpid(), own_pid=1).hub_user == os.environ.get("JUPYTERHUB_USER")


def test_another_users_home_is_shown_with_their_name():
    me = psutil.Process().username()
    other = next(
        (u for u in pwd.getpwall() if u.pw_name != me and u.pw_dir not in ("/", "")
         and os.path.expanduser("~") != u.pw_dir),
        None,
    )  # fmt: skip
    if other is None:
        pytest.skip("no other account with a home directory on this system")
    home = other.pw_dir.rstrip("/")
    assert shown_notebook(f"{home}/hog.ipynb", other.pw_name) == f"~{other.pw_name}/hog.ipynb"
    mine = os.path.expanduser("~").rstrip("/")
    assert shown_notebook(f"{mine}/own.ipynb", me) == "~/own.ipynb"
    assert shown_notebook(f"{mine}/own.ipynb", None) == "~/own.ipynb"
