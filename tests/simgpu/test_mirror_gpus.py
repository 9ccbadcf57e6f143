"""On a simulated node of 8 GPUs a kernel's JAX holds memory on every GPU it sees, as JAX does.

JAX starts a client, and its allocator's pool, on every GPU ``CUDA_VISIBLE_DEVICES`` lets
through: 75% of each (or the fraction), shrunk in 0.9x steps on a GPU where that is not free;
without preallocation, a context on each and the arrays where they live. Read back through
the real pynvml, from another process, as every client of the GPU reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from jax_nbmem.simgpu import GIB, SimState
from jax_nbmem.simgpu.mirror import CONTEXT_BYTES, pool_bytes, started_mode
from jax_nbmem.simgpu.registrar import Registrar
from tests.kernels import execute
from tests.simgpu.test_mirror import demo_kernel, held_by, shell_env
from tests.simgpu.test_registrar import needs_namespaces

MIB = 1024**2
POOL = CONTEXT_BYTES + int(0.75 * 80 * GIB)  # what JAX's default takes of an 80 GiB GPU
NEIGHBOUR = 4242  # a process of someone else's on GPU 3, which stays (no ends=exit)


def eight_gpus(path, neighbour_bytes: int = 0) -> SimState:
    state = SimState(path)
    for index in range(8):
        state.gpu(index, total=80 * GIB)
    if neighbour_bytes:
        state.process(3, NEIGHBOUR, neighbour_bytes)
    state.write()
    return state


def nvml_processes(env) -> dict[int, dict[int, int]]:
    """{GPU index: {PID: bytes}} as the real pynvml reads the simulated GPUs, in a subprocess."""
    code = (
        "import json, pynvml\npynvml.nvmlInit()\nfound = {}\n"
        "for i in range(pynvml.nvmlDeviceGetCount()):\n"
        "    h = pynvml.nvmlDeviceGetHandleByIndex(i)\n"
        "    found[i] = {p.pid: p.usedGpuMemory"
        " for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}\n"
        "print(json.dumps(found))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout
    return {int(i): {int(p): b for p, b in procs.items()} for i, procs in json.loads(out).items()}


def mine(env, pid) -> dict[int, int]:
    """What each GPU lists for process *pid* (GPUs that do not list it left out)."""
    return {gpu: procs[pid] for gpu, procs in nvml_processes(env).items() if pid in procs}


@pytest.fixture
def node_env(tmp_path):
    """The demo's kernel environment (the quickstart's --simulated-gpu) on 8 simulated GPUs."""
    env = {**shell_env(tmp_path / "sim"), "JAX_PLATFORMS": "cpu"}
    for name in ("CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_FLAGS",
                 "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"):  # fmt: skip
        env.pop(name, None)
    return env


@pytest.mark.kernel
@pytest.mark.timeout(180)
def test_a_preallocating_kernel_takes_its_pool_on_every_gpu(node_env):
    eight_gpus(node_env["JAX_NBMEM_SIMGPU_STATE"], neighbour_bytes=60 * GIB)
    with demo_kernel(node_env) as (pid, client, state):
        execute(client, "import jax.numpy as jnp\nx = jnp.ones((1024, 1024))")
        held_by(state, pid, lambda held: held is not None and held > 7 * POOL)
        held = mine(node_env, pid)
        # GPU 3 has 60 GiB taken: 75% of it does not fit, and XLA's retries shrink it there only.
        free_on_3 = 80 * GIB - 500 * MIB - 60 * GIB  # less the driver's reserve
        backed_off = CONTEXT_BYTES + pool_bytes(started_mode({}), 80 * GIB, free_on_3)
        assert held == {i: backed_off if i == 3 else POOL for i in range(8)}
        assert backed_off < POOL and backed_off <= free_on_3
        out, error = execute(client, "%load_ext jax_nbmem\n%jaxmem status --json")
        assert error is None, out
        report = json.loads(out[out.index("{") :])
        rows = {p["gpu"]: p["used_bytes"] for p in report["processes"] if p["pid"] == pid}
        assert rows == held  # what the extension reads is what NVML says


@pytest.mark.kernel
@pytest.mark.timeout(180)
def test_cuda_visible_devices_limits_the_pools_to_the_gpus_it_names(node_env):
    eight_gpus(node_env["JAX_NBMEM_SIMGPU_STATE"])
    with demo_kernel({**node_env, "CUDA_VISIBLE_DEVICES": "2,5"}) as (pid, client, state):
        execute(client, "import jax.numpy as jnp\nx = jnp.ones(4)")
        held_by(state, pid, lambda held: held == 2 * POOL)
        assert mine(node_env, pid) == {2: POOL, 5: POOL}


SCRIPT = """\
import json, os, sys
import jax, jax.numpy as jnp
from jax_nbmem.simgpu.mirror import Mirror
jax.config.update("jax_cuda_visible_devices", os.environ.get("JAX_CUDA_IDS", "all"))
on_5 = jax.device_put(jnp.ones((64, 1024, 1024), dtype=jnp.uint8), jax.devices()[5])  # 64 MiB
on_0 = jnp.ones((16, 1024, 1024), dtype=jnp.uint8)  # 16 MiB, on JAX's device 0
mirror = Mirror(os.environ["JAX_NBMEM_SIMGPU_STATE"])
mirror.step()
print(json.dumps({"pid": os.getpid(), "counters": mirror.gpu_counters()}))
"""


def run_script(env, **more) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**env, "PYTHONPATH": ":".join(sys.path), **more},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return found["pid"], found["counters"]


@pytest.mark.timeout(180)
def test_without_preallocation_each_gpu_holds_a_context_and_the_arrays_living_there(node_env):
    state = eight_gpus(node_env["JAX_NBMEM_SIMGPU_STATE"])
    env = {**node_env, "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}  # fmt: skip
    pid, counters = run_script(env)
    # The script ended: a real driver forgets its memory, so read what the mirror wrote.
    lines = {p.gpu: p.used for p in SimState.read(state.path).processes() if p.pid == pid}
    expected = {i: CONTEXT_BYTES for i in range(8)}
    expected[0] += 16 * MIB
    expected[5] += 64 * MIB
    assert lines == expected
    index_of = {uuid: gpu for gpu, _, uuid in state.devices()}
    in_use = {index_of[uuid]: v["bytes_in_use"] for uuid, v in counters.items()}
    assert in_use == {i: {0: 16 * MIB, 5: 64 * MIB}.get(i, 0) for i in range(8)}
    assert all(v["bytes_limit"] is None for v in counters.values())  # no pool: it grows


@pytest.mark.timeout(180)
def test_jax_cuda_visible_devices_narrows_the_gpus_cuda_lets_through(node_env):
    state = eight_gpus(node_env["JAX_NBMEM_SIMGPU_STATE"])
    env = {**node_env, "CUDA_VISIBLE_DEVICES": "1,3,6", "JAX_CUDA_IDS": "0,2",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}  # fmt: skip
    pid, counters = run_script(env)
    lines = {p.gpu: p.used for p in SimState.read(state.path).processes() if p.pid == pid}
    assert lines == {1: POOL, 6: POOL}  # CUDA devices 0 and 2 of 1,3,6
    uuids = {state.uuid_of(1): 1, state.uuid_of(6): 6}
    in_use = {uuids[uuid]: v["bytes_in_use"] for uuid, v in counters.items()}
    # JAX's device 5 stands for its GPU 5 mod 2 = 1 (GPU 6); device 0 for GPU 1.
    assert in_use == {1: 16 * MIB, 6: 64 * MIB}


def test_cuda_stops_at_an_entry_it_cannot_use(tmp_path, mirror_module, monkeypatch):
    path = tmp_path / "gpu.state"
    state = eight_gpus(path)
    for setting, gpus in [("4,GPU-nonesuch,2", {4}), ("", set()), ("7,7", {7}),
                          (f"{state.uuid_of(6)[:12]},0", {6, 0}), ("-1", set())]:  # fmt: skip
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", setting)
        eight_gpus(path)
        mirror_module.Mirror(path).step()
        listed = {p.gpu for p in SimState.read(path).processes() if p.pid == os.getpid()}
        assert listed == gpus, setting


IN_A_NAMESPACE = """\
import json, os, sys
import jax.numpy as jnp
from jax_nbmem.simgpu.mirror import Mirror
jnp.ones(4).block_until_ready()
mirror = Mirror(os.environ["JAX_NBMEM_SIMGPU_STATE"])
mirror.step()
print(json.dumps({"own": os.getpid(), "host": mirror.pid}), flush=True)
sys.stdin.read()
"""


@needs_namespaces
@pytest.mark.timeout(180)
def test_in_a_pid_namespace_every_gpu_lists_the_host_pid(node_env):
    """A kernel in a container: its pools on all 8 GPUs, under its host PID, gone when it ends."""
    state = eight_gpus(node_env["JAX_NBMEM_SIMGPU_STATE"])
    server = Registrar(state.path, log=lambda text: None).listen()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
               sys.executable, "-c", IN_A_NAMESPACE]  # fmt: skip
    env = {**node_env, "PYTHONPATH": ":".join(sys.path)}
    try:
        with subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        ) as process:
            said = json.loads(process.stdout.readline() or "null")
            assert said and said["own"] != said["host"], said  # PID 1 or so in there
            assert mine(node_env, said["host"]) == {i: POOL for i in range(8)}
            assert mine(node_env, said["own"]) == {}
            process.communicate(timeout=60)  # its stdin closes: it ends
        held_by(state.path, said["host"], lambda held: held is None)  # the registrar's doing
        assert not any(nvml_processes(node_env).values())
    finally:
        server.stop()
        thread.join(10)
        server.close()
