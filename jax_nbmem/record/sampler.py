"""The background sampler: GPU, JAX and host memory over time, in a bounded history.

A daemon thread takes a :class:`Sample` every ``interval`` seconds on a monotonic schedule.
Each tick is small: NVML's memory counters, JAX's allocator counters once the user's code has
started the backend, and the host RSS. NVML's process list (which tells this process's bytes
apart from other processes') is read less often, and more often while a cell runs
(:meth:`Sampler.set_busy`) so that a short transient is caught. ``jax.live_arrays()`` costs
time in proportion to the number of arrays and is read at most every ``live_array_interval``.

The sampler never raises out of its thread: a failed reading leaves its value ``None``, and
the error is kept as text in :attr:`Sampler.last_error`.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from jax_nbmem.gpu import jaxstats, nvml
from jax_nbmem.record.history import GpuSample, HostSample, Sample, SampleHistory, keep_extreme

__all__ = [
    "GpuPeaks",
    "GpuSample",
    "HostSample",
    "PeakTracker",
    "Peaks",
    "QuickReading",
    "Sample",
    "SampleHistory",
    "Sampler",
    "SamplerSource",
]

# The set of GPUs this kernel uses changes only if the user edits CUDA_VISIBLE_DEVICES before
# starting JAX; re-reading it every few seconds (and at every sample_now) is plenty.
_GPU_SET_REFRESH_S = 10.0
_JAX_GPU_PLATFORMS = frozenset({"gpu", "cuda", "rocm"})
# Walking jax.live_arrays() may take at most this share of one core.
_LIVE_ARRAY_BUDGET = 0.005
# Cells that end in quick succession share one after-cell reading at most this often.
_MIN_AFTER_GAP_S = 0.05


def _nvml_memory(indices: Sequence[int] | None) -> Sequence[Any]:
    from jax_nbmem.gpu import nvml

    return nvml.memory(indices)


def _nvml_processes(indices: Sequence[int] | None) -> Sequence[Any]:
    from jax_nbmem.gpu import nvml

    return nvml.process_lists(indices)


def _visible_gpu_indices() -> Sequence[int] | None:
    from jax_nbmem.gpu import nvml, visible

    every_gpu = nvml.gpus()
    if not every_gpu:
        return None  # NVML sees nothing right now: not "no GPUs are ours"
    return tuple(visible.visible_gpus(every_gpu, os.environ).indices)


@dataclass(frozen=True)
class SamplerSource:
    """Where the sampler reads from. Each field is a plain callable, so tests can pass fakes.

    The defaults load NVML (:mod:`jax_nbmem.gpu.nvml`) and import :mod:`jax_nbmem.gpu.visible`
    only when first called. ``gpu_indices`` returns the NVML indices this kernel uses, in the
    order JAX numbers its GPU devices, or ``None`` for "all GPUs NVML sees". ``processes`` returns
    NVML's per-GPU lists (:class:`~jax_nbmem.gpu.nvml.GpuProcesses`, ``processes=None`` where
    a list failed) or flat process records.
    """

    memory: Callable[[Sequence[int] | None], Sequence[Any]] = _nvml_memory
    processes: Callable[[Sequence[int] | None], Sequence[Any]] = _nvml_processes
    gpu_indices: Callable[[], Sequence[int] | None] = _visible_gpu_indices
    backend_initialized: Callable[[], bool] = jaxstats.backend_initialized
    device_stats: Callable[[], Sequence[Any]] = jaxstats.device_stats
    live_array_bytes: Callable[[], int | None] = jaxstats.live_array_bytes
    host_rss_bytes: Callable[[], int | None] = jaxstats.host_rss_bytes
    pid: int = field(default_factory=os.getpid)
    # What a cell hook reads: like device_stats, but never waiting for JAX's backend lock and
    # GPU devices only. None: device_stats itself (a fake source's, in tests), or JAX's own.
    quick_device_stats: Callable[[], Sequence[Any]] | None = None

    def __post_init__(self) -> None:
        if self.quick_device_stats is None:
            quick = self.device_stats
            if quick is jaxstats.device_stats:
                quick = jaxstats.gpu_stats_now
            object.__setattr__(self, "quick_device_stats", quick)


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


class Sampler:
    """Samples memory on a daemon thread and keeps a bounded history.

    ``start()`` and ``stop()`` are idempotent; ``stop()`` joins the thread. Without the thread,
    :meth:`tick` takes the same scheduled samples on demand and :meth:`sample_now` takes a
    fresh complete one.

    Readings are taken outside the sampler's lock, which guards only what is published (the
    history, the latest sample, the schedule), so a slow NVML holds up the thread that reads
    it and nobody else: :meth:`latest`, :meth:`track`, :meth:`set_busy`,
    :meth:`request_after` and :meth:`quick_reading` never wait for NVML or JAX. Cell hooks use
    only those; the complete reading after a cell is taken by the thread, woken at once
    (:meth:`request_after`).

    Attributes (read them; change the rates with :meth:`configure`): ``interval``,
    ``process_interval``, ``busy_process_interval``, ``live_array_interval`` in seconds;
    ``live_array_budget``, the share of a core that reading ``jax.live_arrays()`` may take
    (its interval grows with its measured cost); ``last_error`` (text of the latest failed
    reading or callback, ``None`` if none yet) and ``last_error_at`` (its ``time.time()``);
    ``error_count`` and ``callback_errors``.
    """

    def __init__(
        self,
        source: SamplerSource | None = None,
        *,
        interval: float = 0.1,
        process_interval: float = 1.0,
        busy_process_interval: float = 0.2,
        live_array_interval: float = 1.5,
        live_array_budget: float = _LIVE_ARRAY_BUDGET,
        history: SampleHistory | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._source = source if source is not None else SamplerSource()
        self._clock = clock
        self._monotonic = monotonic
        self._history = history if history is not None else SampleHistory()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._wake = threading.Event()
        self._callbacks: list[Callable[[Sample], Any]] = []
        self._trackers: list[PeakTracker] = []
        # Appended by cell hooks and emptied by the thread, both without a lock (a deque's
        # append and popleft are atomic).
        self._after_requests: deque[Callable[[Sample, float], Any]] = deque()
        self._last_forced = -math.inf
        self._latest: Sample | None = None
        self.samples_taken = 0  # grows by one per sample: tells whether any came meanwhile
        self._busy = False
        self._gpu_indices: Sequence[int] | None = None
        self._gpu_indices_due = -math.inf
        self._gpu_set_final = False
        self._split: dict[int, _ProcessSplit] | None = None
        self._used_at_process_read: dict[int, int | None] | None = None
        self._process_due = -math.inf
        self._process_read_at = -math.inf
        self._live_bytes: int | None = None
        self._live_due = -math.inf
        self.live_array_budget = live_array_budget
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.error_count = 0
        self.callback_errors = 0
        self.configure(interval, process_interval, busy_process_interval, live_array_interval)

    def configure(
        self,
        interval: float | None = None,
        process_interval: float | None = None,
        busy_process_interval: float | None = None,
        live_array_interval: float | None = None,
    ) -> None:
        """Change the sampling rates (seconds); ``None`` keeps a rate as it is.

        Raises:
            ValueError: when a rate is not a positive number.
        """
        updates = {
            "interval": interval,
            "process_interval": process_interval,
            "busy_process_interval": busy_process_interval,
            "live_array_interval": live_array_interval,
        }
        for name, value in updates.items():
            if value is not None and not (
                isinstance(value, (int, float)) and math.isfinite(value) and value > 0
            ):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        with self._lock:
            for name, value in updates.items():
                if value is not None:
                    setattr(self, name, float(value))

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive and has not been asked to stop."""
        thread = self._thread
        return thread is not None and thread.is_alive() and not self._stop_event.is_set()

    def start(self, timeout: float = 5.0) -> None:
        """Start the sampling thread; does nothing if it is already running.

        A thread still winding down from :meth:`stop` is first waited for (up to *timeout* s).
        """
        if self.running:
            return
        self._join(self._thread, timeout)
        with self._lock:
            if self.running:  # another caller started it meanwhile
                return
            self._stop_event = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop_event,), name="jax_nbmem-sampler", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the sampling thread and wait up to *timeout* s for it; a no-op when stopped.

        Called from the sampler's own thread (a subscriber), it only asks: the thread ends
        after the current tick, and a later ``stop()`` from elsewhere joins it. A thread stuck
        in a slow NVML call is left to finish it (it is a daemon) once *timeout* has passed.
        """
        with self._lock:
            thread = self._thread
            self._stop_event.set()
            self._wake.set()
        self._join(thread, timeout)

    def _join(self, thread: threading.Thread | None, timeout: float) -> None:
        # Joined without holding the lock: the thread's last tick may still need it.
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout)
        with self._lock:
            if self._thread is thread and not thread.is_alive():
                self._thread = None

    @property
    def busy(self) -> bool:
        """Whether the process list is read at the busy rate now (see :meth:`set_busy`)."""
        return self._busy

    def set_busy(self, busy: bool) -> None:
        """Read the process list every ``busy_process_interval`` while *busy* (a cell runs).

        A plain assignment, no lock: a cell hook calls it.
        """
        self._busy = bool(busy)

    def latest(self) -> Sample | None:
        """The most recent sample, or ``None`` before the first."""
        return self._latest

    def recent(self, max_age_s: float) -> Sample | None:
        """The latest sample if the thread is running and took it at most ``max_age_s`` ago."""
        latest = self._latest
        if latest is None or not self.running or self._clock() - latest.t > max_age_s:
            return None
        return latest

    def history(self, since: float | None = None) -> list[Sample]:
        """All kept points, oldest first; with *since*, those with ``t >= since``.

        See :class:`SampleHistory`; asking for a recent *since* is cheap however long the
        session, which is what a view updated a few times a second should do.
        """
        with self._lock:
            return self._history.samples(since)

    def subscribe(self, callback: Callable[[Sample], Any]) -> Callable[[], None]:
        """Call *callback(sample)* after each scheduled sample, on the sampler's thread.

        Exceptions from *callback* are swallowed and counted in :attr:`callback_errors`.
        Returns a function that unsubscribes (calling it twice is harmless).
        """
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def track(self) -> PeakTracker:
        """Open a :class:`PeakTracker` that sees every sample until it is closed."""
        tracker = PeakTracker(self._detach_tracker)
        with self._lock:
            self._trackers.append(tracker)
        return tracker

    def quick_reading(self) -> QuickReading | None:
        """What a cell hook may read itself: JAX's GPU counters; never NVML, no system call.

        None before JAX's backend is up (or when it cannot be asked).

        JAX's ``memory_stats()`` answers from its allocator in microseconds; the backend is
        asked only once it is up, and ``jax.live_arrays()`` never. Host RSS is left to the
        samples: reading /proc releases the GIL, and taking it back behind the sampler's
        thread cost the cell more than everything else here.
        """
        source = self._source
        try:
            if not source.backend_initialized():
                return None
            found = source.quick_device_stats()
        except Exception as exc:
            self._remember(exc)
            return None
        stats = tuple(_jax_gpus(found)) if found else ()
        return QuickReading(self._clock(), self._monotonic(), True, stats)

    def request_after(self, callback: Callable[[Sample, float], Any]) -> None:
        """Have a complete sample taken as soon as possible and given to ``callback``.

        ``callback(sample, started)`` runs on the sampler's thread, which is woken at once;
        ``started`` is the monotonic time the reading began. Requests that arrive while one
        reading is under way are served by the next. Without a running thread the sample is
        taken at once, on the caller's thread. Errors in ``callback`` are counted, not raised.
        """
        if not self.running:
            started = self._monotonic()
            self._deliver([callback], self._record(force=True), started)
            return
        first = not self._after_requests
        self._after_requests.append(callback)
        # Cells in quick succession share a reading: the thread is woken for the first one
        # only, and not again within _MIN_AFTER_GAP_S of its last reading (it takes the
        # waiting ones at its next tick then). Every wake costs the cell a GIL hand-over.
        if first and self._monotonic() - self._last_forced >= _MIN_AFTER_GAP_S:
            self._wake.set()

    def tick(self) -> Sample:
        """Take one scheduled sample, as the thread does every ``interval``; notify subscribers.

        Slow readings (process list, live arrays) are taken only when due.
        """
        sample = self._record(force=False)
        self._notify(sample)
        return sample

    def _notify(self, sample: Sample) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(sample)
            except Exception as exc:
                self.callback_errors += 1
                self._remember(exc)

    def sample_now(self, *, include_live_arrays: bool = True) -> Sample:
        """Take a complete sample at once, on this thread; it waits for NVML.

        The process list is read fresh, and the live arrays unless told not to. Not for a
        cell's path. Subscribers are not called: they hear from the thread's next tick.
        """
        return self._record(force=True, force_live=include_live_arrays)

    def _serve_after(self) -> None:
        """Take the sample that the cells which ended so far asked for, and hand it over."""
        requests = []
        while self._after_requests:
            requests.append(self._after_requests.popleft())
        if not requests:
            return
        started = self._monotonic()
        self._last_forced = started
        sample = self._record(force=True)
        self._deliver(requests, sample, started)
        self._notify(sample)  # it stands for this tick's sample too

    def _deliver(self, requests: list, sample: Sample, started: float) -> None:
        for callback in requests:
            try:
                callback(sample, started)
            except Exception as exc:
                self.callback_errors += 1
                self._remember(exc)

    def _record(self, force: bool, force_live: bool = False) -> Sample:
        try:
            sample = self._collect(self._monotonic(), force, force_live)
        except Exception as exc:  # a source broke its contract: an empty sample, said
            self._remember(exc)
            sample = Sample(t=self._clock(), gpus=(), host=None)
        with self._lock:
            self._history.add(sample)
            self._latest = sample
            self.samples_taken += 1
            for tracker in self._trackers:
                tracker.observe(sample)
        return sample

    def _collect(self, now: float, force: bool, force_live: bool) -> Sample:
        """Read everything that is due, outside the lock; publish the schedule under it."""
        source = self._source
        slack = self.interval / 2  # ticks jitter; a reading due within half a tick is due now
        jax_up = bool(self._read(source.backend_initialized, False))
        if not self._gpu_set_final and (force or now + slack >= self._gpu_indices_due):
            indices = self._read(source.gpu_indices, None)
            with self._lock:
                self._gpu_indices = None if indices is None else tuple(indices)
                self._gpu_indices_due = now + _GPU_SET_REFRESH_S
                # JAX fixed its devices when its backend started; a later CUDA_VISIBLE_DEVICES
                # edit changes nothing for this process, so the set read now is final.
                self._gpu_set_final = jax_up and indices is not None
        indices = self._gpu_indices
        memory = [] if indices == () else list(self._read(source.memory, [], indices) or [])
        used = {reading.index: reading.used_bytes for reading in memory}
        # A forced sample (after a cell) needs this process's bytes as they are now. When no
        # GPU's used memory moved since the last process list, nobody's bytes did, and the
        # list (the costly NVML call) would say the same again.
        moved = used != self._used_at_process_read or None in used.values()
        due = self._process_due
        if self._busy:  # a cell runs: the list is due a busy interval after the last one
            due = min(due, self._process_read_at + self.busy_process_interval)
        if _moved_much(used, self._used_at_process_read):
            # Someone's bytes changed since the list: who holds what is stale. Read it again
            # soon (no more often than while a cell runs), so a jump of this kernel's memory
            # is not drawn, for a second, as another process's.
            due = min(due, self._process_read_at + self.busy_process_interval)
        if (force and moved) or now + slack >= due:
            listing = self._read(source.processes, None, indices)
            split = _split_by_gpu(listing, source.pid)
            with self._lock:
                self._split, self._used_at_process_read = split, used
                self._process_read_at = now
                self._process_due = now + self.process_interval
        stats = list(self._read(source.device_stats, []) or []) if jax_up else []
        gpu_stats = _jax_gpus(stats)
        if not jax_up or any(s.bytes_in_use is not None for s in gpu_stats):
            # JAX's allocator counts its bytes itself: no need to walk every live array.
            self._live_bytes = None
        elif force_live or now + slack >= self._live_due:
            began = time.perf_counter()
            self._live_bytes = self._read(source.live_array_bytes, None)
            cost = time.perf_counter() - began
            # Walking the arrays costs time per array: read them less often the more there
            # are, so that it never takes more than its budget of a core.
            self._live_due = now + max(self.live_array_interval, cost / self.live_array_budget)
        # JAX numbers its GPU devices in the order of the kernel's visible GPUs.
        order = list(indices) if indices is not None else sorted(g.index for g in memory)
        stats_by_index = dict(zip(order, gpu_stats, strict=False))
        split = self._split
        listed_used = self._used_at_process_read or {}
        gpus = []
        for reading in memory:
            stale = _moved_much(
                {reading.index: reading.used_bytes}, {reading.index: listed_used.get(reading.index)}
            )
            try:
                gpus.append(
                    _gpu_sample(reading, stats_by_index.get(reading.index), split, stale=stale)
                )
            except Exception as exc:  # a malformed reading loses its GPU, not the sample
                self._remember(exc)
        host = HostSample(self._read(source.host_rss_bytes, None), self._live_bytes)
        return Sample(t=self._clock(), gpus=tuple(gpus), host=host)

    def _read(self, reader: Callable[..., Any], default: Any, *args: Any) -> Any:
        try:
            return reader(*args)
        except Exception as exc:
            self._remember(exc)
            return default

    def _remember(self, exc: BaseException) -> None:
        # Text only: keeping the exception would keep its traceback's frames (and arrays) alive.
        self.error_count += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.last_error_at = self._clock()

    def _detach_tracker(self, tracker: PeakTracker) -> None:
        with self._lock:
            if tracker in self._trackers:
                self._trackers.remove(tracker)

    def _run(self, stop_event: threading.Event) -> None:
        deadline = self._monotonic()
        while not stop_event.is_set():
            try:
                if self._after_requests:
                    self._serve_after()
                else:
                    self.tick()
            except BaseException as exc:  # never out of the thread, whatever happens
                self._remember(exc)
            now = self._monotonic()
            if now >= deadline:
                deadline = _next_deadline(deadline, now, self.interval)
            self._wake.wait(max(0.0, deadline - now))
            self._wake.clear()


class QuickReading(NamedTuple):
    """What a cell hook reads itself (see :meth:`Sampler.quick_reading`).

    ``jax`` holds JAX's GPU devices' counters (anything with ``id``, ``bytes_in_use`` and
    ``peak_bytes_in_use``), in device order; empty before the backend starts or on the CPU.
    A named tuple: made twice per cell, where a frozen dataclass costs several times more.
    """

    t: float
    mono: float
    jax_up: bool
    jax: tuple[Any, ...]

    def jax_in_use(self) -> int | None:
        """Bytes JAX's arrays use over its GPU devices; None when any device cannot say."""
        values = [getattr(d, "bytes_in_use", None) for d in self.jax]
        return None if not values or None in values else sum(values)


@dataclass(frozen=True)
class _ProcessSplit:
    """One GPU's process list, split once into this process's bytes and everyone else's.

    ``mine`` is None when our PID is listed without bytes; ``listed`` says whether it is
    listed at all; ``others`` is None when another process's bytes are unknown. A GPU whose
    list could not be read has ``readable`` False (and its ``problem``): nothing is known.
    """

    listed: bool
    mine: int | None
    others: int | None
    readable: bool = True
    problem: str | None = None


_UNLISTED = -1  # the split that stands for every GPU a flat process list does not name


def _split_by_gpu(listing: Any, pid: int) -> dict[int, _ProcessSplit] | None:
    """Per GPU, our bytes and the others' from one process-list reading; None if unread.

    ``listing`` is what ``SamplerSource.processes`` returned: flat process records (``pid``,
    ``gpu``, ``used_bytes``), or per-GPU lists (``gpu``, ``processes`` — None when that GPU's
    list failed).
    """
    if listing is None:
        return None
    entries: dict[int, list[Any] | None] = {}
    problems: dict[int, str | None] = {}
    flat = True
    for item in listing:
        if hasattr(item, "processes"):
            flat = False
            entries[item.gpu] = None if item.processes is None else list(item.processes)
            problems[item.gpu] = getattr(item, "problem", None)
        else:
            found = entries.setdefault(item.gpu, [])
            if found is not None:
                found.append(item)
    split: dict[int, _ProcessSplit] = {}
    for gpu, processes in entries.items():
        if processes is None:
            split[gpu] = _ProcessSplit(False, None, None, readable=False, problem=problems[gpu])
            continue
        mine = [p.used_bytes for p in processes if p.pid == pid]
        theirs = [p.used_bytes for p in processes if p.pid != pid]
        split[gpu] = _ProcessSplit(
            listed=bool(mine),
            mine=None if not mine or None in mine else sum(mine),
            others=None if None in theirs else sum(theirs),
            problem=problems.get(gpu),
        )
    if flat:  # a flat list names only GPUs with processes: the others have none
        split[_UNLISTED] = _ProcessSplit(listed=False, mine=None, others=0)
    return split


def _jax_gpus(stats: Sequence[Any]) -> list[Any]:
    """JAX's GPU devices among ``stats``, in device-id order."""
    return sorted(
        (s for s in stats if getattr(s, "platform", None) in _JAX_GPU_PLATFORMS),
        key=lambda s: getattr(s, "id", None) or 0,
    )


def _held(stats: Any) -> int | None:
    """What JAX's allocator holds (its pool): ``pool_bytes``, else ``bytes_limit``.

    Never ``bytes_reserved``, which XLA leaves at 0 on GPUs.
    """
    if stats is None:
        return None
    pool = getattr(stats, "pool_bytes", None)
    return pool if pool is not None else getattr(stats, "bytes_limit", None)


# How far a GPU's used bytes may move before its process list is taken as out of date.
_STALE_LIST_BYTES = 64 * 1024**2


def _moved_much(used: dict[int, int | None], at_list: dict[int, int | None] | None) -> bool:
    """Whether some GPU's used bytes moved by more than ``_STALE_LIST_BYTES`` since the list."""
    if at_list is None:
        return False
    for index, now in used.items():
        then = at_list.get(index)
        if now is not None and then is not None and abs(now - then) > _STALE_LIST_BYTES:
            return True
    return False


def _gpu_sample(
    reading: Any, stats: Any, split: dict[int, _ProcessSplit] | None, stale: bool = False
) -> GpuSample:
    """One GPU's sample from its memory reading, JAX's counters and the process list's split.

    *stale*: the GPU's used bytes moved since the process list was read, so the split cannot
    say whose bytes moved; others are unknown (a gap, not a guess) until the next list.
    """
    used = reading.used_bytes
    self_bytes: int | None = None
    others: int | None = None
    mine = split.get(reading.index, split.get(_UNLISTED)) if split is not None else None
    if mine is not None and mine.readable:
        if mine.listed:
            self_bytes = mine.mine
        elif stats is None and used is not None:
            self_bytes = 0  # JAX does not use this GPU and NVML does not list us: nothing
        # Otherwise our pid is missing from a GPU that JAX holds (e.g. NVML sees another PID
        # namespace in a container): unknown, not 0.
        if stale:
            others = None
        elif used is not None and self_bytes is not None:
            others = max(0, used - self_bytes)
        else:
            others = mine.others
    # No split: the GPU's process list could not be read, so who holds what is unknown.
    return GpuSample(
        index=reading.index,
        uuid=reading.uuid,
        name=reading.name,
        total_bytes=reading.total_bytes,
        used_bytes=used,
        free_bytes=reading.free_bytes,
        self_bytes=self_bytes,
        others_bytes=others,
        jax_in_use=getattr(stats, "bytes_in_use", None),
        jax_peak=getattr(stats, "peak_bytes_in_use", None),
        jax_reserved=_held(stats),
        jax_limit=getattr(stats, "bytes_limit", None),
        problem=nvml.gpu_problem(getattr(reading, "problem", None), mine.problem if mine else None),
        reserved_bytes=getattr(reading, "reserved_bytes", None),
    )


def _next_deadline(previous: float, now: float, interval: float) -> float:
    """Next tick time on a fixed grid; after a stall, resume from *now* instead of bursting."""
    deadline = previous + interval
    return deadline if deadline > now - interval else now
