"""Samples and their bounded history: what the sampler records and the panel draws.

Plain frozen data, and `SampleHistory`, which keeps recent samples at full rate and merges older
ones into ever wider buckets (keeping peaks), so a day-long session stays bounded.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from jax_nbmem.gpu.mig import MigInstance, gpu_label

__all__ = ["GpuSample", "HostSample", "Sample", "SampleHistory", "keep_extreme"]


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment. Every byte count is ``None`` when unknown.

    ``self_bytes`` is this process's usage per NVML's process list (the latest reading, which
    may be up to one process interval old); ``others_bytes`` is ``used_bytes - self_bytes``,
    or the sum over other processes when ``used_bytes`` is unknown. The ``jax_*`` fields are
    JAX's allocator counters for the JAX device on this GPU, known only once the backend is up.
    ``jax_reserved`` is what JAX's allocator holds from the GPU: its pool (``pool_bytes``; the
    limit for cuda_async, which reports no pool). ``problem`` is NVML's one-line reason when
    this GPU could not be read. ``reserved_bytes`` is the driver's own reserved memory, apart
    from ``used_bytes`` (``None`` where NVML's v1 call counts it in ``used_bytes``). ``mig``
    says where a MIG instance lives (``None`` for a whole GPU); ``label`` names it for people.
    """

    index: int
    uuid: str | None
    name: str | None
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    self_bytes: int | None
    others_bytes: int | None
    jax_in_use: int | None
    jax_peak: int | None
    jax_reserved: int | None
    jax_limit: int | None
    problem: str | None = None
    reserved_bytes: int | None = None
    mig: MigInstance | None = None

    @property
    def label(self) -> str:
        """Its name for people: "GPU 0", or "MIG 3g.71gb instance 1 of GPU 0"."""
        return gpu_label(self)


@dataclass(frozen=True)
class HostSample:
    """This process on the host: resident memory and the bytes of JAX's live arrays.

    ``live_array_bytes`` is ``None`` until the JAX backend is up; walking the arrays costs time
    per array, so it is re-read only every ``live_array_interval`` seconds (and at a cell's
    boundary only while that is cheap): ``live_array_at`` is the ``time.time()`` of the walk it
    comes from, which may be older than the sample (``None`` when there is no value).
    """

    rss_bytes: int | None
    live_array_bytes: int | None
    live_array_at: float | None = None


@dataclass(frozen=True)
class Sample:
    """Everything read at one moment (``t`` is ``time.time()``).

    ``span_s`` is 0 for a raw sample. A point from the downsampled part of the history covers
    ``span_s`` seconds from ``t`` and holds the maximum of every series over that span, except
    ``free_bytes``, which holds the minimum, so that peaks and low points survive.
    """

    t: float
    gpus: tuple[GpuSample, ...]
    host: HostSample | None
    span_s: float = 0.0

    def gpu(self, index: int) -> GpuSample | None:
        """Return the reading for NVML GPU *index*, or ``None`` if this sample lacks it."""
        return next((g for g in self.gpus if g.index == index), None)


class SampleHistory:
    """Bounded sample history: recent samples at full rate, older ones merged into buckets.

    Samples newer than ``recent_s`` seconds (at most ``max_points // 2`` of them) are kept as
    they are. Older samples are merged into buckets of ``bucket_s`` seconds keeping each
    series' maximum and the minimum of free memory. When the buckets exceed their share of
    ``max_points``, neighbouring buckets are merged pairwise and the bucket width doubles, so
    the total never exceeds ``max_points`` however long the session runs.
    """

    def __init__(self, recent_s: float = 600.0, bucket_s: float = 5.0, max_points: int = 20_000):
        if recent_s <= 0 or bucket_s <= 0 or max_points < 4:
            raise ValueError("recent_s and bucket_s must be > 0 and max_points >= 4")
        self._recent_s = float(recent_s)
        self._bucket_s = float(bucket_s)
        self._recent_cap = max_points // 2
        self._older_cap = max_points - self._recent_cap - 1  # one slot for the open bucket
        self._recent: deque[Sample] = deque()
        self._older: list[Sample] = []
        self._open: Sample | None = None
        self._open_key: int | None = None

    @property
    def bucket_s(self) -> float:
        """Current width in seconds of the buckets that new old samples are merged into."""
        return self._bucket_s

    def add(self, sample: Sample) -> None:
        """Append *sample* (samples arrive in time order) and fold what aged out."""
        self._recent.append(sample)
        horizon = sample.t - self._recent_s
        while self._recent and (
            len(self._recent) > self._recent_cap or self._recent[0].t < horizon
        ):
            self._fold(self._recent.popleft())

    def samples(self, since: float | None = None) -> list[Sample]:
        """All points, oldest first: merged buckets, then recent samples at full rate.

        With *since*, only the points with ``t >= since`` (a merged point's ``t`` is where its
        span starts). They are found from the newest end, so the last minute costs a minute's
        samples however long the history is.
        """
        opened = [self._open] if self._open is not None else []
        if since is None:
            return [*self._older, *opened, *self._recent]
        newest_first = []
        for sample in reversed(self._recent):
            if sample.t < since:
                return newest_first[::-1]
            newest_first.append(sample)
        first = bisect.bisect_left(self._older, since, key=lambda point: point.t)
        opened = [point for point in opened if point.t >= since]
        return [*self._older[first:], *opened, *newest_first[::-1]]

    def __len__(self) -> int:
        return len(self._older) + (self._open is not None) + len(self._recent)

    def _fold(self, sample: Sample) -> None:
        key = math.floor(sample.t / self._bucket_s)
        if self._open is not None and key == self._open_key:
            self._open = _merge(self._open, sample, self._open.span_s)
            return
        if self._open is not None:
            self._older.append(self._open)
            if len(self._older) > self._older_cap:
                self._coarsen()
        self._open = replace(sample, span_s=self._bucket_s)
        self._open_key = math.floor(sample.t / self._bucket_s)

    def _coarsen(self) -> None:
        self._bucket_s *= 2
        merged = []
        for i in range(0, len(self._older) - 1, 2):
            first, second = self._older[i], self._older[i + 1]
            merged.append(_merge(first, second, second.t + second.span_s - first.t))
        if len(self._older) % 2:
            merged.append(self._older[-1])
        self._older = merged
        if self._open is not None:
            self._open_key = math.floor(self._open.t / self._bucket_s)


def keep_extreme(choose: Callable[[int, int], int], old: int | None, new: int | None) -> int | None:
    """``choose(old, new)`` over the known values; ``None`` only when neither is known."""
    if old is None:
        return new
    if new is None:
        return old
    return choose(old, new)


def _merge(first: Sample, second: Sample, span_s: float) -> Sample:
    """One point summarizing two: maxima of every series, minimum of free memory."""
    if first.gpus is second.gpus:
        # A cell's boundary where nothing moved reuses the last reading's GPU samples (see
        # record/boundary.py): in a long session every boundary folds one such sample.
        gpus = first.gpus
    else:
        gpus = _merged_gpus(first.gpus, second.gpus)
    host = second.host or first.host
    if first.host is not None and second.host is not None and first.host != second.host:
        host = HostSample(
            keep_extreme(max, first.host.rss_bytes, second.host.rss_bytes),
            keep_extreme(max, first.host.live_array_bytes, second.host.live_array_bytes),
            keep_extreme(max, first.host.live_array_at, second.host.live_array_at),
        )
    return Sample(t=first.t, gpus=gpus, host=host, span_s=span_s)


def _merged_gpus(first: tuple[GpuSample, ...], second: tuple[GpuSample, ...]) -> tuple:
    by_index = {g.index: g for g in first}
    merged = []
    for gpu in second:
        old = by_index.pop(gpu.index, None)
        # The same sample of a GPU that did not move (see readings.gpu_samples) is its merge.
        merged.append(gpu if old is None or old is gpu else _merge_gpu(old, gpu))
    merged.extend(by_index.values())
    merged.sort(key=lambda g: g.index)
    return tuple(merged)


def _merge_gpu(old: GpuSample, new: GpuSample) -> GpuSample:
    return GpuSample(
        index=new.index,
        uuid=new.uuid or old.uuid,
        name=new.name or old.name,
        total_bytes=keep_extreme(max, old.total_bytes, new.total_bytes),
        used_bytes=keep_extreme(max, old.used_bytes, new.used_bytes),
        free_bytes=keep_extreme(min, old.free_bytes, new.free_bytes),
        self_bytes=keep_extreme(max, old.self_bytes, new.self_bytes),
        others_bytes=keep_extreme(max, old.others_bytes, new.others_bytes),
        jax_in_use=keep_extreme(max, old.jax_in_use, new.jax_in_use),
        jax_peak=keep_extreme(max, old.jax_peak, new.jax_peak),
        jax_reserved=keep_extreme(max, old.jax_reserved, new.jax_reserved),
        jax_limit=keep_extreme(max, old.jax_limit, new.jax_limit),
        problem=new.problem or old.problem,
        reserved_bytes=keep_extreme(max, old.reserved_bytes, new.reserved_bytes),
    )
