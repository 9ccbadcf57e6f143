"""Per-cell memory records: what each cell took, held at its peak, and left behind.

The magics' ``pre_run_cell``/``post_run_cell`` callbacks call :meth:`Ledger.cell_started` and
:meth:`Ledger.cell_finished`. Both are cheap and never wait for NVML: each takes a timestamp and
the readings that cannot block (JAX's GPU allocator counters, through the sampler's
:meth:`~jax_nbmem.record.sampler.Sampler.quick_gpu_reading`, where there are any), takes the
sampler's latest sample as "before", and leaves the complete reading after the cell to the
sampler's thread (the cell queues itself; see ``Sampler.read_after_cells``), which is folded into
the record when it arrives, with its delay.

The invariant: a cell's "after" is read after it ends and before the next cell starts, so no
cell is ever charged with another's memory. When the next cell starts before the sampler's
thread has delivered that reading (Run All: cells back to back), the start claims the previous
cell and takes the reading itself (:meth:`Sampler.boundary_reading`): one reading per boundary,
which is both the previous cell's "after" and this cell's "before"; a reading of the thread's
that arrives later is not used for it. When readings are slow (NVML hangs), the start does not
wait: the two cells become one span, said by the later record's ``span_start`` (and the
earlier one's ``notes``). JAX's counters are read at both ends of every cell by the hooks
themselves, so they are always the cell's own. Never a guess.

Neither method raises: IPython prints a traceback after every cell when a callback raises.
Nothing of a cell's exception is kept but its type and message, so a failed cell's frames (and
the arrays they hold) are not kept alive by the ledger.

GPU fields are totals over this kernel's GPUs. With one GPU (the usual case) they are that
GPU's values; with several, each peak or minimum is the sum of per-GPU peaks or minima, which
may fall at different moments. A field is ``None`` when any of the GPUs could not say.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from jax_nbmem.gpu import jaxstats
from jax_nbmem.record.combine import block_jax_peak, difference, extreme, gpu_total, peak_total
from jax_nbmem.record.sampler import Peaks
from jax_nbmem.text import printable
from jax_nbmem.units import MISSING, format_bytes, format_bytes_delta, format_duration

__all__ = ["CellRecord", "Ledger", "format_table"]

_FIRST_LINE_CHARS = 60
_TABLE_CELL_CHARS = 28
_ERROR_MESSAGE_CHARS = 300
# A "before" sample older than this (seconds) is worth a note: NVML may be slow.
_STALE_BEFORE_S = 1.0
_AFTER_WAITING = "GPU figures after the cell: not read yet (the sampler reads them next)"
_AFTER_MISSED = "GPU figures after the cell: not read (the sampler could not be asked)"
_AFTER_SPANNED = (
    "figures after the cell: not read (the next cell started while the sampler's readings "
    "were slow: its first, or a slow NVML); the next cell's record covers both (its span_start)"
)


@dataclass(frozen=True)
class CellRecord:
    """One executed cell. Byte counts are ``None`` when unknown, never a guessed 0.

    ``success`` is ``None`` for a cell whose end was never reported (another cell started
    first). ``gpu_count`` is how many GPUs the GPU fields add up (0: no GPU was seen; then
    only the ``host_*`` and ``live_array_*`` fields, which describe host memory, say anything).

    ``gpu_self_*`` is this process's memory per NVML; ``jax_in_use_*`` is JAX's allocator,
    read exactly at the cell's two ends. ``gpu_self_after`` comes from the sampler's first
    complete reading after the cell, taken ``gpu_after_delay_s`` seconds after it ended
    (``None`` until it arrives, and for good when it never came; ``notes`` then say why).
    Peaks come from the sampler's samples, so a spike shorter than its interval can be
    missed, except ``jax_in_use_peak`` when ``peak_exact``: JAX's own ``peak_bytes_in_use``
    rose during the cell (or the backend started in it), so that new peak is the cell's peak
    exactly. A peak is never below its cell's before or after. ``free_at_start`` and
    ``free_min`` are the GPU's free memory (all processes). ``error`` is the exception's type
    name and ``error_message`` its message (shortened); the exception itself is not kept.

    Every "before" and "after" is read between cells (see the module's docstring), except in a
    span: ``span_start`` is ``None`` for a record of this cell alone, else the execution count
    of the first cell of a run of cells that had no reading between them (NVML was too slow
    to read at the boundary). Then the NVML and host figures (``gpu_self_*``, ``free_*``,
    ``host_rss_*``, ``live_array_*``) are the span's: "before" is read before its first cell,
    and the earlier cells' "after" is ``None``; JAX's ``jax_in_use_*`` stay the cell's own.

    ``live_array_bytes_before``/``_after`` are only figures walked at that boundary (walking
    ``jax.live_arrays()`` costs time per array, so it is done there only while it is cheap);
    otherwise they are ``None`` and ``live_array_bytes_seen`` is the latest walk's total at
    the cell's end, taken at ``live_array_seen_at`` (``time.time()``): never the cell's.
    """

    execution_count: int | None
    first_line: str
    started_at: float
    duration_s: float | None
    success: bool | None
    error: str | None
    oom: bool
    gpu_count: int
    gpu_self_before: int | None
    gpu_self_peak: int | None
    gpu_self_after: int | None
    jax_in_use_before: int | None
    jax_in_use_peak: int | None
    jax_in_use_after: int | None
    peak_exact: bool
    free_at_start: int | None
    free_min: int | None
    host_rss_before: int | None
    host_rss_peak: int | None
    host_rss_after: int | None
    live_array_bytes_before: int | None
    live_array_bytes_after: int | None
    error_message: str | None = None
    gpu_after_delay_s: float | None = None
    notes: tuple[str, ...] = ()
    span_start: int | None = None
    live_array_bytes_seen: int | None = None
    live_array_seen_at: float | None = None

    @property
    def gpu_self_retained(self) -> int | None:
        """Bytes this process held on the GPU after the cell minus before (may be negative)."""
        return difference(self.gpu_self_after, self.gpu_self_before)

    @property
    def jax_retained(self) -> int | None:
        """JAX's bytes in use after the cell minus before (may be negative)."""
        return difference(self.jax_in_use_after, self.jax_in_use_before)

    @property
    def host_rss_retained(self) -> int | None:
        """Host resident memory after the cell minus before (may be negative)."""
        return difference(self.host_rss_after, self.host_rss_before)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly dict of every field plus the ``*_retained`` values."""
        data = asdict(self)
        data["notes"] = list(self.notes)
        data["gpu_self_retained"] = self.gpu_self_retained
        data["jax_retained"] = self.jax_retained
        data["host_rss_retained"] = self.host_rss_retained
        return data


class _Cell:
    """One cell while its record forms. The after reading arrives on the sampler's thread.

    Attributes a cell only sometimes gets are class-level defaults, and the hook that opens
    it sets the others itself (no ``__init__``: a call less per cell): ``execution_count``,
    ``source``, ``started_at`` and ``started_mono``.
    """

    quick_before: Any = None
    before: Any = None
    ended_mono: float | None = None
    ended_at: float | None = None
    success: bool | None = None
    error: str | None = None
    error_message: str | None = None
    oom = False
    quick_after: Any = None
    peaks: Any = None
    after: Any = None
    after_started: float | None = None
    # "none" (no sampler to ask), "waiting", "claimed" (the next cell's start reads it),
    # "taken", "missed" or "spanned" (the next cell started and nothing could be read).
    after_state = "none"
    previous_ended_at: float | None = None  # time.time() the cell before this one ended
    span_from: _Cell | None = None  # the first cell of this cell's span, if in one
    # The sampler's count of samples at both ends: equal when none came while it ran.
    samples_at_start = 0
    samples_at_end = 0
    execution_count: int | None = None
    source = ""  # its first line is found when the record is built
    started_at = 0.0
    started_mono = 0.0


class Ledger:
    """Keeps a :class:`CellRecord` per executed cell, the last ``max_records`` of them.

    *sampler* may be ``None``: records then hold timings and outcomes only. The cell hooks
    are called from one thread (IPython's main thread); after-cell readings arrive from the
    sampler's thread, and records may be read from any thread.
    """

    def __init__(
        self,
        sampler: Any = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        max_records: int = 10_000,
    ):
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        self._sampler = sampler
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._records: deque[CellRecord | _Cell] = deque(maxlen=max_records)
        self._open: _Cell | None = None
        self.finished = 0  # cells recorded since the ledger was made (grows past max_records)
        self._ended_unrecorded_at: float | None = None
        self.last_error: str | None = None
        # Cells whose reading after them has not come, oldest first: while the sampler's
        # thread serves, a cell's end only queues itself here (no call), and the thread,
        # which asks _has_unread at every wake and tick, hands each one its reading.
        self._unread: deque[_Cell] = deque()
        self._reads_unread = False
        if sampler is not None:
            try:
                sampler.read_after_cells(self._has_unread, self._readings_arrived)
                self._reads_unread = True
            except Exception as exc:  # a sampler without it: a request per cell
                self._remember(exc)

    @property
    def max_records(self) -> int:
        """How many records are kept; older ones are dropped first."""
        return self._records.maxlen or 0

    @property
    def cell_running(self) -> bool:
        """Whether a cell has started and not ended."""
        return self._open is not None

    @property
    def last_finished_at(self) -> float | None:
        """When (``time.time()``) the last cell ended; None before the first."""
        entry = self._records[-1] if self._records else None
        if entry is None:
            return self._ended_unrecorded_at
        if isinstance(entry, CellRecord):
            return None if entry.duration_s is None else entry.started_at + entry.duration_s
        return entry.ended_at

    def cell_started(self, execution_count: int | None, source: str | None) -> None:
        """Open a record for a cell about to run (from ``pre_run_cell``). Never raises.

        Costs about a microsecond: two clocks, the sampler's latest sample and its count
        (attributes), and JAX's GPU counters where there are any; no lock, no system call.
        Every call spared here counts: the hooks run when IPython's own work has pushed them
        out of the processor's caches.
        """
        if self._open is not None:
            self.cell_finished(None, None)  # its end was never reported; keep what we know
        cell = _Cell()
        cell.execution_count = execution_count
        cell.source = source or ""
        try:
            cell.started_at = self._clock()
            cell.started_mono = self._monotonic()
        except Exception as exc:
            self._remember(exc)
            return
        records = self._records
        previous = records[-1] if records else None
        if type(previous) is _Cell:
            cell.previous_ended_at = previous.ended_at
            if previous.after_state != "waiting":
                previous = None
        else:  # a record built already, or none (the cell that loaded the extension)
            cell.previous_ended_at = self.last_finished_at
            previous = None
        self._open = cell
        sampler = self._sampler
        if sampler is None:
            return
        try:
            if sampler.quick_gpus:
                cell.quick_before = sampler.quick_gpu_reading()
            if previous is not None:  # back to back: its reading has not come
                cell.before = self._read_boundary(previous, cell, sampler)
                # The cell's own time begins once the boundary is read.
                cell.started_at, cell.started_mono = self._clock(), self._monotonic()
            else:
                # Between cells nothing of ours changes, so the sampler's latest sample
                # stands for "before" (it carries its own time). Before the thread's first
                # one (the cell after the extension's), one is taken here.
                before = sampler.latest_sample
                if before is None and not sampler.running:
                    before = sampler.sample_now()
                elif before is None:  # unless NVML is slow: then "before" is unknown
                    timed = sampler.boundary_reading()
                    before = timed[1] if timed is not None else None
                cell.before = before
            cell.samples_at_start = sampler.samples_taken
            sampler.busy = True
        except Exception as exc:
            self._remember(exc)

    def _read_boundary(self, previous: _Cell, cell: _Cell, sampler: Any) -> Any:
        """The reading between *previous* (still waiting for its "after") and *cell*.

        Claims *previous* under the lock, so that the sampler's thread, which may be delivering
        a reading begun before this start, cannot hand it over once this cell may have run:
        either the thread delivered first (then its reading, the latest sample, is "before"
        too) or this start reads. Returns the sample that stands for *cell*'s "before".
        """
        with self._lock:
            claimed = previous.after_state == "waiting"
            if claimed:
                previous.after_state = "claimed"
        if not claimed:
            return sampler.latest_sample
        try:
            reading = sampler.boundary_reading()
        except Exception as exc:
            self._remember(exc)
            reading = None
        with self._lock:
            if reading is None:  # too slow to read now: the two cells are one span
                previous.after_state = "spanned"
                cell.span_from = previous.span_from or previous
                before = cell.span_from.before
            else:
                began, before = reading
                previous.after, previous.after_started = before, began
                previous.after_state = "taken"
            self._arrived.notify_all()
        return before

    def cell_finished(
        self,
        success: bool | None,
        error: BaseException | None = None,
        execution_count: int | None = None,
    ) -> None:
        """Close the open record (from ``post_run_cell``). Harmless without a start; never raises.

        *error* is the exception the cell raised (before or during execution), if any; only
        its type name, message and whether it was an out-of-memory error are kept.
        *execution_count*, when given, is the cell's number as the result reports it; it wins
        over the one given at the start (IPython 9 counts the cell up before ``pre_run_cell``,
        IPython 8 after it, so only the result's number is the same in both).
        """
        cell, self._open = self._open, None
        if cell is None:  # the cell that loaded the extension: it ended, with no record
            self._ended_unrecorded_at = self._clock()
            return
        try:
            cell.ended_mono, cell.ended_at = self._monotonic(), self._clock()
            if execution_count is not None:
                cell.execution_count = execution_count
            cell.success = success
            if error is not None:
                cell.error = type(error).__name__
                cell.error_message = _message(error)
                cell.oom = jaxstats.is_resource_exhausted(error)
        except Exception as exc:
            self._remember(exc)
        sampler = self._sampler
        if sampler is not None:
            cell.after_state = "waiting"
            try:
                if sampler.quick_gpus:
                    cell.quick_after = sampler.quick_gpu_reading()
                cell.samples_at_end = sampler.samples_taken
                sampler.busy = False
            except Exception as exc:
                self._remember(exc)
        self._records.append(cell)
        self.finished += 1
        if sampler is not None:
            try:
                if self._reads_unread and sampler.serving:
                    self._unread.append(cell)
                    if cell.ended_mono >= sampler.wake_after_at:
                        sampler.wake_for_reading()
                else:  # no thread: the reading is taken now, on this thread
                    sampler.request_after(partial(self._after_arrived, cell))
            except Exception as exc:
                self._remember(exc)
                cell.after_state = "missed"

    def _has_unread(self) -> bool:
        # The sampler's thread asks; cells a start has read for are dropped here, on it.
        unread = self._unread
        while unread and unread[0].after_state != "waiting":
            unread.popleft()
        return bool(unread)

    def _readings_arrived(self, sample: Any, started: float) -> None:
        """A reading that began at monotonic *started*: it is "after" for the cells that ended.

        On the sampler's thread. Cells queue in the order they end; those that ended after the
        reading began wait for the next.
        """
        unread = self._unread
        while unread:
            cell = unread[0]
            if cell.ended_mono is not None and cell.ended_mono > started:
                break
            unread.popleft()
            self._after_arrived(cell, sample, started)

    def _after_arrived(self, cell: _Cell, sample: Any, started: float) -> None:
        """The sampler's reading after ``cell`` (its thread, or ours without a thread).

        The cell's peaks are worked out here, from the samples the sampler kept while the
        cell ran: off the cell's path, once per cell. Only a cell still waiting takes it:
        one that the next cell's start claimed has its reading from there.
        """
        peaks = self._peaks(cell)
        with self._lock:
            if cell.after_state != "waiting":
                return
            cell.after, cell.after_started, cell.after_state = sample, started, "taken"
            cell.peaks = peaks
            self._arrived.notify_all()

    def _peaks(self, cell: _Cell) -> Any:
        """Extremes of the sampler's samples from the cell's start to its end.

        Most cells are shorter than a sample interval: then no sample came while it ran
        and there is nothing to look up (this runs once per cell, on the sampler's thread).
        """
        sampler = self._sampler
        if sampler is None or cell.ended_at is None or cell.samples_at_end == cell.samples_at_start:
            return None
        try:
            during = [
                sample
                for sample in sampler.history(cell.started_at)
                # One taken at the very start is "before"; those after the end are not its.
                if cell.started_at < sample.t <= cell.ended_at
            ]
            return Peaks.of(during) if during else None
        except Exception as exc:
            self._remember(exc)
            return None

    def _built(self, index: int) -> CellRecord | None:
        with self._lock:
            entry = self._records[index]
            if isinstance(entry, CellRecord):
                return entry
            try:
                if entry.peaks is None:  # still waiting, or read at the next start
                    entry.peaks = self._peaks(entry)  # what the samples say (so far)
                record = _build_record(entry)
            except Exception as exc:
                self._remember(exc)
                return None
            if entry.after_state not in ("waiting", "claimed"):
                self._records[index] = record  # final: the samples it came from can go
            return record

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the readings that finished cells still wait for.

        For a reader about to show records (``%jaxmem cells``), never for a cell hook.
        Returns whether none is left waiting.
        """

        def settled() -> bool:
            return not any(
                isinstance(e, _Cell) and e.after_state in ("waiting", "claimed") for e in tail
            )

        with self._arrived:
            # Only the newest cells can still be waiting: their readings come in order.
            tail = [self._records[-i] for i in range(1, min(len(self._records), 8) + 1)]
            return self._arrived.wait_for(settled, timeout)

    def records(self) -> list[CellRecord]:
        """The kept records, oldest first."""
        built = (self._built(i) for i in range(len(self._records)))
        return [record for record in built if record is not None]

    def recent(self, count: int) -> list[CellRecord]:
        """The last ``count`` records, oldest first, without building the others."""
        size = len(self._records)
        built = (self._built(i) for i in range(max(0, size - count), size))
        return [record for record in built if record is not None]

    def last(self) -> CellRecord | None:
        """The most recent record, or ``None``."""
        return self._built(-1) if self._records else None

    def clear(self) -> None:
        """Forget every record (a cell now running is still recorded when it ends)."""
        with self._lock:
            self._records.clear()

    def _remember(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"


def _message(error: BaseException) -> str | None:
    try:
        text = str(error)
    except Exception:
        return None
    return _truncate(" ".join(text.split()), _ERROR_MESSAGE_CHARS) or None


def _build_record(cell: _Cell) -> CellRecord:
    before, peaks = cell.before, cell.peaks
    after = cell.after if cell.after_state == "taken" else None
    span = cell.span_from
    quick_before, quick_after = cell.quick_before, cell.quick_after
    indices = sorted(
        {g.index for sample in (before, after) if sample is not None for g in sample.gpus}
        | {g.index for g in (peaks.gpus if peaks is not None else ())}
    )
    notes = []
    if cell.after_state in ("waiting", "claimed"):
        notes.append(_AFTER_WAITING)
    elif cell.after_state == "missed":
        notes.append(_AFTER_MISSED)
    elif cell.after_state == "spanned":
        notes.append(_AFTER_SPANNED)
    if span is not None:
        notes.append(
            "figures before the cell: read before cell "
            f"[{MISSING if span.execution_count is None else span.execution_count}], "
            "the first of a span with no reading between its cells (readings were slow)"
        )
    elif before is not None and indices and cell.started_at - before.t > _STALE_BEFORE_S:
        age = format_duration(cell.started_at - before.t)
        notes.append(f"GPU figures before the cell: read {age} before it started")
    delay = None
    if after is not None and cell.after_started is not None and cell.ended_mono is not None:
        delay = max(0.0, cell.after_started - cell.ended_mono)
    jax_before = quick_before.jax_in_use() if quick_before is not None else None
    jax_after = quick_after.jax_in_use() if quick_after is not None else None
    jax_peak, exact = block_jax_peak(
        quick_before, quick_after, peaks, indices, jax_before, jax_after
    )
    host_before = before.host if before is not None else None
    host_after = after.host if after is not None else None
    began = span.previous_ended_at if span is not None else cell.previous_ended_at
    live_before = _walked_since(host_before, began)
    live_after = _walked_since(host_after, cell.ended_at)
    seen = host_after if host_after is not None else host_before
    seen_bytes = getattr(seen, "live_array_bytes", None) if live_after is None else None
    rss_before = getattr(host_before, "rss_bytes", None)
    rss_after = getattr(host_after, "rss_bytes", None)
    ended = cell.ended_mono
    return CellRecord(
        execution_count=cell.execution_count,
        first_line=_first_line(cell.source),
        started_at=cell.started_at,
        duration_s=None if ended is None else max(0.0, ended - cell.started_mono),
        success=cell.success,
        error=cell.error,
        oom=cell.oom,
        gpu_count=len(indices),
        gpu_self_before=gpu_total(before, indices, "self_bytes"),
        gpu_self_peak=peak_total(peaks, indices, "max_self_bytes", before, after, "self_bytes"),
        gpu_self_after=gpu_total(after, indices, "self_bytes"),
        jax_in_use_before=jax_before,
        jax_in_use_peak=jax_peak,
        jax_in_use_after=jax_after,
        peak_exact=exact,
        free_at_start=gpu_total(before, indices, "free_bytes"),
        free_min=peak_total(peaks, indices, "min_free_bytes", before, after, "free_bytes", min),
        host_rss_before=rss_before,
        host_rss_peak=extreme([getattr(peaks, "max_rss_bytes", None), rss_before, rss_after]),
        host_rss_after=rss_after,
        live_array_bytes_before=live_before,
        live_array_bytes_after=live_after,
        error_message=cell.error_message,
        gpu_after_delay_s=delay,
        notes=tuple(notes),
        span_start=None if span is None else span.execution_count,
        live_array_bytes_seen=seen_bytes,
        live_array_seen_at=None if seen_bytes is None else seen.live_array_at,
    )


def _walked_since(host: Any, since: float | None) -> int | None:
    """The live arrays' bytes in *host* if they were walked at or after *since*, else None.

    A sample carries the latest walk's total, which may be older than the sample: only a
    walk after a cell's boundary tells what was live at it. *since* ``None`` (no cell before
    this one): any walk in the sample is from before this cell started, so it stands.
    """
    if host is None or host.live_array_bytes is None:
        return None
    at = getattr(host, "live_array_at", None)
    if since is None or (at is not None and at >= since):
        return host.live_array_bytes
    return None


def _first_line(source: str | None) -> str:
    for line in (source or "").splitlines():
        text = line.strip()
        if text:
            return _truncate(text, _FIRST_LINE_CHARS)
    return ""


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _status(record: CellRecord) -> str:
    if record.oom:
        return "OOM"
    if record.success is None:
        return "unfinished"
    if not record.success:
        return f"error: {record.error}" if record.error else "error"
    return "ok"


def _live_arrays(record: CellRecord) -> str:
    """The live arrays after the cell, or the latest walk's total "as of" its time."""
    if record.live_array_bytes_after is not None or record.live_array_bytes_seen is None:
        return format_bytes(record.live_array_bytes_after)
    at = record.live_array_seen_at
    when = MISSING if at is None else time.strftime("%H:%M:%S", time.localtime(at))
    return f"{format_bytes(record.live_array_bytes_seen)} as of {when}"


def format_table(records: Iterable[CellRecord]) -> str:
    """Render records as a text table for ``%jaxmem cells``; unknown values show as "—".

    Shows this process's GPU memory when any record saw a GPU, else host memory (RSS).
    """
    rows_in = list(records)
    if not rows_in:
        return "No cells recorded yet."
    on_gpu = any(r.gpu_count > 0 for r in rows_in)
    if on_gpu:
        header = ["#", "cell", "duration", "status", "GPU before", "GPU peak", "GPU after",
                  "retained", "JAX peak", "free min"]  # fmt: skip
    else:
        header = ["#", "cell", "duration", "status", "RSS before", "RSS peak", "RSS after",
                  "retained", "live arrays"]  # fmt: skip
    rows = []
    for r in rows_in:
        number = MISSING if r.execution_count is None else str(r.execution_count)
        if r.span_start is not None:  # its memory figures are the span's
            number = f"{r.span_start}–{number}"
        row = [
            number,
            printable(_truncate(r.first_line, _TABLE_CELL_CHARS)),
            format_duration(r.duration_s),
            _status(r),
        ]
        if on_gpu:
            jax_peak = format_bytes(r.jax_in_use_peak)
            if r.jax_in_use_peak is not None and not r.peak_exact:
                jax_peak = "≥" + jax_peak
            row += [format_bytes(r.gpu_self_before), format_bytes(r.gpu_self_peak),
                    format_bytes(r.gpu_self_after), format_bytes_delta(r.gpu_self_retained),
                    jax_peak, format_bytes(r.free_min)]  # fmt: skip
        else:
            row += [format_bytes(r.host_rss_before), format_bytes(r.host_rss_peak),
                    format_bytes(r.host_rss_after), format_bytes_delta(r.host_rss_retained),
                    _live_arrays(r)]  # fmt: skip
        rows.append(row)
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    left_aligned = {1, 3}

    def render(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if i in left_aligned else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    lines = [render(header), "  ".join("-" * w for w in widths), *map(render, rows)]
    if on_gpu:
        lines.append("GPU = this process per NVML; peaks are sampled; ≥ = JAX peak at least this.")
    else:
        lines.append("No GPU seen: host memory of this process (RSS) instead of GPU memory.")
    if any(r.span_start is not None for r in rows_in):
        lines.append(
            "a–b = cells with no reading between them (readings were slow): memory figures "
            "for them together."
        )
    return "\n".join(lines)
