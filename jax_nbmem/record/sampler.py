"""The background sampler: GPU, JAX and host memory over time, in a bounded history.

A daemon thread takes a :class:`Sample` every ``interval`` seconds on a monotonic schedule.
Each tick is small: NVML's memory counters, JAX's allocator counters once the user's code has
started the backend, and the host RSS. NVML's process list (which tells this process's bytes
apart from other processes') is read less often, and more often while a cell runs
(:meth:`Sampler.set_busy`) so that a short transient is caught. ``jax.live_arrays()`` costs
time in proportion to the number of arrays and is read at most every ``live_array_interval``.

The sampler never raises out of its thread: a failed reading leaves its value ``None``, and
the error is kept as text in :attr:`Sampler.last_error`.

What it reads, and how a reading becomes a GPU's sample: :mod:`jax_nbmem.record.readings`;
when it reads the process lists: :mod:`~jax_nbmem.record.process_lists`; when it wakes:
:mod:`~jax_nbmem.record.pacing`; the extremes a record keeps: :mod:`~jax_nbmem.record.peaks`.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from jax_nbmem.gpu.jaxstats import gpu_stats_now
from jax_nbmem.record.boundary import BoundaryPlan
from jax_nbmem.record.history import GpuSample, HostSample, Sample, SampleHistory
from jax_nbmem.record.live_walk import LiveWalk
from jax_nbmem.record.pacing import Pacing, next_deadline
from jax_nbmem.record.peaks import GpuPeaks, Peaks, PeakTracker
from jax_nbmem.record.process_lists import ProcessLists
from jax_nbmem.record.readings import QuickReading, SamplerSource, gpu_samples, jax_gpus

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
# Walking jax.live_arrays() may take at most this share of one core.
_LIVE_ARRAY_BUDGET = 0.005
# A reading at a cell's boundary is taken on the cell's path (the next cell's start) only
# while readings take less than this; a slower NVML leaves the boundary unread (the ledger
# then joins the two cells into one span) rather than hold up the cell.
_BOUNDARY_BUDGET_S = 0.05
# A reading under way for this long is taken as stuck in NVML. Longer than the budget: on a
# loaded machine the thread may wait that long for a core or for the GIL the cells hold.
_STUCK_READING_S = 0.25


class Sampler:
    """Samples memory on a daemon thread and keeps a bounded history.

    ``start()`` and ``stop()`` are idempotent; ``stop()`` joins the thread. Without the thread,
    :meth:`tick` takes the same scheduled samples on demand and :meth:`sample_now` takes a
    fresh complete one.

    Readings are taken outside the sampler's lock, which guards only what is published (the
    history, the latest sample, the schedule), so a slow NVML holds up the thread that reads
    it and nobody else: :meth:`latest`, :meth:`track`, :meth:`set_busy`, :meth:`request_after`
    and :meth:`quick_reading` never wait for NVML or JAX; nor do cell hooks.

    What a cell hook reads and writes is kept in plain attributes, so that the hook pays no
    call for it: ``latest_sample`` (what :meth:`latest` returns), ``samples_taken`` (grows by
    one per sample), ``busy`` (what :meth:`set_busy` sets), ``back_to_back`` (the latest cell
    started right after the one before, and read its boundary: polls would only take the GIL
    from such cells), ``quick_gpus`` (False when a quick reading is known to hold no GPU
    counters: JAX's devices were listed and none is a GPU, or its backend is down;
    :meth:`quick_gpu_reading` need not be asked then), ``serving`` (the thread serves
    requests), ``wake_after_at`` (from when a cell's end wakes the thread, see
    :meth:`read_after_cells`; infinity while the thread polls for ended cells itself, see
    :mod:`~jax_nbmem.record.pacing`), ``latest_timed``.

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
        # Appended by cell hooks, emptied by the thread, without a lock (both are atomic).
        self._after_requests: deque[Callable[[Sample, float], Any]] = deque()
        # Woken once for a reading after cells (infinity until it begins, then when it began):
        # a wake costs a cell a GIL hand-over; the cells that end before it begins share it.
        self.wake_after_at = -math.inf
        # Whether the thread serves requests: set by start(), cleared by stop() and by the
        # thread's own end (it may die). A cell's request reads it instead of asking the
        # thread and its stop event, which costs the cell four calls.
        self.serving = False
        # (waiting, deliver) pairs: see read_after_cells.
        self._cell_readers: list[tuple[Callable[[], bool], Callable[[Sample, float], Any]]] = []
        self.latest_sample: Sample | None = None
        # (monotonic time its reading began, latest_sample), published together, so that a
        # cell's start can tell whether the latest reading began after the previous cell ended.
        self.latest_timed: tuple[float, Sample] | None = None
        # When the reading under way began (monotonic; None when none is), and how long the last
        # two took: a cell's start reads only while they are quick (the first starts NVML).
        self.reading_since: float | None = None
        self.last_reading_s = 0.0
        self._reading_before_last_s = 0.0
        self.quick_gpus = True
        self.samples_taken = 0  # grows by one per sample: tells whether any came meanwhile
        self.busy = self.back_to_back = False  # see set_busy; and the class's docstring
        self._gpu_indices: Sequence[int] | None = None
        self._gpu_indices_due = -math.inf
        self._gpu_set_final = False
        self._lists = ProcessLists()
        self._plan: BoundaryPlan | None = None  # see boundary_reading
        self._pacing, self._read_for_cells = Pacing(), False  # the thread's: see _loop
        self._made: dict[int, tuple[Any, ...]] = {}  # GPU: its sample, and what made it
        self.live_walk = LiveWalk()  # when jax.live_arrays() is walked, and what it found
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
            self.serving = True
            self.wake_after_at = -math.inf
            self._pacing = Pacing()
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the sampling thread and wait up to *timeout* s for it; a no-op when stopped.

        Called from the sampler's own thread (a subscriber), it only asks: the thread ends
        after the current tick, and a later ``stop()`` from elsewhere joins it. A thread stuck
        in a slow NVML call is left to finish it (it is a daemon) once *timeout* has passed.
        """
        with self._lock:
            thread = self._thread
            self.serving = False
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

    def set_busy(self, busy: bool) -> None:
        """Read the process list every ``busy_process_interval`` while *busy* (a cell runs)."""
        self.busy = bool(busy)

    def latest(self) -> Sample | None:
        """The most recent sample, or ``None`` before the first."""
        return self.latest_sample

    def recent(self, max_age_s: float) -> Sample | None:
        """The latest sample if the thread is running and took it at most ``max_age_s`` ago."""
        latest = self.latest_sample
        if latest is None or not self.running or self._clock() - latest.t > max_age_s:
            return None
        return latest

    def history(self, since: float | None = None) -> list[Sample]:
        """All kept points, oldest first; with *since*, those with ``t >= since``.

        See :class:`SampleHistory`: a recent *since* is cheap however long the session.
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
        stats = tuple(jax_gpus(found)) if found else ()
        return QuickReading(self._clock(), self._monotonic(), True, stats)

    def quick_gpu_reading(self) -> QuickReading | None:
        """:meth:`quick_reading` when it holds JAX's GPU counters, else None: what a cell needs.

        A cell's record keeps only the counters of a quick reading, so one without any (before
        the backend starts, on the CPU) is as good as none; this says so at the cost of one
        lookup, where :meth:`quick_reading` builds a reading with the time in it.
        """
        source = self._source
        try:
            found = source.quick_device_stats()
            if not found or not source.backend_initialized():
                return None
        except Exception as exc:
            self._remember(exc)
            return None
        stats = tuple(jax_gpus(found))
        return QuickReading(self._clock(), self._monotonic(), True, stats) if stats else None

    def request_after(self, callback: Callable[[Sample, float], Any]) -> None:
        """Have a complete sample taken as soon as possible and given to ``callback``.

        ``callback(sample, started)`` runs on the sampler's thread, which is woken at once;
        ``started`` is the monotonic time the reading began. Requests that arrive while one
        reading is under way are served by the next. Without a running thread the sample is
        taken at once, on the caller's thread. Errors in ``callback`` are counted, not raised.
        """
        if not self.serving:  # no thread, or it stopped or died
            started = self._monotonic()
            sample = self._record(force=True, boundary=True, cell_path=True)
            self._deliver([callback], sample, started)
            return
        self._after_requests.append(callback)
        if self._monotonic() >= self.wake_after_at:
            self.wake_for_reading()

    def read_after_cells(
        self, waiting: Callable[[], bool], deliver: Callable[[Sample, float], Any]
    ) -> None:
        """Take a complete reading whenever ``waiting()`` says that cells ended unread.

        A ledger's way to have a reading after every cell without a call per cell: a cell's
        end queues the cell in the ledger and, when its monotonic end time has reached
        ``wake_after_at``, calls :meth:`wake_for_reading` (at most once per reading). The thread
        asks ``waiting()`` at each wake and tick, and calls ``deliver(sample, started)`` with
        the reading, ``started`` being the monotonic time it began: the cells that ended
        after that wait for the next. Only while ``serving``: without the thread, a caller
        uses :meth:`request_after`. Errors in either are counted, not raised.
        """
        with self._lock:
            self._cell_readers = [*self._cell_readers, (waiting, deliver)]

    def boundary_reading(self) -> tuple[float, Sample] | None:
        """A complete reading taken now, on this thread, at the boundary between two cells.

        For a cell's start when the previous cell's reading has not come (Run All): (monotonic
        time it began, sample), or ``None`` without asking anything when readings are slow (the
        last two took ``_BOUNDARY_BUDGET_S`` or more, or one is under way for ``_STUCK_READING_S``:
        NVML hangs). Where nothing but the RSS moved since the last complete reading, that
        reading's GPU samples serve (:class:`BoundaryPlan`); else live arrays are walked only while
        cheap, and of the process lists only this process's entries where used bytes moved.
        """
        since = self.reading_since
        began = self._monotonic()
        if min(self.last_reading_s, self._reading_before_last_s) >= _BOUNDARY_BUDGET_S or (
            since is not None and began - since >= _STUCK_READING_S
        ):
            return None
        return began, self._boundary(began, cell_path=True)

    def _boundary(self, began: float, cell_path: bool) -> Sample:
        """A reading between cells: the last complete one's GPU samples where nothing moved."""
        plan = self._plan
        args = (self._source, began, self._lists.state, self._own_pid, self._clock, cell_path)
        sample, read = (None, None) if plan is None else plan.sample(*args)
        if sample is None:  # what moved was read just now: the complete reading takes it
            return self._record(force=True, boundary=True, cell_path=cell_path, taken=read)
        self._publish(began, sample)
        return sample

    def wake_for_reading(self) -> None:
        """Wake the thread for the reading that requests or cells wait for."""
        self.wake_after_at = math.inf  # until that reading begins: one wake is enough
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

    def _serve_after(self) -> bool:
        """Take the sample that requests and waiting cells want, hand it over; say if one was."""
        requests = []
        while self._after_requests:
            requests.append(self._after_requests.popleft())
        readers = [deliver for waiting, deliver in self._cell_readers if self._asks(waiting)]
        self._read_for_cells = bool(readers)
        if not requests and not readers:
            return False
        started = self._monotonic()  # cells that end after it wake the thread unless it polls
        self.wake_after_at = math.inf if self._pacing.active else started
        sample = self._boundary(started, cell_path=False)
        self._deliver(requests + readers, sample, started)
        self._notify(sample)  # it stands for this tick's sample too
        return True

    def _asks(self, waiting: Callable[[], bool]) -> bool:
        try:
            return bool(waiting())
        except Exception as exc:
            self.callback_errors += 1
            self._remember(exc)
            return False

    def _deliver(self, requests: list, sample: Sample, started: float) -> None:
        for callback in requests:
            try:
                callback(sample, started)
            except Exception as exc:
                self.callback_errors += 1
                self._remember(exc)

    def _record(self, force: bool, force_live: bool = False, boundary: bool = False,
                cell_path: bool = False, taken: tuple | None = None) -> Sample:  # fmt: skip
        began = self._monotonic()
        self.reading_since = began
        try:
            sample = self._collect(began, force, force_live, boundary, cell_path, taken)
        except Exception as exc:  # a source broke its contract: an empty sample, said
            self._remember(exc)
            sample = Sample(t=self._clock(), gpus=(), host=None)
        self.reading_since = None
        self._publish(began, sample)
        return sample

    def _publish(self, began: float, sample: Sample) -> None:
        self._reading_before_last_s = self.last_reading_s
        self.last_reading_s = self._monotonic() - began
        with self._lock:
            self._history.add(sample)
            self.latest_sample = sample
            self.latest_timed = (began, sample)
            self.samples_taken += 1
            for tracker in self._trackers:
                tracker.observe(sample)

    def _collect(self, now: float, force: bool, force_live: bool, boundary: bool,
                 cell_path: bool, taken: tuple | None = None) -> Sample:  # fmt: skip
        """Read everything that is due, outside the lock; publish the schedule under it.

        *cell_path*: the reading is on a cell's path (its start reads the boundary): only what
        the record needs, at a cost that does not grow with the node's processes. *taken*:
        ``(indices, memory)``, NVML's memory readings of those GPUs just taken (a boundary's).
        """
        source = self._source
        slack = self.interval / 2  # ticks jitter; a reading due within half a tick is due now
        jax_up = bool(self._read(source.backend_initialized, False))
        # A boundary keeps the set on its schedule (only CUDA_VISIBLE_DEVICES edits change it).
        refresh = force and not boundary
        if not self._gpu_set_final and (refresh or now + slack >= self._gpu_indices_due):
            indices = self._read(source.gpu_indices, None)
            with self._lock:
                self._gpu_indices = None if indices is None else tuple(indices)
                self._gpu_indices_due = now + _GPU_SET_REFRESH_S
                # JAX fixed its devices when its backend started: the set read now is final.
                self._gpu_set_final = jax_up and indices is not None
        indices = self._gpu_indices
        memory = taken[1] if taken is not None and taken[0] == indices else [] if indices == () \
            else list(self._read(source.memory, [], indices) or [])  # fmt: skip
        used = {reading.index: reading.used_bytes for reading in memory}
        lists = self._lists
        # Where no GPU's used bytes moved, nobody's did. A boundary reads this process's own
        # entries where they moved (read_own); whole lists only on the thread's schedule.
        moved = lists.moved(used)
        due = lists.due(used, self.busy, self.busy_process_interval)
        pid = self._own_pid()  # proven since the lists were split (a container's): split again
        renamed = pid != lists.split_pid
        if (force and (moved or renamed) and not boundary) or (
            not cell_path and now + slack >= due
        ):
            listing = self._read(source.processes, None, indices)
            lists.take_whole(listing, pid, used, now, self.process_interval)
        elif boundary and (moved or renamed):
            lists.read_own(source.own_processes, pid, used, self._remember)
        stats = list(self._read(source.device_stats, []) or []) if jax_up else []
        gpu_stats = jax_gpus(stats)
        # JAX's own quick reading (jaxstats.gpu_stats_now) finds GPU counters only where
        # this listing found GPUs; another source's quick reading is always asked.
        self.quick_gpus = bool(gpu_stats) or source.quick_device_stats is not gpu_stats_now
        walks = jax_up and not any(s.bytes_in_use is not None for s in gpu_stats)
        live = self.live_walk
        if not walks:  # JAX's allocator counts its bytes itself: no need to walk every array
            live.forget()
        elif live.due_now(now, slack, force_live, boundary):
            reader = source.live_array_bytes
            live.walk(lambda: self._read(reader, None), now, self._clock,
                      self.live_array_interval, self.live_array_budget)  # fmt: skip
        until = live.until(slack) if walks else math.inf
        if not self._gpu_set_final:  # the set is read again on its schedule, boundaries too
            until = min(until, self._gpu_indices_due - slack)
        state = lists.state
        gpus = tuple(gpu_samples(memory, indices, gpu_stats, *state, self._remember, self._made))
        # Split up to date (no used bytes moved since, split by our PID now): a boundary that
        # finds the same figures again takes these samples (BoundaryPlan).
        settled = not lists.moved(used) and pid == lists.split_pid and len(gpus) == len(memory)
        self._plan = None if not settled else BoundaryPlan(
            indices=indices, memory=memory, jax_up=jax_up, stats=gpu_stats or None, pid=pid,
            state=state, gpus=gpus, live=live.state(), until=until,
            lists_due=lists.due(used, self.busy, self.busy_process_interval) - slack,
        )  # fmt: skip
        host = HostSample(self._read(source.host_rss_bytes, None), *live.state())
        return Sample(t=self._clock(), gpus=gpus, host=host)

    def _own_pid(self) -> int | None:
        """This process as NVML lists it; None while that is not known (nothing is ours)."""
        pid = self._source.pid
        try:
            return pid() if callable(pid) else pid
        except Exception as exc:
            self._remember(exc)
            return None

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
        try:
            self._loop(stop_event)
        finally:
            with self._lock:
                if self._stop_event is stop_event:  # not a thread started since
                    self.serving = False
            # Cells that ended while it wound down wait for the next start: no last reading.

    def _loop(self, stop_event: threading.Event) -> None:
        # Ticks on a grid; while cells come a short pause apart, polls between them for the
        # cells that ended, whose end then wakes nobody (record/pacing.py).
        deadline = self._monotonic()
        woken = polled = False
        while not stop_event.is_set():
            served = False
            try:
                served = self._serve_after()
                if not served and not polled:  # nothing waits for a reading: the schedule's
                    self.tick()
            except BaseException as exc:  # never out of the thread, whatever happens
                self._remember(exc)
            now = self._monotonic()
            if served:
                # The reading after a cell stands for a tick: the schedule restarts from it, so
                # at a person's pace no tick lands on the next cell and takes the GIL from it.
                deadline = now + self.interval
            elif now >= deadline:
                deadline = next_deadline(deadline, now, self.interval)
            began = self._pacing.after_pass(now, read_for_cells=served and self._read_for_cells,
                woken=woken, polled=polled, cell_running=self.busy,
                back_to_back=self.back_to_back)  # fmt: skip
            if began is False:  # polling ends: a cell that ended unwoken before that is read now
                self.wake_after_at, woken, polled = -math.inf, False, True
                continue
            if began:
                self.wake_after_at = math.inf
            until, poll = self._pacing.next_wake(now, deadline)
            woken = self._wake.wait(max(0.0, until - now))
            self._wake.clear()
            polled = poll and not woken and self._monotonic() < deadline
