"""The panel's cells as plotly trace data: shaded spans and hover ticks, and per-cell bars.

Each cell is a span of the timeline (shades alternating, so neighbours stay apart) with a tick
that carries its record in a hover box; the last cells get bars of their peak rise and what
they retained, coloured by outcome, in the measure :func:`cell_bars_source` picks. The traces
are cached per tuple of records (records are frozen): a live view rebuilds the figure at every
update, the cells change only when one ends. Pure: no plotly, no widgets.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Sequence
from typing import Any

from jax_nbmem.notebook.figure_rows import time_ms, time_text
from jax_nbmem.units import format_bytes, format_bytes_delta, format_duration

__all__ = ["bar_traces", "cell_bars_source", "one_or_each", "span_traces"]

_COLOUR_OK = ("#1f77b4", "#aec7e8")  # peak, retained
_COLOUR_ERROR = ("#ff7f0e", "#ffbb78")
_COLOUR_OOM = ("#d62728", "#ff9896")
_TICK_COLOUR = "#6c757d"
_HOVER_CODE_CHARS = 48


def cell_bars_source(records: Sequence[Any]) -> tuple[str, str, str, str] | None:
    """Which measure the cell bars show: (label, before, peak, after) field names.

    JAX's own counter when the newest records have it (it sees arrays, not the preallocated
    pool), else this process's GPU memory per NVML, else host RSS; ``None`` with no records.
    """
    candidates = (
        ("JAX in use", "jax_in_use_before", "jax_in_use_peak", "jax_in_use_after"),
        ("GPU memory per NVML", "gpu_self_before", "gpu_self_peak", "gpu_self_after"),
        ("host RSS", "host_rss_before", "host_rss_peak", "host_rss_after"),
    )
    recent = list(records)[-5:]
    for candidate in candidates:
        if any(getattr(r, candidate[2], None) is not None for r in recent):
            return candidate
    return candidates[-1] if recent else None


def _difference(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def _cell_status(record: Any) -> tuple[str, tuple[str, str]]:
    if getattr(record, "oom", False):
        return "out of memory", _COLOUR_OOM
    if record.success is False:
        return f"error {record.error or ''}".strip(), _COLOUR_ERROR
    if record.success is None:
        return "unfinished", _COLOUR_ERROR
    return "ok", _COLOUR_OK


def _cell_label(record: Any) -> str:
    return f"[{record.execution_count if record.execution_count is not None else '?'}]"


def _record_text(record: Any, source: tuple[str, str, str, str] | None) -> str:
    """A cell's record for its hover box (plotly reads tags in it: the code is escaped)."""
    first_line = record.first_line or ""
    if len(first_line) > _HOVER_CODE_CHARS:
        first_line = first_line[: _HOVER_CODE_CHARS - 1] + "…"
    status, _ = _cell_status(record)
    lines = [
        f"cell {_cell_label(record)} {html.escape(first_line)}",
        f"{html.escape(status)} · {time_text(record.started_at)} · "
        f"{format_duration(record.duration_s)}",
    ]
    if source is not None:
        measure, before, peak, after = source
        values = [format_bytes(getattr(record, field)) for field in (before, peak, after)]
        lines.append(f"{measure}: before {values[0]} · peak {values[1]} · after {values[2]}")
    return "<br>".join(lines)


# A live view rebuilds the figure at every update, and the cells change only when one ends:
# their traces are kept for the records they were made from (records are frozen, hashable).
# Callers only read what these return.
@functools.lru_cache(maxsize=8)
def span_traces(records: tuple, source: tuple | None) -> tuple[dict, dict, dict]:
    """Each cell as a shaded span of the timeline, alternating shades, and its hover tick.

    Shades alternate so that neighbours stay apart however many cells a minute holds; the
    tick at the top of each span carries the cell's record (spans themselves take no hover).
    They are drawn on an axis of their own from 0 to 1 over the timeline, so that they do not
    change when the memory scale does.
    """
    top = 1
    spans: tuple[dict[str, list], dict[str, list]] = ({"x": [], "y": []}, {"x": [], "y": []})
    ticks: dict[str, list] = {"x": [], "y": [], "hovertext": [], "marker.color": []}
    for position, record in enumerate(records):
        start = time_ms(record.started_at)
        end = time_ms(record.started_at + (record.duration_s or 0.0))
        shade = spans[position % 2]
        shade["x"] += [start, start, end, end, start, None]
        shade["y"] += [0, top, top, 0, 0, None]
        _, colours = _cell_status(record)
        ticks["x"].append(start)
        ticks["y"].append(top)
        ticks["hovertext"].append(_record_text(record, source))
        ticks["marker.color"].append(_TICK_COLOUR if colours == _COLOUR_OK else colours[0])
    return spans[0], spans[1], ticks


@functools.lru_cache(maxsize=8)
def bar_traces(
    records: tuple, source: tuple | None, divisor: int, digits: int
) -> tuple[dict, dict]:
    """Per-cell peak rise and retained bytes for the last cells, coloured by outcome."""
    peak: dict[str, list] = {"x": [], "y": [], "hovertext": [], "marker.color": []}
    retained: dict[str, list] = {"x": [], "y": [], "hovertext": [], "marker.color": []}
    if source is None:
        return peak, retained
    _, before_field, peak_field, after_field = source
    for record in records:
        before = getattr(record, before_field)
        rise = _difference(getattr(record, peak_field), before)
        kept = _difference(getattr(record, after_field), before)
        status, colours = _cell_status(record)
        # Short: the cell's full record is on its tick in the timeline.
        text = (
            f"cell {_cell_label(record)} {html.escape(status)}: peak rise "
            f"{format_bytes_delta(rise)}, retained {format_bytes_delta(kept)}"
        )
        for trace, value, colour in ((peak, rise, colours[0]), (retained, kept, colours[1])):
            trace["x"].append(_cell_label(record))
            trace["y"].append(None if value is None else round(value / divisor, digits))
            trace["hovertext"].append(text)
            trace["marker.color"].append(colour)
    return peak, retained


def one_or_each(colours: list[str]) -> str | list[str]:
    """One colour for all when they agree (the usual case): a smaller update."""
    return colours[0] if colours and len(set(colours)) == 1 else colours
