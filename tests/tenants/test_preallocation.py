"""Whether a process preallocated, judged from XLA's rules: the pool is fraction x CUDA's total,
taken at the first allocation, and when that much is not free BFC asks for 0.9x as much again
and again; vmm and platform take no pool; cuda_async takes its pool and may grow past it.
"""

from __future__ import annotations

import pytest

from jax_nbmem.allocator.jaxlib import ALLOCATOR, FRACTION, PREALLOCATE
from jax_nbmem.gpu.jaxstats import DeviceStats
from jax_nbmem.tenants.verdicts import (
    PREALLOCATION_ABOVE_BYTES,
    PREALLOCATION_BELOW_BYTES,
    ProcessInfo,
    judge_preallocation,
    pool_sizes,
)
from jax_nbmem.tools.compare.child import _jax_figures

GIB = 1 << 30
TOTAL = 141 * GIB  # an H200
CONTEXT = 500 << 20  # the CUDA context and libraries' workspaces


def kernel(env: dict[str, str]) -> ProcessInfo:
    return ProcessInfo(pid=4242, kind="kernel", runs_jax=True, allocator_env=env)


def test_the_pools_a_late_preallocator_can_hold_shrink_by_tenths_to_a_quarter():
    sizes = pool_sizes(0.75, TOTAL)
    assert sizes[0] == 0.75 * TOTAL
    assert sizes[1] == pytest.approx(0.75 * 0.9 * TOTAL)
    assert all(b == pytest.approx(a * 0.9) for a, b in zip(sizes, sizes[1:], strict=False))
    assert sizes[-1] >= 0.25 * sizes[0] > sizes[-1] * 0.9
    # On a small GPU the bands stop at 2 GiB: below, a pool looks like on-demand use.
    assert min(pool_sizes(0.75, 16 * GIB)) >= 2 * GIB


@pytest.mark.parametrize("retries", [0, 1, 3, 7, 13])
def test_a_kernel_that_preallocated_early_or_late_is_recognised(retries):
    pool = 0.75 * TOTAL * 0.9**retries
    assert judge_preallocation(kernel({}), int(pool + CONTEXT), TOTAL) is True
    assert judge_preallocation(kernel({}), int(pool - PREALLOCATION_BELOW_BYTES // 2), TOTAL)


def test_a_preallocating_kernel_whose_jax_has_not_allocated_yet_holds_no_pool():
    assert judge_preallocation(kernel({}), CONTEXT, TOTAL) is False


def test_between_two_pool_sizes_is_no_pool():
    first, second = pool_sizes(0.75, TOTAL)[:2]
    between = (first + second) / 2
    assert second + PREALLOCATION_ABOVE_BYTES < between < first - PREALLOCATION_BELOW_BYTES
    assert judge_preallocation(kernel({}), int(between), TOTAL) is False


@pytest.mark.parametrize(
    ("env", "used", "preallocated"),
    [
        ({PREALLOCATE: "false"}, 80 * GIB, False),  # grew on demand: no pool
        ({ALLOCATOR: "vmm"}, int(0.75 * TOTAL), False),  # vmm never preallocates
        ({ALLOCATOR: "platform"}, int(0.75 * TOTAL), False),
        ({FRACTION: "0.3"}, int(0.3 * TOTAL) + CONTEXT, True),
        ({ALLOCATOR: "cuda_async"}, int(0.75 * TOTAL) + CONTEXT, True),
        ({ALLOCATOR: "cuda_async"}, int(0.95 * TOTAL), True),  # its pool grew past the fraction
        ({ALLOCATOR: "address"}, int(0.75 * TOTAL), None),  # not modelled: cannot tell
    ],
)
def test_each_mode_is_judged_by_what_its_allocator_does(env, used, preallocated):
    assert judge_preallocation(kernel(env), used, TOTAL) is preallocated


def stats(in_use: int, pool: int, block: int, limit: int) -> DeviceStats:
    return DeviceStats(
        id=0,
        platform="gpu",
        kind="H200",
        bytes_in_use=in_use,
        peak_bytes_in_use=in_use,
        bytes_reserved=0,  # what XLA reports on every GPU
        bytes_limit=limit,
        largest_free_block_bytes=block,
        pool_bytes=pool,
    )


def test_fragmentation_is_measured_inside_the_pool_not_against_the_limit():
    # `off`: the pool grew to 10 GiB for 9.5 GiB of arrays; its one free block is 0.5 GiB.
    grown = _jax_figures([stats(int(9.5 * GIB), 10 * GIB, GIB // 2, int(0.75 * TOTAL))])
    assert grown["jax_free_bytes"] == GIB // 2
    assert grown["largest_free_block_bytes"] == GIB // 2  # all of it: not fragmented
    assert grown["jax_pool_bytes"] == 10 * GIB
    # Preallocated: the whole pool, 30 GiB free inside it, in 3 GiB pieces.
    split = _jax_figures([stats(int(0.75 * TOTAL) - 30 * GIB, int(0.75 * TOTAL), 3 * GIB, 0)])
    assert (split["jax_free_bytes"], split["largest_free_block_bytes"]) == (30 * GIB, 3 * GIB)


def test_what_jax_holds_is_its_pool_never_bytes_reserved():
    bfc = stats(GIB, 10 * GIB, GIB, 100 * GIB)
    assert bfc.held_bytes == 10 * GIB
    async_pool = DeviceStats(0, "gpu", "H200", GIB, GIB, 0, 100 * GIB, None)
    assert async_pool.held_bytes == 100 * GIB  # cuda_async reports no pool: its limit


# --- A beacon written just before JAX started (issue 24, item 9) -------------------------------


def _pending_beacon(tmp_path, pid: int, **changes):
    """What a kernel in JAX's default mode writes before its backend starts, read back."""
    import json
    import time

    import psutil

    from jax_nbmem.node.beacons import SCHEMA, read_beacons

    facts = {
        "schema": SCHEMA, "pid": pid, "started_at": psutil.Process(pid).create_time(),
        "notebook": "/home/ada/train.ipynb", "mode_requested": None, "mode_in_effect": None,
        "pool_fraction": 0.75, "gpus": {}, "cell_running": True,
        "last_cell_finished_at": None, "written_at": time.time(), **changes,
    }  # fmt: skip
    (tmp_path / f"jax_nbmem-beacon-{pid}.json").write_text(json.dumps(facts))
    beacons = read_beacons([str(tmp_path)], pids=[pid])
    assert beacons[pid].mode.startswith("not started ("), beacons
    return beacons


def test_a_pending_default_mode_with_a_pool_sized_footprint_is_a_preallocation(tmp_path):
    import os

    from jax_nbmem.gpu.nvml import GpuMemory, GpuProcess
    from jax_nbmem.tenants.advice import oom_diagnosis, warnings_for
    from jax_nbmem.tenants.attribution import attribute

    pid = os.getppid()  # a live process of ours, standing for a kernel whose JAX just started
    beacons = _pending_beacon(tmp_path, pid)
    used = int(0.75 * TOTAL) + CONTEXT
    gpu = GpuMemory(0, "GPU-9", "H200", TOTAL, used + GIB, TOTAL - used - GIB)

    def judged(used_bytes: int, pending=beacons):
        (tenant,) = attribute(
            [GpuProcess(pid, 0, used_bytes)], [gpu], own_pid=-1, environ={}, beacons=pending,
            sessions={}, check_device_files=False,
        )  # fmt: skip
        return tenant

    tenant = judged(used)
    assert (tenant.source, tenant.preallocated, tenant.mode) == ("beacon", True, "on (starting)")
    (warning,) = warnings_for([tenant], [gpu], own_backend_started=True)
    assert warning.kind == "blocking-preallocation" and warning.pid == pid
    assert "train.ipynb" in warning.message and "mode 'on (starting)'" in warning.message
    assert "NVML shows it holding the pool that mode preallocates" in warning.message
    assert "preallocated its memory" in oom_diagnosis([tenant], [gpu])
    # A late start's smaller pool (0.9x) is one too; the CUDA context alone is no pool yet.
    assert judged(int(0.75 * 0.9 * TOTAL) + CONTEXT).preallocated is True
    context_only = judged(CONTEXT)
    assert context_only.preallocated is False
    assert context_only.mode == "not started (on when it starts)"
    # A pending `off` takes no pool whatever the size; a pending mode not modelled cannot tell.
    off = _pending_beacon(tmp_path, pid, mode_requested="off", pool_fraction=0.0)
    assert judged(used, off).preallocated is False
    unknown = _pending_beacon(tmp_path, pid, mode_requested="address", pool_fraction=None)
    assert judged(used, unknown).preallocated is None


@pytest.mark.kernel
def test_a_kernel_whose_beacon_is_a_second_behind_its_jax_start_is_seen_preallocated(
    simgpu_env, sim_state
):
    import json
    import os
    import subprocess
    import sys

    from jax_nbmem.node.beacons import read_beacons
    from tests.kernels import execute, running_kernel
    from tests.waiting import wait_for

    runtime = [os.environ["JUPYTER_RUNTIME_DIR"]]
    env = {**simgpu_env, "JPY_SESSION_NAME": "/home/ada/train.ipynb"}
    with running_kernel(env=env) as (manager, client):
        out, error = execute(client, "%load_ext jax_nbmem")  # JAX's default mode, not started
        assert error is None, out
        pid = manager.provisioner.process.pid
        wait_for("its beacon", lambda: pid in read_beacons(runtime, pids=[pid]), 20)
        assert read_beacons(runtime, pids=[pid])[pid].mode_in_effect is None
        # NVML already shows the pool that its first allocation takes: what another kernel's
        # status sees in the second before the beacon is rewritten.
        used = int(0.75 * 80 * GIB) + CONTEXT
        sim_state.gpu(0, total=80 * GIB).process(0, pid, used).write()
        done = subprocess.run(
            [sys.executable, "-m", "jax_nbmem.cli", "status", "--json"],
            capture_output=True, text=True, env=simgpu_env, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        (seen,) = [p for p in report["processes"] if p["pid"] == pid]
        assert (seen["source"], seen["preallocated"], seen["mode"]) == (
            "beacon", True, "on (starting)"
        )  # fmt: skip
        (warning,) = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
        assert warning["pid"] == pid and "train.ipynb" in warning["message"]
