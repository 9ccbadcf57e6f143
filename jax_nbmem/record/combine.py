"""How the readings at a block's two ends and the samples between make its figures.

Shared by the per-cell ledger and ``track()``: a block (a cell, a ``with`` block) has quick
readings of JAX's counters at both ends (exact), complete samples before and after, and the
extremes a :class:`~jax_nbmem.record.sampler.PeakTracker` saw in between. GPU figures are summed
over the block's GPUs (NVML indices); any value that is unknown on one GPU is unknown in the
sum, never a guessed 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "block_jax_peak",
    "difference",
    "extreme",
    "gpu_field",
    "gpu_total",
    "peak_total",
    "sum_known",
]


def block_jax_peak(
    quick_before: Any,
    quick_after: Any,
    peaks: Any,
    indices: list[int],
    jax_before: int | None,
    jax_after: int | None,
) -> tuple[int | None, bool]:
    """JAX's peak during a block over its GPU devices, and whether it is exact.

    Exact when every device's own ``peak_bytes_in_use`` rose during the block (or the backend
    started in it); otherwise the largest of the sampled values and the two ends.
    """
    after_devices = getattr(quick_after, "jax", ()) or ()
    before_peaks = {
        getattr(d, "id", None): getattr(d, "peak_bytes_in_use", None)
        for d in getattr(quick_before, "jax", ()) or ()
    }
    rose = []
    for device in after_devices:
        peak_after = getattr(device, "peak_bytes_in_use", None)
        peak_before = before_peaks.get(getattr(device, "id", None))
        if peak_after is None or (peak_before is not None and peak_after <= peak_before):
            break
        rose.append(peak_after)
    else:
        if rose:
            return sum(rose), True
    sampled = sum_known([gpu_field(peaks, index, "max_jax_in_use") for index in indices])
    known = [v for v in (sampled, jax_before, jax_after) if v is not None]
    return (max(known) if known else None), False


def gpu_field(holder: Any, index: int, name: str) -> int | None:
    """One GPU's field of a sample or of peaks (``None`` when absent)."""
    if holder is None:
        return None
    gpu = holder.gpu(index)
    return getattr(gpu, name, None) if gpu is not None else None


def gpu_total(sample: Any, indices: list[int], name: str) -> int | None:
    """A sample's field summed over the GPUs *indices*."""
    if sample is None or not indices:
        return None
    return sum_known([gpu_field(sample, index, name) for index in indices])


def peak_total(
    peaks: Any,
    indices: list[int],
    peak_name: str,
    before: Any,
    after: Any,
    sample_name: str,
    choose: Callable[[Iterable[int]], int] = max,
) -> int | None:
    """Sum over GPUs of the extreme of the tracked value and the block's two ends.

    The ends count too: the tracker sees the samples taken while the block ran, and memory
    may have moved (an array freed, say) before the first of them.
    """
    if not indices:
        return None
    values = []
    for index in indices:
        ends = [gpu_field(before, index, sample_name), gpu_field(after, index, sample_name)]
        values.append(extreme([gpu_field(peaks, index, peak_name), *ends], choose))
    return sum_known(values)


def extreme(values: list[int | None], choose: Callable[[Iterable[int]], int] = max) -> int | None:
    """The largest (or, with ``choose=min``, smallest) known value, or ``None``."""
    known = [v for v in values if v is not None]
    return choose(known) if known else None


def sum_known(values: list[int | None]) -> int | None:
    """The sum, or ``None`` when there is nothing to add or any value is unknown."""
    return None if not values or None in values else sum(values)  # type: ignore[arg-type]


def difference(after: int | None, before: int | None) -> int | None:
    """``after - before``, or ``None`` when either is unknown."""
    return None if after is None or before is None else after - before
