"""Issue 5 end to end: real kernels share a simulated GPU; who holds what, warnings, OOM, shutdown.

Two real Jupyter kernels and a plain process are the GPU's tenants. The simulated NVML reports
their real PIDs with the bytes a preallocating JAX kernel, a JAX kernel with preallocation off
and a non-JAX process would hold; everything else (command lines, environments, loaded jaxlib,
notebook names) is read from the real processes.
"""

import json
import subprocess
import sys
import time

import psutil
import pytest

from jax_nbmem.simgpu import GIB
from tests.ipython_session import clean_environ
from tests.kernels import execute, running_kernel

pytestmark = pytest.mark.kernel

TOTAL = 80 * GIB
UUID = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
PREALLOCATED = int(0.75 * TOTAL) + (300 << 20)  # 75% plus the CUDA context


def _kernel_pid(manager) -> int:
    return manager.provisioner.process.pid


@pytest.fixture
def tenants(simgpu_env):
    """A preallocating JAX kernel, a JAX kernel with preallocation off, and a plain process."""
    env = dict(simgpu_env)
    env.pop("JAX_PLATFORMS", None)
    hog_env = {**env, "JPY_SESSION_NAME": "/home/ada/train.ipynb", "JAX_PLATFORMS": "cpu"}
    lean_env = {
        **env,
        "JPY_SESSION_NAME": "/home/ada/explore.ipynb",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "JAX_PLATFORMS": "cpu",
    }
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with running_kernel(env=hog_env) as (hog, hog_client):
        with running_kernel(env=lean_env) as (lean, lean_client):
            for client in (hog_client, lean_client):
                _, error = execute(
                    client, "import jax.numpy as jnp; jnp.ones(1).block_until_ready()"
                )
                assert error is None
            yield {"hog": _kernel_pid(hog), "lean": _kernel_pid(lean), "plain": plain.pid}
    plain.kill()
    plain.wait()


def _write(sim_state, holders):
    state = sim_state.gpu(0, total=TOTAL, uuid=UUID)
    for pid, used in holders.items():
        state.process(0, pid, used)
    state.write()


def _cli_status(env):
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "status", "--json"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_cli_names_each_tenant_and_warns_about_the_preallocating_kernel(
    tenants, sim_state, simgpu_env
):
    _write(
        sim_state,
        {tenants["hog"]: PREALLOCATED, tenants["lean"]: 2 * GIB, tenants["plain"]: 1 * GIB},
    )
    report = _cli_status(simgpu_env)
    by_pid = {p["pid"]: p for p in report["processes"]}
    hog, lean, plain = (by_pid[tenants[k]] for k in ("hog", "lean", "plain"))
    assert (hog["kind"], hog["notebook"], hog["preallocated"]) == (
        "kernel", "/home/ada/train.ipynb", True
    )  # fmt: skip
    assert (lean["kind"], lean["notebook"], lean["preallocated"]) == (
        "kernel", "/home/ada/explore.ipynb", False
    )  # fmt: skip
    assert plain["kind"] == "process" and plain["notebook"] is None
    assert hog["runs_jax"] is True and plain["runs_jax"] is False
    (warning,) = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
    assert warning["pid"] == tenants["hog"] and warning["gpu"] == 0
    assert "train.ipynb" in warning["message"]
    assert f"`jax-nbmem shutdown {tenants['hog']} --yes`" in warning["message"]  # read at a shell
    assert "GiB" in warning["message"]


def test_no_warning_when_everybody_runs_without_preallocation(tenants, sim_state, simgpu_env):
    _write(sim_state, {tenants["lean"]: 3 * GIB, tenants["plain"]: 1 * GIB})
    report = _cli_status(simgpu_env)
    assert report["warnings"] == []
    assert {p["kind"] for p in report["processes"]} == {"kernel", "process"}


def test_inside_a_kernel_status_fit_check_oom_diagnosis_and_shutdown(
    tenants, sim_state, simgpu_env
):
    _write(
        sim_state,
        {tenants["hog"]: PREALLOCATED, tenants["lean"]: 2 * GIB, tenants["plain"]: 1 * GIB},
    )
    env = {**simgpu_env, "JPY_SESSION_NAME": "/home/ada/mine.ipynb"}
    with running_kernel(env=env) as (_, client):
        execute(client, "%load_ext jax_nbmem")
        status, error = execute(client, "%jaxmem status")
        assert error is None, status
        assert "train.ipynb" in status and "[preallocated]" in status
        assert "WARNING [blocking-preallocation]" in status

        # Asking for JAX's default mode now: 75% cannot fit in what is left.
        fit, _ = execute(client, "%jaxalloc on")
        assert "prealloc-will-fail" in fit or "would not fit" in fit or "cannot" in fit, fit
        assert "%jaxalloc off" in fit or "fraction" in fit

        oom, error = execute(
            client, "import jax.numpy as jnp; jnp.zeros((2**50,), jnp.uint8).block_until_ready()"
        )
        assert error is not None
        assert "Who holds it" in oom and "train.ipynb" in oom
        assert oom.count("Who holds it") == 1

        refused, _ = execute(client, f"%jaxmem shutdown {tenants['plain']} --yes")
        assert "not a Jupyter kernel" in refused
        assert psutil.pid_exists(tenants["plain"])

        plan, _ = execute(client, f"%jaxmem shutdown {tenants['hog']}")
        assert "Would shut down" in plan and "--yes" in plan
        assert psutil.Process(tenants["hog"]).status() != psutil.STATUS_ZOMBIE

        done, _ = execute(client, f"%jaxmem shutdown {tenants['hog']} --yes")
        assert "Stopped" in done or "Killed" in done or "Shut down" in done, done
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(tenants["hog"]):
            time.sleep(0.1)
        assert not _alive(tenants["hog"])


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_env_of_this_test_is_clean():
    # The tenants above must not inherit allocator settings from whoever runs the suite.
    assert not any(k.startswith("XLA_PYTHON_CLIENT") for k in clean_environ())


def test_panel_button_shuts_down_the_blocking_kernel_after_confirmation(
    tenants, sim_state, simgpu_env
):
    _write(sim_state, {tenants["hog"]: PREALLOCATED, tenants["plain"]: 1 * GIB})
    with running_kernel(env=simgpu_env) as (_, client):
        execute(client, "%load_ext jax_nbmem")
        _, error = execute(client, "%jaxmem")
        assert error is None
        rows = (
            "from jax_nbmem.notebook.magics import session_of\n"
            "actions = session_of(get_ipython())._panel_state.live.actions\n"
            "def labels():\n"
            "    return [getattr(w, 'description', None) or\n"
            "            [c.description for c in w.children] for w in actions.rows.children]\n"
            "session_of(get_ipython()).watcher.refresh()\n"
            "actions.refresh()\n"
            "print(labels())"
        )
        shown, error = execute(client, rows)
        assert error is None, shown
        assert f"Shut down PID {tenants['hog']}" in shown
        assert str(tenants["plain"]) not in shown  # not a kernel: no button

        asked, _ = execute(client, "actions.rows.children[0].click(); print(labels())")
        assert f"Confirm: shut down PID {tenants['hog']}" in asked and "Cancel" in asked
        assert _alive(tenants["hog"])

        execute(client, "actions.rows.children[0].children[0].click()")
        result, _ = execute(client, "print(actions.result.value)")
        assert "Stopped" in result or "Killed" in result, result
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(tenants["hog"]):
            time.sleep(0.1)
        assert not _alive(tenants["hog"])
