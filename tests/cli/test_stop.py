"""Issue 22: `jax-nbmem shutdown` and `cull` refuse bad input and faults, changing nothing.

The stops themselves, through a real hub and its users' servers, are in tests/hub/.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import psutil
import pytest

from jax_nbmem.cli.command import main


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_pid_that_is_no_kernel_is_refused(sleeper, capsys):
    assert main(["shutdown", str(sleeper)]) == 1
    error = capsys.readouterr().err
    assert f"PID {sleeper} is not a Jupyter kernel" in error and "nothing done" in error
    assert psutil.pid_exists(sleeper)


def test_a_pid_that_exited_is_said(capsys):
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert main(["shutdown", str(process.pid)]) == 1
    assert "nothing done" in capsys.readouterr().err


def test_a_hub_that_does_not_answer_changes_nothing(monkeypatch, capsys, tmp_path):
    kernel = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "ipykernel_launcher",
         "-f", str(tmp_path / "kernel-0a1b2c.json")],
    )  # fmt: skip
    try:
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "not-a-real-token")
        monkeypatch.delenv("JUPYTERHUB_API_URL", raising=False)
        url = f"http://127.0.0.1:{_free_port()}"
        log = tmp_path / "admin.log"
        code = main(["shutdown", str(kernel.pid), "--hub-url", url, "--log", str(log)])
        error = capsys.readouterr().err
        assert code == 1 and "does not answer" in error and "nothing done" in error, error
        assert "not-a-real-token" not in error
        assert psutil.pid_exists(kernel.pid) and not log.exists()
    finally:
        kernel.kill()
        kernel.wait()


def test_a_token_without_an_address_and_an_address_without_a_token(monkeypatch, capsys):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "x")
    monkeypatch.delenv("JAX_NBMEM_HUB_URL", raising=False)
    assert main(["shutdown", "1"]) == 1
    assert "no hub address" in capsys.readouterr().err
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN")
    assert main(["shutdown", "1", "--hub-url", "http://127.0.0.1:1"]) == 1
    assert "no hub API token" in capsys.readouterr().err


def test_the_culler_refuses_what_it_cannot_do(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    monkeypatch.delenv("JAX_NBMEM_SHARE_DIR", raising=False)
    assert main(["cull", "--once"]) == 2
    assert "shared beacon directory" in capsys.readouterr().err
    assert main(["cull", "--once", "--share-dir", str(tmp_path)]) == 2
    assert "can only --dry-run" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse's own validator, exit status 2
        main(["cull", "--once", "--share-dir", str(tmp_path), "--share", "2"])
    assert refused.value.code == 2
    assert "--share must be in (0, 1]" in capsys.readouterr().err
    assert main(["cull", "--once", "--share-dir", str(tmp_path), "--dry-run"]) == 0
    off_loopback = ["--listen", "0.0.0.0:9841", "--dry-run"]
    assert main(["cull", "--once", "--share-dir", str(tmp_path), *off_loopback]) == 2
    assert "on loopback only" in capsys.readouterr().err


def test_a_dry_run_names_the_mig_instance_a_kernel_holds(simgpu_in_process, sleeper):
    import getpass

    from jax_nbmem.cli.stop import Kernel, stop
    from jax_nbmem.simgpu import GIB

    sim = simgpu_in_process
    sim.gpu(0, total=141 * GIB, mig=True).mig(0, 1, 18 * GIB, name="NVIDIA H200 MIG 1g.18gb")
    sim.process(0, sleeper, 5 * GIB, mig=1).write()
    kernel = Kernel(sleeper, None, getpass.getuser(), None, None, None, gpu_bytes={1: 5 * GIB})
    said = stop(kernel, None, dry_run=True).message
    assert "it holds 5.00 GiB on MIG 1g.18gb instance 1 of GPU 0" in said


def test_whose_a_kernel_is_the_hub_users_where_both_are_known(monkeypatch):
    import getpass

    from jax_nbmem.cli.hubapi import hub_from_environment, own_server_from_environment
    from jax_nbmem.cli.stop import Kernel, whose

    me = getpass.getuser()
    server_env = {"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:1/user/ada/",
                  "JUPYTERHUB_API_TOKEN": "t", "JUPYTERHUB_USER": "ada",
                  "JUPYTERHUB_API_URL": "http://127.0.0.1:2/hub/api"}  # fmt: skip
    own = own_server_from_environment(server_env)
    assert (own.url, own.user) == ("http://127.0.0.1:1/user/ada/", "ada")
    # In a hub user's server the token is the server's: no administrator's hub, no error.
    assert hub_from_environment(None, server_env) is None
    assert own_server_from_environment({**server_env, "JUPYTERHUB_USER": ""}) is None

    def kernel(user, hub_user):
        return Kernel(4242, None, user, hub_user, "0a1b2c", None)

    # Containers: every Unix user is the same; the hub user tells people apart.
    assert whose(kernel(me, "bob"), own) == (False, "you are hub user ada" + (
        f" (Unix user {me})" if me != "ada" else ""))  # fmt: skip
    assert whose(kernel(me, "ada"), own)[0] is True
    # No hub user known on one side: the Unix user decides.
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    assert whose(kernel(me, "bob"), None) == (True, f"you are user {me}")
    assert whose(kernel("somebody-else", None), own) == (False, "you are user " + me)
