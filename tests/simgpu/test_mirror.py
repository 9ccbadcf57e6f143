"""The demo's simulated GPU tells the real story: a kernel's JAX arrays held as its mode would.

Real kernels started with the environment `shell-env --kernels` prints (the quickstart's
`--simulated-gpu`): their JAX runs on the CPU, and the mirror puts what the GPU allocator would
hold on the simulated GPU. A neighbour from `python -m jax_nbmem.simgpu tenant` is a real idle
kernel that preallocated, and this kernel's status names it as blocking.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from jax_nbmem.simgpu import GIB, SimState
from jax_nbmem.simgpu.mirror import (
    CONTEXT_BYTES,
    StartedMode,
    held_bytes,
    pool_bytes,
    started_mode,
)
from jax_nbmem.simgpu.simulator import start_tenant
from tests.kernels import execute, running_kernel

MIB = 1024**2


def test_each_mode_holds_what_jax_allocator_would():
    total, live, high = 80 * GIB, 1 * GIB, 3 * GIB
    on = started_mode({})
    assert on.name == "on" and held_bytes(on, total, live, high) == CONTEXT_BYTES + 60 * GIB
    fraction = started_mode({"XLA_CLIENT_MEM_FRACTION": "0.25"})
    assert fraction.name == "fraction 0.25"
    assert held_bytes(fraction, total, live, high) == CONTEXT_BYTES + 20 * GIB
    older = started_mode({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})
    assert held_bytes(older, total, live, high) == CONTEXT_BYTES + 40 * GIB
    off = started_mode({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    assert off.name == "off"
    assert held_bytes(off, total, live, high) == CONTEXT_BYTES + high  # keeps what was freed
    platform = started_mode({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"})
    assert held_bytes(platform, total, live, high) == CONTEXT_BYTES + live  # follows the arrays
    assert StartedMode(True, 0.75, "vmm").name == "vmm"


def test_a_pool_that_does_not_fit_shrinks_as_xla_retries():
    on = started_mode({})
    # A neighbour holds 60 GiB of 80: 75% does not fit; 0.9x steps until it does.
    free = 80 * GIB - 60 * GIB - 500 * MIB
    pool = pool_bytes(on, 80 * GIB, free)
    assert pool <= free - CONTEXT_BYTES and pool / 0.9 > free - CONTEXT_BYTES
    assert held_bytes(on, 80 * GIB, 0, 0, free) == CONTEXT_BYTES + pool
    # Without preallocation the arrays can only take what is free.
    off = started_mode({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    assert held_bytes(off, 80 * GIB, 0, 30 * GIB, free) == free


def test_a_state_file_reads_back_as_written(tmp_path):
    state = SimState(tmp_path / "gpu.state").gpu(0, total=80 * GIB).gpu(1, 8 * GIB, name=b"\xffx")
    state.process(0, 11, 5 * GIB).process(1, 12, None, graphics=True).lose(1)
    state.process(0, 13, GIB, ends_with_process=True)
    state.slow("processes", 0.25).fail("memory", "UNKNOWN", 1).write()
    again = SimState.read(state.path)
    assert again.render() == state.render() and "ends=exit" in again.render()
    assert again.process_bytes(11) == 5 * GIB and again.process_bytes(12) is None
    assert again.total_bytes(0) == 80 * GIB and again.total_bytes(5) is None


def shell_env(folder) -> dict[str, str]:
    """This environment plus what `shell-env --kernels` exports (the quickstart's demo)."""
    out = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.simgpu", "shell-env", "--kernels", str(folder)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    exports = dict(re.findall(r"^export (\w+)=(.*)$", out, re.M))
    assert set(exports) == {"LD_LIBRARY_PATH", "JAX_NBMEM_SIMGPU_STATE", "IPYTHONDIR"}
    return {**os.environ, **{k: v.strip("'") for k, v in exports.items()}}


@pytest.fixture
def demo_env(tmp_path):
    """The environment the quickstart's --simulated-gpu gives JupyterLab and its kernels."""
    env = {**shell_env(tmp_path / "sim"), "JAX_PLATFORMS": "cpu"}
    SimState(env["JAX_NBMEM_SIMGPU_STATE"]).gpu(0, total=80 * GIB).write()
    return env


def held_by(state_path, pid, until, timeout=30.0):
    deadline = time.monotonic() + timeout
    held = None
    while time.monotonic() < deadline:
        held = SimState.read(state_path).process_bytes(pid)
        if until(held):
            return held
        time.sleep(0.1)
    raise AssertionError(f"PID {pid} holds {held} on the simulated GPU")


@contextlib.contextmanager
def demo_kernel(env):
    """A real kernel of the demo: (its PID, a client, the state file's path)."""
    with running_kernel(env=env) as (manager, client):
        yield manager.provisioner.process.pid, client, env["JAX_NBMEM_SIMGPU_STATE"]


@pytest.mark.kernel
@pytest.mark.timeout(180)
def test_preallocation_takes_the_pool_at_the_first_operation(demo_env):
    with demo_kernel(demo_env) as (pid, client, state):
        execute(client, "%load_ext jax_nbmem\n%jaxalloc on\nimport jax")
        time.sleep(0.6)
        assert SimState.read(state).process_bytes(pid) is None  # JAX has not started
        execute(client, "import jax.numpy as jnp\nx = jnp.ones((1024, 1024, 16))")  # 64 MiB
        held = held_by(state, pid, lambda held: held is not None)
        assert held == CONTEXT_BYTES + 60 * GIB
        assert nvml_pids(demo_env) == [pid]
        out, _ = execute(client, "%jaxmem status --json")
        report = json.loads(out[out.index("{") :])
        mine = [p for p in report["processes"] if p["pid"] == pid]
        assert mine and mine[0]["used_bytes"] == held
    # The kernel is gone (killed, without a goodbye): the driver no longer lists its pool.
    assert nvml_pids(demo_env) == []


@pytest.mark.kernel
@pytest.mark.timeout(180)
def test_a_cell_that_allocates_and_returns_at_once_is_charged_with_its_own_bytes(demo_env):
    """On a real GPU NVML sees an allocation at once; the mirror must not lag a cell behind.

    Its thread looks every 0.25 s: without the look at each cell's end, the reading right
    after a cell misses what the cell took, and a later cell is blamed for it.
    """
    with demo_kernel(demo_env) as (pid, client, state):
        execute(client, "%load_ext jax_nbmem\n%jaxalloc off")
        execute(client, "import jax.numpy as jnp\nblocks = [jnp.ones(4)]")  # the backend starts
        held_by(state, pid, lambda held: held is not None)
        for code in ["blocks.append(jnp.ones((1024, 1024, 16)))"] * 3 + ["pass"]:  # 64 MiB each
            time.sleep(0.15)  # the reading after the previous cell is in (no overlap to note)
            execute(client, code)
        out, error = execute(
            client,
            "import json, jax_nbmem\nprint(json.dumps([c.to_dict() for c in jax_nbmem.cells()]))",
        )
        assert error is None, out
    records = json.loads(out.strip().splitlines()[-1])
    grows, after = records[-4:-1], records[-1]
    seen = [(r["first_line"], r["gpu_self_retained"], r["notes"]) for r in records]
    assert [r["gpu_self_retained"] for r in grows] == [64 * MIB] * 3, seen
    assert after["gpu_self_retained"] == 0, seen  # the next cell is not blamed for them
    assert grows[-1]["gpu_self_after"] == grows[0]["gpu_self_before"] + 3 * 64 * MIB


def nvml_pids(env) -> list[int]:
    """The PIDs the simulated GPU 0 lists, asked through the real pynvml in a subprocess."""
    code = (
        "import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); "
        "print([p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out)


@pytest.mark.kernel
@pytest.mark.timeout(180)
def test_without_preallocation_the_pool_grows_and_keeps_what_was_freed(demo_env):
    with demo_kernel(demo_env) as (pid, client, state):
        execute(client, "%load_ext jax_nbmem\n%jaxalloc off")
        execute(client, "import jax.numpy as jnp\nx = jnp.ones((1024, 1024, 64))")  # 256 MiB
        grown = held_by(state, pid, lambda held: (held or 0) >= CONTEXT_BYTES + 256 * MIB)
        assert grown == CONTEXT_BYTES + 256 * MIB
        execute(client, "del x\nimport gc; gc.collect()")
        time.sleep(0.8)
        assert SimState.read(state).process_bytes(pid) == grown  # back to the pool, not the GPU


@pytest.mark.kernel
@pytest.mark.timeout(240)
def test_a_neighbour_that_preallocated_is_named_as_blocking(demo_env, monkeypatch):
    state = demo_env["JAX_NBMEM_SIMGPU_STATE"]
    for name in ("LD_LIBRARY_PATH", "IPYTHONDIR"):
        monkeypatch.setenv(name, demo_env[name])
    neighbour, held = start_tenant(state, notebook="hog.ipynb")
    try:
        assert held == CONTEXT_BYTES + 60 * GIB
        with running_kernel(env=demo_env) as (_, client):
            execute(client, "%load_ext jax_nbmem")
            out, _ = execute(client, "%jaxmem status --json")
            report = json.loads(out[out.index("{") :])
            blocking = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
            assert blocking and blocking[0]["pid"] == neighbour, report["warnings"]
            assert "hog.ipynb" in blocking[0]["message"]
    finally:
        os.kill(neighbour, signal.SIGTERM)


def test_a_mirror_waits_out_a_bad_state_file_and_says_so_once(tmp_path, mirror_module, capsys):
    path = tmp_path / "gpu.state"
    SimState(path).gpu(0, total=80 * GIB).write()
    bad = path.read_text().replace("end\n", "proc 0 abc used=5\nend\n")
    path.write_text(bad)  # edited by hand, with a mistake
    mirror = mirror_module.Mirror(path)
    mirror.step()
    mirror.step()
    assert path.read_text() == bad  # left as it is
    said = capsys.readouterr().err
    assert said.count("the mirror waits") == 1 and "line 4: proc: bad PID 'abc'" in said
    SimState(path).gpu(0, total=80 * GIB).write()  # fixed
    mirror.step()
    assert SimState.read(path).process_bytes(os.getpid()) == CONTEXT_BYTES + 60 * GIB
    stamp = path.stat().st_mtime_ns
    mirror.step()  # nothing changed: nothing written
    assert path.stat().st_mtime_ns == stamp


def test_the_look_after_a_cell_writes_what_changed_and_nothing_else(
    tmp_path, mirror_module, monkeypatch
):
    path = tmp_path / "gpu.state"
    SimState(path).gpu(0, total=80 * GIB).write()
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    live = {"bytes": 64 * MIB}
    monkeypatch.setattr(mirror_module, "_live_bytes_by_device", lambda: {0: live["bytes"]})
    monkeypatch.setattr(mirror_module, "_backend_started", lambda: False)
    mirror = mirror_module.Mirror(path)
    mirror.after_cell()  # JAX has not started: nothing to count (counting would start it)
    assert SimState.read(path).process_bytes(os.getpid()) is None
    monkeypatch.setattr(mirror_module, "_backend_started", lambda: True)
    mirror.after_cell()
    assert SimState.read(path).process_bytes(os.getpid()) == CONTEXT_BYTES + 64 * MIB
    stamp = path.stat().st_mtime_ns
    mirror.after_cell()  # the same arrays: nothing written
    assert path.stat().st_mtime_ns == stamp
    live["bytes"] = 192 * MIB
    mirror.after_cell()
    assert SimState.read(path).process_bytes(os.getpid()) == CONTEXT_BYTES + 192 * MIB

    def broken():
        raise RuntimeError("a JAX that changed")

    monkeypatch.setattr(mirror_module, "_live_bytes_by_device", broken)
    mirror.after_cell()  # a hook never raises into the user's cell


def test_on_a_mig_instance_the_mirror_holds_its_share_of_the_instance(
    tmp_path, mirror_module, monkeypatch
):
    path = tmp_path / "gpu.state"
    small = "MIG-11111111-2222-5333-8444-555555555555"
    state = SimState(path).gpu(0, total=141 * GIB, mig=True)
    state.mig(0, 1, 18 * GIB, uuid=small).mig(0, 2, 71 * GIB).write()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", small)
    mirror_module.Mirror(path).step()
    pid = os.getpid()
    assert SimState.read(path).process_bytes(pid) == CONTEXT_BYTES + int(0.75 * 18 * GIB)
    assert f"proc 0 {pid} used={CONTEXT_BYTES + int(0.75 * 18 * GIB)}" in path.read_text()
    assert re.search(rf"proc 0 {pid} .*mig=1", path.read_text())  # on instance 1, not GPU 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-ffffffff")  # no such instance: CUDA fails
    other = tmp_path / "other.state"
    SimState(other).gpu(0, total=141 * GIB, mig=True).mig(0, 1, 18 * GIB, uuid=small).write()
    mirror_module.Mirror(other).step()
    assert SimState.read(other).process_bytes(pid) is None


def test_a_neighbour_started_with_stop_with_ends_once_that_process_has(tmp_path):
    """`tenant --stop-with PID` (the quickstart script's): the neighbour outlives no script."""
    script = subprocess.Popen(["sleep", "60"])  # stands for the script
    code = (
        f"import time; from jax_nbmem.simgpu.simulator import stop_when_gone\n"
        f"stop_when_gone({script.pid}, interval=0.05)\ntime.sleep(60)"
    )
    neighbour = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        assert neighbour.poll() is None  # the script runs: so does it
        script.kill()
        script.wait()
        assert neighbour.wait(10) == -signal.SIGTERM
    finally:
        neighbour.kill()
        script.kill()


def test_tenant_refuses_a_bad_stop_with_and_starts_nothing(tmp_path):
    state = tmp_path / "gpu.state"
    SimState(state).gpu(0, total=80 * GIB).write()
    gone = subprocess.Popen(["true"])
    gone.wait()
    for pid in (0, gone.pid):
        with pytest.raises(ValueError, match="--stop-with needs a running process's ID"):
            start_tenant(state, stop_with=pid)
    assert "proc" not in state.read_text()  # no neighbour
