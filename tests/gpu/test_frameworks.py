"""Other frameworks in the kernel: their counters read only once started, and the split.

PyTorch, CuPy and TensorFlow are not installed where the suite runs (there is no GPU): the tests
use the documented stand-ins of ``tests/framework_standins.py``, placed in ``sys.modules`` and
taken out again; the NVML side is the simulated GPU, where a kernel holds what its mirror says
JAX holds plus what the stand-ins say the other frameworks hold.
"""

import json
import subprocess
import sys

from jax_nbmem.gpu.frameworks import (
    framework_of_oom,
    imported_frameworks,
    read_frameworks,
    split_lines,
    split_own_memory,
)
from tests.framework_standins import (
    GiB,
    cupy_standin,
    installed,
    tensorflow_standins,
    torch_standin,
)

MiB = 1024**2


def test_nothing_is_asked_of_a_framework_that_has_not_started():
    torch = torch_standin(initialized=False, reserved={0: 0}, allocated={0: 0})
    cupy = cupy_standin(device=0, total=GiB, used=0)
    tf = tensorflow_standins(started=False, current={0: GiB})
    with installed(torch=torch, cupy=cupy, **tf):
        assert imported_frameworks() == ["torch", "cupy", "tensorflow"]
        found = {f.name: f for f in read_frameworks(cuda_running=False)}
    assert not any(f.started for f in found.values())
    assert torch.calls == ["is_initialized"]  # no counter read: it could not start anything
    assert cupy.calls == []  # CUDA not running here: asking the pool could create a context
    assert tf["tensorflow"].calls == []  # get_memory_info would start TF's runtime
    assert "asking would start it" in found["tensorflow"].reason


def test_started_frameworks_are_read_per_device():
    torch = torch_standin(initialized=True, reserved={0: 3 * GiB, 1: 0}, allocated={0: GiB, 1: 0})
    cupy = cupy_standin(device=1, total=GiB, used=GiB // 2)
    tf = tensorflow_standins(started=True, current={0: 512 * MiB})
    with installed(torch=torch, cupy=cupy, **tf):
        found = {f.name: f for f in read_frameworks(cuda_running=True)}
    assert found["torch"].held == {0: 3 * GiB, 1: 0} and found["torch"].in_use[0] == GiB
    assert found["cupy"].held == {1: GiB}  # the current device only
    assert found["tensorflow"].held == {0: None} and found["tensorflow"].in_use == {0: 512 * MiB}


def test_the_split_leaves_contexts_and_the_rest():
    torch = torch_standin(initialized=True, reserved={0: 3 * GiB}, allocated={0: GiB})
    with installed(torch=torch):
        frameworks = read_frameworks(cuda_running=True)
    rows = split_own_memory({5: 16 * GiB}, [5], {0: 12 * GiB}, frameworks, 512 * MiB)
    [row] = rows
    assert row["gpu"] == 5 and row["parts"] == {
        "jax_pool": 12 * GiB, "jax_collective": 512 * MiB, "torch": 3 * GiB,
    }  # fmt: skip
    assert row["other_bytes"] == GiB - 512 * MiB
    [line] = split_lines(rows)
    assert line.startswith("GPU 5: 16.0 GiB = JAX pool 12.0 GiB + JAX collectives 512 MiB")
    assert "PyTorch 3.00 GiB + CUDA contexts and the rest 512 MiB" in line
    unknown = split_own_memory({0: 16 * GiB}, [0], {0: None}, frameworks)  # vmm: no counters
    assert unknown[0]["other_bytes"] is None


def test_each_frameworks_oom_is_recognised_by_its_own_class():
    torch = torch_standin(initialized=True, reserved={0: 0}, allocated={0: 0})
    cupy = cupy_standin(device=0, total=0, used=0)
    tf = tensorflow_standins(started=True, current={0: 0})["tensorflow"]
    assert framework_of_oom(torch.OutOfMemoryError("CUDA out of memory")) == "torch"
    assert framework_of_oom(cupy.OutOfMemoryError("out of memory")) == "cupy"
    assert framework_of_oom(tf.ResourceExhaustedError("OOM")) == "tensorflow"
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except Exception as inner:
            raise ValueError("wrapped") from inner
    except ValueError as outer:
        assert framework_of_oom(outer) == "torch"
    assert framework_of_oom(MemoryError()) is None


KERNEL_LIKE = """\
import json, os, sys
import jax, jax.numpy as jnp
jnp.ones(4).block_until_ready()  # JAX's backend starts (on the CPU): the mirror holds its pool
from jax_nbmem.gpu import frameworks  # loaded, as in a kernel with the extension
from jax_nbmem.simgpu.mirror import Mirror
from tests.framework_standins import GiB, installed, tensorflow_standins, torch_standin
torch = torch_standin(initialized=True, reserved={0: 2 * GiB}, allocated={0: GiB})
with installed(torch=torch, **tensorflow_standins(started=False, current={0: GiB})):
    mirror = Mirror(os.environ["JAX_NBMEM_SIMGPU_STATE"])
    mirror.step()
    import jax_nbmem.simgpu.mirror as module
    module._started = mirror
    from jax_nbmem.tenants.status import collect, format_status
    report = collect(in_kernel=True)
    print(json.dumps({"split": report["own_split"], "text": format_status(report),
                      "pool": mirror.gpu_counters()}))
"""


def test_a_kernel_holding_torch_memory_beside_jax_is_split_on_the_simulated_gpu(
    sim_state, simgpu_env
):
    sim_state.gpu(0, total=16 * GiB).write()
    env = {**simgpu_env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", KERNEL_LIKE], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    [row] = result["split"]
    [pool] = [c["pool_bytes"] for c in result["pool"].values()]
    # NVML: the context, JAX's 75% pool (12 GiB fits beside torch) and torch's 2 GiB.
    assert row["parts"] == {"jax_pool": pool, "torch": 2 * GiB}
    assert row["other_bytes"] == 300 * MiB  # the mirror's CUDA context
    assert row["nvml_bytes"] == pool + 2 * GiB + 300 * MiB
    assert "This kernel's GPU memory by holder:" in result["text"]
    assert "PyTorch 2.00 GiB + CUDA contexts and the rest 300 MiB" in result["text"]
    # TensorFlow is imported but its runtime never started: said, not asked, not counted.
    assert "Not counted: tensorflow (imported; its runtime has not started" in result["text"]


def test_in_a_pid_namespace_what_is_not_proven_stays_unknown(sim_state, simgpu_env):
    """In a container NVML lists the host PID, which this status has no proof of (no agent).

    The frameworks' and JAX's parts are this process's own counters and stay; the kernel's
    NVML bytes, and so the rest, are unknown: never guessed from another PID's line.
    """
    import os
    import shutil
    import threading

    import pytest

    from jax_nbmem.simgpu.registrar import Registrar

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("PID namespaces need root and unshare")
    sim_state.gpu(0, total=16 * GiB).write()
    server = Registrar(sim_state.path, log=lambda text: None).listen()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        env = {**simgpu_env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ":".join(sys.path)}
        command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                   sys.executable, "-c", KERNEL_LIKE]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    finally:
        server.stop()
        thread.join(10)
        server.close()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    [row] = result["split"]
    assert row["parts"]["torch"] == 2 * GiB and row["parts"]["jax_pool"] > 0
    assert row["nvml_bytes"] is None and row["other_bytes"] is None
    assert "CUDA contexts and the rest unknown" in result["text"]


def test_a_beacon_carries_what_else_the_kernel_holds_beside_jax_counters():
    import types

    from jax_nbmem.notebook.beacon import _add_holders

    report = {
        "gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}],
        "own_split": [
            {"gpu": 0, "parts": {"jax_pool": GiB, "torch": 2 * GiB}, "other_bytes": None},
            {"gpu": 1, "parts": {"cupy": GiB}, "other_bytes": 300 * MiB},
        ],
    }
    session = types.SimpleNamespace(watcher=types.SimpleNamespace(latest=lambda: report))
    gpus = {"GPU-a": {"bytes_in_use": 0, "pool_bytes": GiB}}
    _add_holders(gpus, session)
    # Beside JAX's own counters only; an unknown rest is left out, never 0.
    assert gpus == {"GPU-a": {"bytes_in_use": 0, "pool_bytes": GiB, "torch_bytes": 2 * GiB}}
