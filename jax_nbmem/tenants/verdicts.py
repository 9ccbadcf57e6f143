"""What a process's memory says of its JAX: a preallocated pool or not, and from which source.

A process that wrote a beacon is judged by what it said of itself (:func:`verdict_from_beacon`);
one without a beacon by its environment at its start, else by its size alone
(:func:`verdict_from_outside`). A preallocating JAX holds one of the pools of its fraction of
the GPU (:func:`pool_sizes`: the first, then BFC's 0.9x retries when that much was not free),
within a window for its CUDA context above and the driver's reserve below. Attribution
(:mod:`.attribution`) and a container's view (:mod:`.containers`) both judge by these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jax_nbmem.allocator.jaxlib import DEFAULT_FRACTION, RETRY_FACTOR, effective
from jax_nbmem.node.beacons import Beacon

__all__ = [
    "PREALLOCATION_ABOVE_BYTES",
    "PREALLOCATION_BELOW_BYTES",
    "SIZE_ONLY_DOWN_TO",
    "ProcessInfo",
    "judge_preallocation",
    "matches_a_pool",
    "pool_sizes",
    "verdict_from_beacon",
    "verdict_from_outside",
]

# A preallocating process holds its fraction of the GPU's total plus its CUDA context, cuBLAS
# and cuDNN workspaces (a few hundred MiB, more with NCCL): up to 1.5 GiB above. NVML's total
# counts memory the driver reserves, which CUDA's total (what XLA multiplies) leaves out:
# up to 512 MiB below.
PREALLOCATION_ABOVE_BYTES = 1536 << 20
PREALLOCATION_BELOW_BYTES = 512 << 20
# The 0.9x retries of a late preallocator are followed down to a quarter of its share (13
# retries) and no lower than 2 GiB: smaller pools cannot be told apart from on-demand use
# within the window above.
_SMALLEST_POOL_SHARE = 0.25
_SMALLEST_POOL_BYTES = 2 << 30


@dataclass(frozen=True)
class ProcessInfo:
    """What one PID is. ``kind`` is "self", "kernel", "process" or "unknown" (see ``reason``).

    ``allocator_env`` is None when the process's environment could not be read; for another
    process it is its environment *at its start* (``/proc/PID/environ``), which a
    ``%jaxalloc`` run inside it since does not change: ``mode_at_start`` is the mode that
    environment asks for. ``gpu_device_open`` tells whether its memory maps show an NVIDIA
    device file (None: unread).
    """

    pid: int
    kind: str
    user: str | None = None
    cmdline: str | None = None
    kernel_id: str | None = None
    notebook: str | None = None
    idle_s: float | None = None
    runs_jax: bool | None = None
    allocator_env: dict | None = None
    started_at: float | None = None
    reason: str | None = None
    server_url: str | None = None
    gpu_device_open: bool | None = None
    mode_at_start: str | None = None
    notebook_shown: str | None = None
    hub_user: str | None = None  # $JUPYTERHUB_USER in its environment (None: unread or none)


def pool_sizes(fraction: float, total_bytes: int) -> list[float]:
    """The pools a preallocating JAX can hold: fraction x total, then 0.9x of that, and so on.

    BFC asks for fraction x total at its first allocation and, when that much is not free,
    for 0.9 times as much again until it gets it; a kernel that started while the GPU was
    busy therefore holds one of the smaller sizes (followed down to a quarter of its share).
    """
    first = fraction * total_bytes
    if not math.isfinite(first) or first <= 0:
        return []  # no pool (0), or a fraction no GPU can hold (an infinite one loops forever)
    smallest = max(_SMALLEST_POOL_SHARE * first, _SMALLEST_POOL_BYTES)
    sizes, size = [first], first * RETRY_FACTOR
    while size >= smallest:
        sizes.append(size)
        size *= RETRY_FACTOR
    return sizes


def judge_preallocation(
    info: ProcessInfo, used_bytes: int | None, total_bytes: int | None
) -> bool | None:
    """Whether ``info``'s process holds a pool, judged by its start environment (None: unknown)."""
    if info.kind == "unknown" or info.runs_jax is None:
        return None
    if not info.runs_jax:
        return False
    if info.allocator_env is None:
        return None
    settings = effective(info.allocator_env)
    fraction = settings.pool_fraction
    if fraction == 0.0:
        return False
    if fraction is None or used_bytes is None or total_bytes is None:
        return None
    # The collective allocator's memory is beside the pool, in the same process's bytes.
    used_bytes -= settings.collective_bytes or 0
    for pool in pool_sizes(fraction, total_bytes):
        if pool - PREALLOCATION_BELOW_BYTES <= used_bytes <= pool + PREALLOCATION_ABOVE_BYTES:
            return True
    # cuda_async's pool grows past its fraction; BFC's cannot, so more than that is not it.
    return settings.capped is False and used_bytes > fraction * total_bytes


def verdict_from_beacon(
    beacon: Beacon, used: int | None, total: int | None, uuid: str | None
) -> dict:
    """The verdict on a process from what it said of itself (see attribution's ``Tenant``)."""
    counters = dict(beacon.gpus.get(uuid) or {}) if uuid else {}
    fraction = beacon.pool_fraction
    mode = beacon.mode
    if fraction == 0.0:
        preallocated: bool | None = False  # no pool in its mode
    elif beacon.mode_in_effect is None:
        # Its backend had not started when it last wrote; a beacon is rewritten up to a second
        # after JAX starts. A footprint the size of the pool its pending mode takes is that
        # pool, taken since: NVML is newer than the beacon.
        preallocated = None if fraction is None else matches_a_pool(used, total, fraction)
        if preallocated:
            mode = f"{beacon.mode_requested or 'on'} (starting)"
    elif counters.get("pool_bytes") is not None:
        preallocated = counters["pool_bytes"] > 0
    elif fraction is None:
        preallocated = None
    else:  # JAX gave no counters for this GPU: its NVML bytes against its possible pools
        preallocated = matches_a_pool(used, total, fraction)
    verdict = {
        "source": "beacon",
        "mode": mode,
        "preallocated": preallocated,
        "jax": counters or None,
        "idle_s": beacon.idle_s(),
        "idle_source": "beacon",
        "mode_reason": beacon.mode_reason,
        "memory_cap_bytes": beacon.memory_caps.get(uuid) if uuid else None,
    }
    if beacon.notebook:
        verdict["notebook"] = beacon.notebook
    if beacon.hub_user:
        verdict["hub_user"] = beacon.hub_user
    return verdict


def verdict_from_outside(info: ProcessInfo, used: int | None, total: int | None) -> dict:
    """The verdict on a process without a beacon: its environment, else its size."""
    idle_source = "server" if info.idle_s is not None else None
    preallocated = judge_preallocation(info, used, total)
    if info.kind != "unknown" and info.allocator_env is not None:
        return {"source": "environment", "mode": info.mode_at_start, "preallocated": preallocated,
                "idle_source": idle_source}  # fmt: skip
    unreadable = info.kind in ("kernel", "process") or (info.reason or "").startswith("access")
    if unreadable and info.runs_jax is not False:
        # Another user's process: its insides cannot be read. A size that matches JAX's
        # default pool (or a late, smaller one) is probably one.
        if matches_a_pool(used, total, DEFAULT_FRACTION, down_to=SIZE_ONLY_DOWN_TO):
            return {"source": "memory size", "mode": None, "preallocated": True,
                    "idle_source": idle_source}  # fmt: skip
    return {"source": "unknown", "mode": None, "preallocated": preallocated,
            "idle_source": idle_source}  # fmt: skip


# Judged by its size alone, a process is "probably preallocated" only near the default pool or
# its first few 0.9x retries: further down, the windows of the retries cover nearly every size.
SIZE_ONLY_DOWN_TO = 0.5


def matches_a_pool(
    used: int | None, total: int | None, fraction: float, down_to: float = 0.0
) -> bool | None:
    """Whether ``used`` is one of the pools of ``fraction`` (none under ``down_to`` x the first)."""
    if used is None or total is None:
        return None
    return any(
        pool - PREALLOCATION_BELOW_BYTES <= used <= pool + PREALLOCATION_ABOVE_BYTES
        for pool in pool_sizes(fraction, total)
        if pool >= down_to * fraction * total
    )
