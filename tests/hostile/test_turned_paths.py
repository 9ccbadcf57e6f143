"""Issue 44 items 3 and 4: root's stop and the culler, turned by what a user controls on the host.

- Mallory's server listens on 127.0.0.2 at the very port bob's listens on at 127.0.0.1, and
  her runtime file names 127.0.0.1: root's ``jax-nbmem shutdown`` of her kernel sends bob's
  server nothing (the address is compared whole, in her server's own network namespace).
  Nor when her server listens at bob's very address in a network namespace of her own.
- A FIFO named ``jpserver-1.json`` in her runtime folder: root's stop of her kernel finishes
  (runtime files are opened without blocking, and must be regular files of their user).
- A notebook name with terminal escapes in her beacon: ``jax-nbmem shutdown --dry-run`` and
  ``jax-nbmem cull --once --dry-run`` show it escaped, and the culler marks her claimed hub
  user as "(claimed)".
"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from jax_nbmem.cli.command import main
from jax_nbmem.node.servers import find_servers
from jax_nbmem.simgpu import GIB
from tests.jupyterlab import REPO_ROOT
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(180)

_ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[8mhidden.ipynb"
_SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[8mhidden.ipynb"


def _run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    said = capsys.readouterr()
    return code, said.out + said.err


def test_her_server_at_bobs_port_on_another_loopback_address_sends_bob_nothing(servers, capsys):
    bob = servers.server(servers.bob, [{"id": "b0b0-kernel"}])
    mallory = servers.server(servers.mallory, [{"id": "ma11-kernel"}], host="127.0.0.2",
                             port=bob.port, file_host="127.0.0.1")  # fmt: skip
    assert mallory.port == bob.port
    hers = mallory.kernels["ma11-kernel"]
    code, said = _run(capsys, "shutdown", str(hers), "--dry-run")
    assert code == 0 and "with SIGTERM" in said, said  # her own PID, not a server's word
    code, said = _run(capsys, "shutdown", str(hers), "--yes", "--log",
                      str(servers.folder / "admin.log"))  # fmt: skip
    assert code == 0 and f"Stopped kernel PID {hers}" in said, said
    assert bob.requests() == [] and bob.deletes() == []
    assert psutil.pid_exists(bob.kernels["b0b0-kernel"])
    wait_for("her kernel stopped", lambda: not _running(hers), 30)


def test_her_server_at_bobs_address_in_a_network_namespace_of_her_own_sends_bob_nothing(
    servers, capsys
):
    bob = servers.server(servers.bob, [{"id": "b0b0-kernel"}])
    mallory = servers.server(servers.mallory, [{"id": "ma11-netns"}], port=bob.port, netns=True)
    assert mallory.port == bob.port  # the same address and port, in her own namespace
    hers = mallory.kernels["ma11-netns"]
    code, said = _run(capsys, "shutdown", str(hers), "--dry-run")
    assert code == 0 and "with SIGTERM" in said, said
    assert bob.requests() == [] and mallory.requests() == []


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_fifo_runtime_file_does_not_hang_roots_stop(servers):
    mallory = servers.server(servers.mallory, [{"id": "ma11-fifo"}])
    hers = mallory.kernels["ma11-fifo"]
    runtime = mallory.user.home / ".local" / "share" / "jupyter" / "runtime"
    fifo = runtime / "jpserver-1.json"
    os.mkfifo(fifo)
    os.chown(fifo, mallory.user.uid, mallory.user.gid)
    try:
        assert [s.pid for s in find_servers(str(runtime), mallory.user.uid)] == [mallory.pid]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "jax_nbmem.cli", "shutdown", str(hers), "--yes",
                 "--log", str(servers.folder / "admin.log")],
                env=env, capture_output=True, text=True, timeout=90,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.fail("root's stop hung on a FIFO named like a runtime file")
        said = done.stdout + done.stderr
        assert done.returncode == 0, said
        assert f"through its Jupyter server http://127.0.0.1:{mallory.port}/" in said
        assert mallory.deletes() == ["ma11-fifo"]
    finally:
        fifo.unlink()


def test_terminal_escapes_in_her_notebook_name_reach_no_terminal(
    servers, simgpu_in_process, capsys, monkeypatch
):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    monkeypatch.delenv("JAX_NBMEM_HUB_URL", raising=False)
    claims = {"notebook": _ESCAPES, "hub_user": servers.bob.name,
              "mode_requested": "on", "mode_in_effect": "on", "pool_fraction": 0.75}  # fmt: skip
    mallory = servers.server(servers.mallory, [{"id": "ma11-esc", "beacon": claims}])
    hers = mallory.kernels["ma11-esc"]
    simgpu_in_process.gpu(0, total=80 * GIB).process(0, hers, 60 * GIB).write()
    share = str(servers.share)

    code, said = _run(capsys, "shutdown", str(hers), "--dry-run", "--share-dir", share)
    assert "\x1b" not in said and "\x07" not in said, said
    assert _SHOWN in said, said

    code, said = _run(capsys, "cull", "--once", "--dry-run", "--idle", "60", "--share-dir", share)
    assert code == 0, said
    assert "\x1b" not in said and "\x07" not in said, said
    assert _SHOWN in said, said
    assert f"hub user {servers.bob.name} (claimed) (Unix user {servers.mallory.name})" in said
    assert mallory.deletes() == [] and psutil.pid_exists(hers)
