"""Issue 34: `jax-nbmem status` on the host speaks the terminal's language and names owners.

Root looks at the node: its own preallocated kernel and another user's (a hub user's, whose
Unix name differs). Each warning names the command that works where it is read (`jax-nbmem
shutdown PID`, not the notebook's `%jaxmem shutdown`) and the kernel's owner, hub user and
Unix user, as a kernel's own warnings name them. The kernels are stand-ins that Jupyter's
command line names, with jaxlib loaded (so that their preallocation is judged as a real
kernel's), the other user's dropped to that user after loading it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jax_nbmem.cli.command import main
from jax_nbmem.simgpu import GIB

pytestmark = pytest.mark.kernel

TOTAL = 80 * GIB
POOL = int(0.75 * TOTAL) + (300 << 20)  # a default JAX pool and the CUDA context
HUB_USER = "ada-hub"


def _kernel(tmp_path, name: str, *, uid: int | None = None, gid: int | None = None):
    drop = f"os.setgroups([]); os.setgid({gid}); os.setuid({uid})\n" if uid is not None else ""
    code = f"import os, sys, time, jax\n{drop}print('ready', flush=True)\ntime.sleep(120)"
    env = {
        "PATH": "/usr/bin:/bin",
        "JAX_PLATFORMS": "cpu",
        "JPY_SESSION_NAME": f"/srv/{name}.ipynb",
    }
    if uid is not None:
        env["JUPYTERHUB_USER"] = HUB_USER
    process = subprocess.Popen(
        [sys.executable, "-c", code, "-m", "ipykernel_launcher",
         "-f", str(tmp_path / f"kernel-{name}.json")],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.fixture
def two_kernels(tmp_path, other_user):
    name, uid, gid = other_user
    started = []
    try:
        started.append(_kernel(tmp_path, "0a1b2c3d", uid=None))
        started.append(_kernel(tmp_path, "4e5f6a7b", uid=uid, gid=gid))
        yield started[0].pid, started[1].pid, name
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_the_host_names_its_own_command_and_every_owner(
    two_kernels, simgpu_in_process, capsys, monkeypatch
):
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    monkeypatch.delenv("JAX_NBMEM_SHARE_DIR", raising=False)
    own, theirs, unix_name = two_kernels
    state = simgpu_in_process.gpu(0, total=TOTAL).gpu(1, total=TOTAL)
    state.process(0, own, POOL).process(1, theirs, POOL).write()
    assert main(["status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    blocking = {w["pid"]: w["message"] for w in report["warnings"]
                if w["kind"] == "blocking-preallocation"}  # fmt: skip
    assert set(blocking) == {own, theirs}, report["warnings"]
    # Root's own kernel: the terminal's command, and whose it is.
    assert f"Shut it down (`jax-nbmem shutdown {own} --yes`)" in blocking[own], blocking[own]
    assert "%jaxmem" not in blocking[own] and "user root" in blocking[own]
    # Another user's: the hub user and the Unix user, as a kernel's own warnings name them.
    assert f"hub user {HUB_USER} (Unix user {unix_name})" in blocking[theirs], blocking[theirs]
    assert f"`jax-nbmem shutdown {theirs} --yes`" in blocking[theirs]
    assert "%jaxmem" not in blocking[theirs]
    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert f"`jax-nbmem shutdown {own} --yes`" in text and f"hub user {HUB_USER}" in text
