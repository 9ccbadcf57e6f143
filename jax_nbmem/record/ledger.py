"""Per-cell memory records: what each cell took, held at its peak, and left behind.

The magics' ``pre_run_cell``/``post_run_cell`` callbacks call :meth:`Ledger.cell_started` and
:meth:`Ledger.cell_finished`. The ledger asks its sampler (anything with ``sample_now()``,
``track()`` and ``set_busy()``, see :mod:`jax_nbmem.record.sampler`) for a sample at each end of the
cell and for the extremes in between. Neither method raises: IPython prints a traceback after
every cell when a callback raises.

GPU fields are totals over this kernel's GPUs. With one GPU (the usual case) they are that
GPU's values; with several, each peak or minimum is the sum of per-GPU peaks or minima, which
may fall at different moments. A field is ``None`` when any of the GPUs could not say.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from jax_nbmem.gpu import jaxstats
from jax_nbmem.units import MISSING, format_bytes, format_bytes_delta, format_duration

__all__ = ["CellRecord", "Ledger", "format_table"]

_FIRST_LINE_CHARS = 60
_TABLE_CELL_CHARS = 28
# A sample this recent (seconds) stands for "before" a cell instead of taking a new one.
_FRESH_BEFORE_S = 0.5


@dataclass(frozen=True)
class CellRecord:
    """One executed cell. Byte counts are ``None`` when unknown, never a guessed 0.

    ``success`` is ``None`` for a cell whose end was never reported (another cell started
    first). ``gpu_count`` is how many GPUs the GPU fields add up (0: no GPU was seen; then
    only the ``host_*`` and ``live_array_*`` fields, which describe host memory, say anything).

    ``gpu_self_*`` is this process's memory per NVML; ``jax_in_use_*`` is JAX's allocator.
    Peaks come from the sampler's samples, so a spike shorter than its interval can be missed,
    except ``jax_in_use_peak`` when ``peak_exact``: JAX's own ``peak_bytes_in_use`` rose during
    the cell (or the backend started in it), so that new peak is the cell's peak exactly.
    ``free_at_start`` and ``free_min`` are the GPU's free memory (all processes).
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

    @property
    def gpu_self_retained(self) -> int | None:
        """Bytes this process held on the GPU after the cell minus before (may be negative)."""
        return _difference(self.gpu_self_after, self.gpu_self_before)

    @property
    def jax_retained(self) -> int | None:
        """JAX's bytes in use after the cell minus before (may be negative)."""
        return _difference(self.jax_in_use_after, self.jax_in_use_before)

    @property
    def host_rss_retained(self) -> int | None:
        """Host resident memory after the cell minus before (may be negative)."""
        return _difference(self.host_rss_after, self.host_rss_before)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly dict of every field plus the ``*_retained`` values."""
        data = asdict(self)
        data["gpu_self_retained"] = self.gpu_self_retained
        data["jax_retained"] = self.jax_retained
        data["host_rss_retained"] = self.host_rss_retained
        return data


@dataclass
class _OpenCell:
    execution_count: int | None
    first_line: str
    started_at: float
    started_mono: float
    before: Any = None
    tracker: Any = None


class _Unbuilt(NamedTuple):
    cell: _OpenCell
    ended_mono: float
    success: bool | None
    error: BaseException | None
    after: Any
    peaks: Any


class Ledger:
    """Keeps a :class:`CellRecord` per executed cell, the last ``max_records`` of them.

    *sampler* may be ``None``: records then hold timings and outcomes only. Call from one
    thread (IPython's callbacks all run on the main thread).
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
        self._records: deque[CellRecord | _Unbuilt] = deque(maxlen=max_records)
        self._open: _OpenCell | None = None
        self.last_error: str | None = None

    @property
    def max_records(self) -> int:
        """How many records are kept; older ones are dropped first."""
        return self._records.maxlen or 0

    def cell_started(self, execution_count: int | None, source: str | None) -> None:
        """Open a record for a cell about to run (from ``pre_run_cell``). Never raises."""
        if self._open is not None:
            self.cell_finished(None, None)  # its end was never reported; keep what we know
        try:
            self._open = _OpenCell(
                execution_count, _first_line(source), self._clock(), self._monotonic()
            )
        except Exception as exc:
            self._remember(exc)
            return
        self._call_sampler("set_busy", True)
        self._open.tracker = self._call_sampler("track")
        # Between cells nothing of ours changes, so a sample taken since the last cell ended is
        # as good as a new one, and costs nothing on the cell's critical path.
        before = self._call_sampler("recent", _FRESH_BEFORE_S)
        self._open.before = before if before is not None else self._call_sampler("sample_now")

    def cell_finished(
        self,
        success: bool | None,
        error: BaseException | None = None,
        execution_count: int | None = None,
    ) -> None:
        """Close the open record (from ``post_run_cell``). Harmless without a start; never raises.

        *error* is the exception the cell raised (before or during execution), if any.
        *execution_count*, when given, is the cell's number as the result reports it; it wins
        over the one given at the start (IPython 9 counts the cell up before ``pre_run_cell``,
        IPython 8 after it, so only the result's number is the same in both).
        """
        cell, self._open = self._open, None
        if cell is None:
            return
        if execution_count is not None:
            cell.execution_count = execution_count
        after = self._call_sampler("sample_now")
        peaks = None
        if cell.tracker is not None:
            try:
                peaks = cell.tracker.close()
            except Exception as exc:
                self._remember(exc)
        self._call_sampler("set_busy", False)
        # Built when first read: most records are never looked at one by one.
        self._records.append(_Unbuilt(cell, self._monotonic(), success, error, after, peaks))

    def _built(self, index: int) -> CellRecord | None:
        entry = self._records[index]
        if isinstance(entry, _Unbuilt):
            try:
                entry = _build_record(*entry)
            except Exception as exc:
                self._remember(exc)
                return None
            self._records[index] = entry
        return entry

    def records(self) -> list[CellRecord]:
        """The kept records, oldest first."""
        built = (self._built(i) for i in range(len(self._records)))
        return [record for record in built if record is not None]

    def last(self) -> CellRecord | None:
        """The most recent record, or ``None``."""
        return self._built(-1) if self._records else None

    def clear(self) -> None:
        """Forget every record (a cell now running is still recorded when it ends)."""
        self._records.clear()

    def _call_sampler(self, method: str, *args: Any) -> Any:
        if self._sampler is None:
            return None
        try:
            return getattr(self._sampler, method)(*args)
        except Exception as exc:
            self._remember(exc)
            return None

    def _remember(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"


def _build_record(
    cell: _OpenCell,
    now_mono: float,
    success: bool | None,
    error: BaseException | None,
    after: Any,
    peaks: Any,
) -> CellRecord:
    before = cell.before
    indices = sorted(
        {g.index for sample in (before, after) if sample is not None for g in sample.gpus}
        | {g.index for g in (peaks.gpus if peaks is not None else ())}
    )
    jax_peaks = [_jax_peak(index, before, after, peaks) for index in indices]
    host_before = before.host if before is not None else None
    host_after = after.host if after is not None else None
    return CellRecord(
        execution_count=cell.execution_count,
        first_line=cell.first_line,
        started_at=cell.started_at,
        duration_s=max(0.0, now_mono - cell.started_mono),
        success=success,
        error=type(error).__name__ if error is not None else None,
        oom=jaxstats.is_resource_exhausted(error),
        gpu_count=len(indices),
        gpu_self_before=_total(before, indices, "self_bytes"),
        gpu_self_peak=_peak_total(peaks, indices, "max_self_bytes", before, after, "self_bytes"),
        gpu_self_after=_total(after, indices, "self_bytes"),
        jax_in_use_before=_total(before, indices, "jax_in_use"),
        jax_in_use_peak=_sum([value for value, _ in jax_peaks]) if indices else None,
        jax_in_use_after=_total(after, indices, "jax_in_use"),
        peak_exact=bool(jax_peaks) and all(exact for _, exact in jax_peaks),
        free_at_start=_total(before, indices, "free_bytes"),
        free_min=_peak_total(peaks, indices, "min_free_bytes", before, after, "free_bytes", min),
        host_rss_before=getattr(host_before, "rss_bytes", None),
        host_rss_peak=_host_peak(peaks, host_before, host_after),
        host_rss_after=getattr(host_after, "rss_bytes", None),
        live_array_bytes_before=getattr(host_before, "live_array_bytes", None),
        live_array_bytes_after=getattr(host_after, "live_array_bytes", None),
    )


def _jax_peak(index: int, before: Any, after: Any, peaks: Any) -> tuple[int | None, bool]:
    """This GPU's JAX peak during the cell and whether it is exact (see CellRecord)."""
    peak_before = _gpu_field(before, index, "jax_peak")
    peak_after = _gpu_field(after, index, "jax_peak")
    if peak_after is not None and (peak_before is None or peak_after > peak_before):
        return peak_after, True
    sampled = _gpu_field(peaks, index, "max_jax_in_use")
    if sampled is None:
        sampled = _extreme(
            [_gpu_field(before, index, "jax_in_use"), _gpu_field(after, index, "jax_in_use")]
        )
    return sampled, False


def _gpu_field(holder: Any, index: int, name: str) -> int | None:
    if holder is None:
        return None
    gpu = holder.gpu(index)
    return getattr(gpu, name, None) if gpu is not None else None


def _total(sample: Any, indices: list[int], name: str) -> int | None:
    if sample is None or not indices:
        return None
    return _sum([_gpu_field(sample, index, name) for index in indices])


def _peak_total(
    peaks: Any,
    indices: list[int],
    peak_name: str,
    before: Any,
    after: Any,
    sample_name: str,
    choose: Callable[[Iterable[int]], int] = max,
) -> int | None:
    """Sum over GPUs of the tracked extreme, or of the before/after extreme without a tracker."""
    if not indices:
        return None
    values = []
    for index in indices:
        value = _gpu_field(peaks, index, peak_name)
        if value is None:
            ends = [_gpu_field(before, index, sample_name), _gpu_field(after, index, sample_name)]
            value = _extreme(ends, choose)
        values.append(value)
    return _sum(values)


def _host_peak(peaks: Any, host_before: Any, host_after: Any) -> int | None:
    tracked = getattr(peaks, "max_rss_bytes", None)
    if tracked is not None:
        return tracked
    ends = [getattr(host_before, "rss_bytes", None), getattr(host_after, "rss_bytes", None)]
    return _extreme(ends)


def _extreme(values: list[int | None], choose: Callable[[Iterable[int]], int] = max) -> int | None:
    known = [v for v in values if v is not None]
    return choose(known) if known else None


def _sum(values: list[int | None]) -> int | None:
    return None if not values or None in values else sum(values)  # type: ignore[arg-type]


def _difference(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


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
        row = [
            MISSING if r.execution_count is None else str(r.execution_count),
            _truncate(r.first_line, _TABLE_CELL_CHARS),
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
                    format_bytes(r.live_array_bytes_after)]  # fmt: skip
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
    return "\n".join(lines)
