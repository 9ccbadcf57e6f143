"""A cell's record (:class:`CellRecord`), built from what its hooks and the sampler saw.

:mod:`jax_nbmem.record.ledger` keeps a ``OpenCell`` per running or recent cell and turns it into a
:class:`CellRecord` here once its "after" reading is in; see the ledger's docstring for when each
figure is read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from jax_nbmem.record.combine import block_jax_peak, difference, extreme, gpu_total, peak_total
from jax_nbmem.units import MISSING, format_duration

__all__ = ["CellRecord", "OpenCell", "build_record", "error_message_of", "truncate"]

_FIRST_LINE_CHARS = 60
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


class OpenCell:
    """One cell while the ledger forms its record; the after reading may come from the sampler.

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
    span_from: OpenCell | None = None  # the first cell of this cell's span, if in one
    # The sampler's count of samples at both ends: equal when none came while it ran.
    samples_at_start = 0
    samples_at_end = 0
    execution_count: int | None = None
    source = ""  # its first line is found when the record is built
    started_at = 0.0
    started_mono = 0.0
    record: CellRecord | None = None  # its record once final (the ledger keeps it here)


def error_message_of(error: BaseException) -> str | None:
    """The error's message on one line, shortened; None when it has none or cannot say."""
    try:
        text = str(error)
    except Exception:
        return None
    return truncate(" ".join(text.split()), _ERROR_MESSAGE_CHARS) or None


def build_record(cell: OpenCell) -> CellRecord:
    """The record of *cell* as far as it is known (its notes say what is still missing)."""
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
            return truncate(text, _FIRST_LINE_CHARS)
    return ""


def truncate(text: str, limit: int) -> str:
    """*text* cut to *limit* characters, its last one an ellipsis when it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
