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
from collections.abc import Callable
from functools import partial
from typing import Any

from jax_nbmem.gpu import jaxstats
from jax_nbmem.record.cells import CellRecord, OpenCell, build_record, error_message_of
from jax_nbmem.record.sampler import Peaks
from jax_nbmem.record.table import format_table

__all__ = ["CellRecord", "Ledger", "format_table"]

# A cell that starts less than this after the previous one ended runs back to back with it,
# and its start reads the boundary: IPython's own work between two cells of Run All takes well
# under a millisecond. A kernel's round trip (a client that sends each cell when the last one
# has answered) leaves a few milliseconds, full of the kernel's own reply; a thread woken then
# takes the GIL and a core from that reply, and pays a wake, so it cost such a cell more than
# the start's reading (docs/benchmarks.md, issue 46). A person's pace is 20 ms and more: there
# the thread reads in the pause.
_BACK_TO_BACK_S = 0.010


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
        # Readers waiting in settle(): a reading that arrives notifies only while there are
        # any (a Condition's notify is a dozen Python lines, at every back-to-back cell).
        self._settling = 0
        self._records: deque[OpenCell] = deque(maxlen=max_records)
        self._open: OpenCell | None = None
        self.finished = 0  # cells recorded since the ledger was made (grows past max_records)
        self._ended_unrecorded_at: float | None = None
        self.last_error: str | None = None
        # Cells whose reading after them has not come, oldest first: while the sampler's
        # thread serves, a cell's end only queues itself here (no call), and the thread,
        # which asks _has_unread at every wake and tick, hands each one its reading.
        self._unread: deque[OpenCell] = deque()
        self._back_to_back = False  # the last cell started right after the one before it
        # Called with each record once final (see add_closed_listener); replaced, not changed.
        self._closed_listeners: list[Callable[[CellRecord], Any]] = []
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
        entry = self._newest()
        return self._ended_unrecorded_at if entry is None else entry.ended_at

    def _newest(self) -> OpenCell | None:
        # Another thread's clear() may empty the deque between a check and an index.
        try:
            return self._records[-1]
        except IndexError:
            return None

    def cell_started(self, execution_count: int | None, source: str | None) -> None:
        """Open a record for a cell about to run (from ``pre_run_cell``). Never raises.

        Costs about a microsecond: two clocks, the sampler's latest sample and its count
        (attributes), and JAX's GPU counters where there are any; no lock, no system call.
        Every call spared here counts: the hooks run when IPython's own work has pushed them
        out of the processor's caches.
        """
        if self._open is not None:
            self.cell_finished(None, None)  # its end was never reported; keep what we know
        cell = OpenCell()
        cell.execution_count = execution_count
        cell.source = source or ""
        try:
            cell.started_at = self._clock()
            cell.started_mono = self._monotonic()
        except Exception as exc:
            self._remember(exc)
            return
        previous = self._newest()
        if previous is not None:
            cell.previous_ended_at = previous.ended_at
            ended = previous.ended_mono
            # Cells that follow one another this closely run back to back (Run All): each
            # start reads its boundary, so a cell's end need not wake the sampler's thread,
            # whose wake only takes the GIL (and, on a busy machine, the core) from the next.
            self._back_to_back = ended is not None and cell.started_mono - ended < _BACK_TO_BACK_S
            if previous.after_state != "waiting":
                previous = None
        else:  # none: the cell that loaded the extension, or the records were cleared
            cell.previous_ended_at = self._ended_unrecorded_at
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
            sampler.busy, sampler.back_to_back = True, self._back_to_back
        except Exception as exc:
            self._remember(exc)

    def _read_boundary(self, previous: OpenCell, cell: OpenCell, sampler: Any) -> Any:
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
            if self._settling:
                self._arrived.notify_all()
        if self._closed_listeners:
            self._tell_closed(previous)
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
                cell.error_message = error_message_of(error)
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
                    # Back to back (this cell started right after the one before it), the
                    # next start most likely follows as closely and reads this boundary: a
                    # woken thread would only take the GIL from it for a reading of its own.
                    # Otherwise, or if no cell follows, the thread reads (at its next tick at
                    # the latest); a start that comes first claims the reading either way.
                    if not self._back_to_back and cell.ended_mono >= sampler.wake_after_at:
                        sampler.wake_for_reading()
                else:  # no thread: the reading is taken now, on this thread
                    sampler.request_after(partial(self._after_arrived, cell))
            except Exception as exc:
                self._remember(exc)
                cell.after_state = "missed"
        if cell.after_state in ("none", "missed") and self._closed_listeners:
            self._tell_closed(cell)  # nothing more will come for it

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

    def _after_arrived(self, cell: OpenCell, sample: Any, started: float) -> None:
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
            if self._settling:
                self._arrived.notify_all()
        if self._closed_listeners:
            self._tell_closed(cell)

    def add_closed_listener(self, listener: Callable[[CellRecord], Any]) -> None:
        """Call ``listener(record)`` with each cell's record once it is final.

        Final: its "after" reading is in (or known not to come; a span's first cell then).
        That is on the sampler's thread when its reading came between the cells, and on the
        main thread at the next cell's start when that start read the boundary itself (or
        at the cell's end without a sampler thread). A listener runs on a cell's path there:
        it should only note the record (or schedule its work). Errors are swallowed (and
        kept in ``last_error``); registering one twice calls it once.
        """
        if listener not in self._closed_listeners:
            self._closed_listeners = [*self._closed_listeners, listener]

    def remove_closed_listener(self, listener: Callable[[CellRecord], Any]) -> None:
        """Stop calling ``listener``; unknown listeners are ignored."""
        self._closed_listeners = [x for x in self._closed_listeners if x != listener]

    def _tell_closed(self, cell: OpenCell) -> None:
        record = self._built(cell)
        if record is None:
            return
        for listener in self._closed_listeners:
            try:
                listener(record)
            except Exception as exc:
                self._remember(exc)

    def _peaks(self, cell: OpenCell) -> Any:
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

    def _built(self, entry: OpenCell) -> CellRecord | None:
        """*entry*'s record: built once it is final and kept on it, else built as it stands.

        The deque itself is never written here: the main thread appends to it without a lock
        (dropping the oldest), so an index found under our lock may name another cell by the
        time it is used. A final record is kept on its cell (``record``), and what it was
        built from is let go, except a span's first "before", which its later cells read.
        """
        record = entry.record
        if record is not None:
            return record
        with self._lock:
            if entry.record is not None:
                return entry.record
            try:
                if entry.peaks is None:  # still waiting, or read at the next start
                    entry.peaks = self._peaks(entry)  # what the samples say (so far)
                record = build_record(entry)
            except Exception as exc:
                self._remember(exc)
                return None
            if entry.after_state not in ("waiting", "claimed"):
                entry.record = record  # final
                entry.after = entry.peaks = entry.quick_before = entry.quick_after = None
                entry.source = ""
                if entry.after_state != "spanned":
                    entry.before = None
            return record

    def _snapshot(self) -> tuple[OpenCell, ...]:
        """The kept cells at one instant, oldest first, however the main thread appends.

        ``deque.copy()`` runs in C without letting another thread in (and under the deque's
        own lock where the GIL is off), unlike indexing the live deque cell by cell.
        """
        return tuple(self._records.copy())

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the readings that finished cells still wait for.

        For a reader about to show records (``%jaxmem cells``), never for a cell hook.
        Returns whether none is left waiting.
        """

        def settled() -> bool:
            return not any(
                isinstance(e, OpenCell) and e.after_state in ("waiting", "claimed") for e in tail
            )

        with self._arrived:
            # Only the newest cells can still be waiting: their readings come in order.
            tail = self._snapshot()[-8:]
            self._settling += 1  # under the lock: a reading that arrives now notifies
            try:
                return self._arrived.wait_for(settled, timeout)
            finally:
                self._settling -= 1

    def records(self) -> list[CellRecord]:
        """The kept records, oldest first: consecutive cells, each once, from any thread."""
        built = (self._built(entry) for entry in self._snapshot())
        return [record for record in built if record is not None]

    def recent(self, count: int) -> list[CellRecord]:
        """The last ``count`` records, oldest first, without building the others."""
        if count <= 0:
            return []
        built = (self._built(entry) for entry in self._snapshot()[-count:])
        return [record for record in built if record is not None]

    def last(self) -> CellRecord | None:
        """The most recent record, or ``None``."""
        entry = self._newest()
        return None if entry is None else self._built(entry)

    def clear(self) -> None:
        """Forget every record (a cell now running is still recorded when it ends)."""
        with self._lock:
            self._records.clear()

    def _remember(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
