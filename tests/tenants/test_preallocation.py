"""Whether a process preallocated, judged from XLA's rules: the pool is fraction x CUDA's total,
taken at the first allocation, and when that much is not free BFC asks for 0.9x as much again
and again; vmm and platform take no pool; cuda_async takes its pool and may grow past it.
"""

from __future__ import annotations

import pytest

from jax_nbmem.allocator.jaxlib import ALLOCATOR, FRACTION, PREALLOCATE
from jax_nbmem.gpu.jaxstats import DeviceStats
from jax_nbmem.tenants.attribution import (
    PREALLOCATION_ABOVE_BYTES,
    PREALLOCATION_BELOW_BYTES,
    ProcessInfo,
    _judge_preallocation,
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
    assert _judge_preallocation(kernel({}), int(pool + CONTEXT), TOTAL) is True
    assert _judge_preallocation(kernel({}), int(pool - PREALLOCATION_BELOW_BYTES // 2), TOTAL)


def test_a_preallocating_kernel_whose_jax_has_not_allocated_yet_holds_no_pool():
    assert _judge_preallocation(kernel({}), CONTEXT, TOTAL) is False


def test_between_two_pool_sizes_is_no_pool():
    first, second = pool_sizes(0.75, TOTAL)[:2]
    between = (first + second) / 2
    assert second + PREALLOCATION_ABOVE_BYTES < between < first - PREALLOCATION_BELOW_BYTES
    assert _judge_preallocation(kernel({}), int(between), TOTAL) is False


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
    assert _judge_preallocation(kernel(env), used, TOTAL) is preallocated


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
