"""This process's memory at one moment, as ``free`` and ``free --last-error`` compare it."""

from __future__ import annotations

from dataclasses import dataclass

from jax_nbmem.gpu import jaxstats, own_process

__all__ = ["MemoryReading", "measure_memory"]


@dataclass(frozen=True)
class MemoryReading:
    """Memory at one moment, compared before and after freeing.

    ``jax_bytes_in_use`` is JAX's ``bytes_in_use`` summed over devices; ``gpu_self_bytes`` this
    process's GPU bytes per NVML. Each is ``None`` when it cannot be read (CPU backend, no
    NVML, our pid not in NVML's list).
    """

    jax_bytes_in_use: int | None
    gpu_self_bytes: int | None


def measure_memory() -> MemoryReading:
    """Read JAX's ``bytes_in_use`` (summed over devices) and this process's GPU bytes."""
    in_use = [s.bytes_in_use for s in jaxstats.device_stats() if s.bytes_in_use is not None]
    from jax_nbmem.gpu import nvml

    entries = own_process.own_entries(nvml.processes())  # None: its NVML PID is unknown
    mine = [p.used_bytes for p in entries or ()]
    gpu_self = None if not mine or None in mine else sum(mine)
    return MemoryReading(sum(in_use) if in_use else None, gpu_self)
