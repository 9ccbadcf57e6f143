"""The extremes of memory over a stretch of samples: what a cell's record calls its peaks.

:class:`PeakTracker` folds every sample the sampler takes while it is open (the thread's and
:meth:`~jax_nbmem.record.sampler.Sampler.sample_now`'s) into :class:`Peaks`: per GPU the
maxima of this process's, the GPU's and JAX's bytes and the minimum of free memory, and the
host's maxima. :meth:`Peaks.of` folds a list at once. A value never known stays ``None``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from jax_nbmem.record.history import Sample, keep_extreme

__all__ = ["GpuPeaks", "PeakTracker", "Peaks"]


@dataclass(frozen=True)
class GpuPeaks:
    """Extremes of one GPU's series over the samples a tracker saw; ``None`` if never known."""

    index: int
    max_self_bytes: int | None
    max_used_bytes: int | None
    max_jax_in_use: int | None
    max_jax_peak: int | None
    min_free_bytes: int | None


@dataclass(frozen=True)
class Peaks:
    """What a :class:`PeakTracker` saw between its opening and :meth:`PeakTracker.close`."""

    samples: int
    gpus: tuple[GpuPeaks, ...]
    max_rss_bytes: int | None
    max_live_array_bytes: int | None

    def gpu(self, index: int) -> GpuPeaks | None:
        """Return the extremes for NVML GPU *index*, or ``None`` if no sample had it."""
        return next((g for g in self.gpus if g.index == index), None)

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> Peaks:
        """The extremes of ``samples``, folded at once (no tracker, no lock)."""
        folding = _Extremes()
        for sample in samples:
            folding.add(sample)
        return folding.result()


class _Extremes:
    """Maxima (and the minimum of free memory) folded one sample at a time."""

    __slots__ = ("gpus", "samples", "max_rss", "max_live")

    def __init__(self) -> None:
        self.gpus: dict[int, GpuPeaks] = {}
        self.samples = 0
        self.max_rss: int | None = None
        self.max_live: int | None = None

    def add(self, sample: Sample) -> None:
        self.samples += 1
        for gpu in sample.gpus:
            old = self.gpus.get(gpu.index) or GpuPeaks(gpu.index, *[None] * 5)
            self.gpus[gpu.index] = GpuPeaks(
                index=gpu.index,
                max_self_bytes=keep_extreme(max, old.max_self_bytes, gpu.self_bytes),
                max_used_bytes=keep_extreme(max, old.max_used_bytes, gpu.used_bytes),
                max_jax_in_use=keep_extreme(max, old.max_jax_in_use, gpu.jax_in_use),
                max_jax_peak=keep_extreme(max, old.max_jax_peak, gpu.jax_peak),
                min_free_bytes=keep_extreme(min, old.min_free_bytes, gpu.free_bytes),
            )
        if sample.host is not None:
            self.max_rss = keep_extreme(max, self.max_rss, sample.host.rss_bytes)
            self.max_live = keep_extreme(max, self.max_live, sample.host.live_array_bytes)

    def result(self) -> Peaks:
        return Peaks(
            samples=self.samples,
            gpus=tuple(self.gpus[i] for i in sorted(self.gpus)),
            max_rss_bytes=self.max_rss,
            max_live_array_bytes=self.max_live,
        )


class PeakTracker:
    """Accumulates maxima (and the minimum of free memory) over every sample while open.

    Obtained from :meth:`Sampler.track`. Sees both the thread's samples and
    :meth:`Sampler.sample_now`'s. :meth:`close` stops it; closing twice gives the same result.
    """

    def __init__(self, detach: Callable[[PeakTracker], None]):
        self._detach = detach
        self._lock = threading.Lock()
        self._extremes = _Extremes()
        self._result: Peaks | None = None

    def observe(self, sample: Sample) -> None:
        """Fold *sample* into the extremes (the sampler calls this; ignored once closed)."""
        with self._lock:
            if self._result is None:
                self._extremes.add(sample)

    def close(self) -> Peaks:
        """Stop tracking and return what was seen."""
        self._detach(self)
        with self._lock:
            if self._result is None:
                self._result = self._extremes.result()
            return self._result
