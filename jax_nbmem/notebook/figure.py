"""The memory panel's figure as plain data: plotly traces and layout, in parts a view syncs.

Pure: no plotly, no widgets. :func:`build_figure` turns the sampler's points and the ledger's
cell records into a ``{"data": [...], "layout": {...}}`` dict with a fixed list of traces (see
:data:`TRACE_NAMES`), and :func:`figure_parts` splits it into the parts a live view syncs.
:class:`LiveFigure` makes the same figure again and again for a live view, keeping the history
part between builds. The live widget, the static fallback and the snapshot all draw from here,
and the benchmark measures what it produces. Times are numbers on a date axis (:func:`time_ms`).
The timeline's rows are made in :mod:`jax_nbmem.notebook.figure_rows`, the cells' traces in
:mod:`jax_nbmem.notebook.figure_cells`; the names this module exports from them stay here.

The payload stays bounded however long the session: the last ``window_s`` seconds are kept at
``window_points`` points per series, everything older at most ``history_points`` (bins whose
width doubles as the session grows); each point keeps the maximum of what it covers (so peaks
survive), and a series drawn as steps drops points that repeat the previous value. Unknown
values stay ``None`` (a gap in the line), never 0.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from jax_nbmem.gpu.mig import gpu_label
from jax_nbmem.notebook.figure_cells import (
    bar_traces,
    cell_bars_source,
    one_or_each,
    span_traces,
)
from jax_nbmem.notebook.figure_rows import (
    GPU_SERIES,
    HOST_SERIES,
    HistoryRows,
    Row,
    gpu_indices,
    reader,
    scale,
    shown_series,
    steps,
    time_ms,
    time_text,
    window_rows,
)
from jax_nbmem.notebook.figure_scale import gpu_axis, off_scale_notes
from jax_nbmem.units import format_bytes, format_gib

__all__ = [
    "TIMELINE_TRACES",
    "TRACE_NAMES",
    "FigureLimits",
    "LiveFigure",
    "build_figure",
    "cell_bars_source",
    "figure_parts",
    "gpu_indices",
    "header_text",
    "time_ms",
    "time_text",
]

_SPANS = "cells"
_SPANS_ALT = "cells (alternate shade)"
_TICKS = "cell records"
_BAR_PEAK = "cell peak"
_BAR_RETAINED = "cell retained"
TRACE_NAMES: tuple[str, ...] = (
    *(name for name, _, _ in GPU_SERIES),
    *(name for name, _, _ in HOST_SERIES),
    _SPANS,
    _SPANS_ALT,
    _TICKS,
    _BAR_PEAK,
    _BAR_RETAINED,
)

_SPAN_FILL = ("rgba(108,117,125,0.22)", "rgba(108,117,125,0.11)")  # the first shows in the legend
_MOST_BAR_LABELS = 16
_FEWEST_BAR_SLOTS = 12


@dataclass(frozen=True)
class FigureLimits:
    """How much the figure holds: this bounds every update's size.

    ``window_s`` seconds before the newest sample are drawn with ``window_points`` points per
    series, the rest of the session with at most ``history_points`` (at least half as many
    once there are more samples). The last ``max_spans`` cells are shaded on the timeline,
    the last ``max_cells`` get bars.
    """

    window_s: float = 60.0
    window_points: int = 100
    history_points: int = 60
    max_cells: int = 30
    max_spans: int = 80


def _value_range(values: Sequence[float | None], unit: str) -> list[float]:
    """An axis range that holds 0 and every known value, with a little room; never empty."""
    known = [v for v in values if v is not None]
    low, high = min([0.0, *known]), max([0.0, *known])
    if high - low <= 0:
        return [0.0, 1.0 if unit == "GiB" else 100.0]  # nothing to draw: a plain, honest axis
    pad = 0.06 * (high - low)
    return [low - pad if low < 0 else 0.0, high + pad]


def _category_ticks(labels: Sequence[str], most: int) -> dict[str, Any]:
    """Upright bar labels; with many bars only every k-th, ending at the newest."""
    step = max(1, math.ceil(len(labels) / most))
    shown = list(labels)[::-1][::step][::-1]
    return {"tickmode": "array", "tickvals": shown, "ticktext": shown, "tickangle": 0}


def build_figure(
    samples: Sequence[Any],
    records: Sequence[Any],
    gpu_index: int | None,
    *,
    title: str | None = None,
    limits: FigureLimits | None = None,
) -> dict[str, Any]:
    """The whole figure: a timeline of *gpu_index* (``None``: host memory) and cell bars.

    *samples* are the sampler's points, oldest first; *records* the ledger's cells. Every
    trace of :data:`TRACE_NAMES` is present, in that order; ``visible`` is False for those
    with nothing to show (e.g. the GPU series when no GPU is seen), so updates can target
    each trace by its index. The y unit follows the last samples of the window.
    """
    everything = list(samples)
    return LiveFigure(limits).build(lambda _since: everything, records, gpu_index, title=title)


class LiveFigure:
    """:func:`build_figure` again and again for a live view, at a cost that does not grow.

    The history part (everything more than ``window_s`` before the newest sample) is kept
    between builds: each build folds in only the samples that left the window since the
    previous one and redraws the window, which is small. The figure is the one
    :func:`build_figure` makes from the same samples. It starts over from every sample when
    the GPU shown changes, when the clock went back, or after a gap longer than the window
    (samples that old may since have been merged in the sampler's history).
    """

    def __init__(self, limits: FigureLimits | None = None) -> None:
        self.limits = limits or FigureLimits()
        self._gpu_index: int | None = None
        self._read = reader(None)
        self._history: HistoryRows | None = None
        self._newest: float | None = None
        self._window_start: float | None = None

    @property
    def window_start(self) -> float | None:
        """Where the last build's window began; ``None`` before a build with samples."""
        return self._window_start

    def build(
        self,
        history: Callable[[float | None], Sequence[Any]],
        records: Sequence[Any],
        gpu_index: int | None,
        *,
        title: str | None = None,
    ) -> dict[str, Any]:
        """The figure now, reading only the samples it has not seen yet.

        ``history(since)`` gives the samples with ``t >= since``, oldest first, or all of
        them for ``None``: :meth:`jax_nbmem.record.sampler.Sampler.history` does.
        """
        window = self._advance(history, gpu_index)
        return self._figure(window, records, title)

    def _advance(
        self, history: Callable[[float | None], Sequence[Any]], gpu_index: int | None
    ) -> Sequence[Any]:
        """Fold what left the window into the history rows; return the window's samples."""
        if self._history is not None and self._newest is not None and gpu_index == self._gpu_index:
            fresh = history(self._window_start)
            if fresh and self._newest <= fresh[-1].t <= self._newest + self.limits.window_s:
                return self._fold(fresh)
        self._gpu_index, self._read = gpu_index, reader(gpu_index)
        self._history = HistoryRows(self._read, self.limits.history_points)
        self._newest = self._window_start = None
        return self._fold(history(None))

    def _fold(self, samples: Sequence[Any]) -> Sequence[Any]:
        if not samples:
            return []
        newest = samples[-1].t
        window_start = newest - self.limits.window_s
        aged = bisect.bisect_left(samples, window_start, key=attrgetter("t"))
        try:
            for sample in samples[:aged]:
                self._history.add(sample)
        except Exception:
            self._history = None  # folded in part: the next build starts over
            raise
        self._newest, self._window_start = newest, window_start
        return samples[aged:]

    def _figure(self, window: Sequence[Any], records: Sequence[Any], title: str | None) -> dict:
        limits = self.limits
        drawn = window_rows(
            window, self._read, self._window_start, limits.window_s, limits.window_points
        )
        rows = [*self._history.rows, *drawn]
        return _assemble(rows, window[-50:], records, self._gpu_index, self.limits, title)


def _assemble(
    rows: Sequence[Row],
    recent: Sequence[Any],
    records: Sequence[Any],
    gpu_index: int | None,
    limits: FigureLimits,
    title: str | None,
) -> dict[str, Any]:
    """The figure from the timeline's *rows*.

    On a GPU the y axis is fitted to what is in use (:mod:`~jax_nbmem.notebook.figure_scale`);
    for host memory it holds every value, in the unit the *recent* samples call for.
    """
    series = shown_series(gpu_index)
    recent_from = rows[-1][0] - limits.window_s if rows else None
    names = [name for name, _, _ in series]
    axis = None if gpu_index is None else gpu_axis(rows, names, recent_from)
    unit, divisor = (axis.unit, axis.divisor) if axis else scale(recent, gpu_index)
    digits = 3 if unit == "GiB" else 1
    traces: list[dict[str, Any]] = []
    known_values: list[float] = []
    columns = {name: column for column, (name, _, _) in enumerate(series, 1)}
    for group in (GPU_SERIES, HOST_SERIES):
        for name, field, colour in group:
            column = columns.get(name)
            line = steps(rows, column, divisor, digits) if column else {"x": [], "y": []}
            known = [y for y in line["y"] if y is not None]
            known_values += known
            dash = "dot" if field in ("total_bytes", "jax_limit") else "solid"
            traces.append({
                "type": "scatter", "mode": "lines", "name": name, "visible": bool(known),
                "line": {"shape": "hv", "color": colour, "dash": dash, "width": 1.6}, **line,
                "hovertemplate": f"%{{y:.{digits}f}} {unit}<extra>{name}</extra>",
            })  # fmt: skip
    y_range = axis.range if axis else _value_range(known_values, unit)
    all_records = list(records)
    source = cell_bars_source(all_records)
    spanned = all_records[-limits.max_spans :]
    even, odd, ticks = span_traces(tuple(spanned), source)
    for name, shade, fill in ((_SPANS, even, _SPAN_FILL[0]), (_SPANS_ALT, odd, _SPAN_FILL[1])):
        traces.append({
            "type": "scatter", "mode": "lines", "name": name, "fill": "toself",
            "fillcolor": fill, "line": {"width": 0}, "hoverinfo": "skip", "yaxis": "y3",
            "legendgroup": _SPANS, "showlegend": name == _SPANS, "visible": bool(spanned),
            "x": shade["x"], "y": shade["y"],
        })  # fmt: skip
    traces.append({
        "type": "scatter", "mode": "markers", "name": _TICKS, "legendgroup": _SPANS, "yaxis": "y3",
        "showlegend": False, "visible": bool(spanned), "hoverinfo": "text",
        "marker": {
            "symbol": "triangle-down", "size": 7, "color": one_or_each(ticks["marker.color"])
        },
        "x": ticks["x"], "y": ticks["y"], "hovertext": ticks["hovertext"],
    })  # fmt: skip
    barred = all_records[-limits.max_cells :]
    peak, retained = bar_traces(tuple(barred), source, divisor, digits)
    for name, trace, offset in ((_BAR_PEAK, peak, "peak"), (_BAR_RETAINED, retained, "kept")):
        traces.append({
            "type": "bar", "name": name, "xaxis": "x2", "yaxis": "y2",
            "visible": bool(trace["x"]), "offsetgroup": offset, "hoverinfo": "text",
            "x": trace["x"], "y": trace["y"], "hovertext": trace["hovertext"],
            "marker": {"color": one_or_each(trace["marker.color"])},
        })  # fmt: skip
    measure = source[0] if source else "no measure yet"
    what = _what(recent, gpu_index)
    bars_note = (
        f"last {len(barred)} cells: peak rise and retained ({measure})"
        if barred
        else "per cell: nothing has finished yet"
    )
    layout = {
        "autosize": True,
        "height": 440,
        "margin": {"l": 60, "r": 16, "t": 58 if title else 36, "b": 36},
        "font": {"size": 11},
        "legend": {
            "orientation": "h", "x": 0, "xanchor": "left", "y": 1.0, "yanchor": "bottom",
            "font": {"size": 11},
        },
        "hovermode": "closest",
        "barmode": "group",
        "bargap": 0.25,
        "xaxis": {"type": "date", "domain": [0, 1], "anchor": "y", "automargin": True},
        "yaxis": {
            "title": {"text": f"{what}, {unit}"}, "domain": [0.38, 1], "range": y_range,
            "automargin": True,
        },
        "yaxis3": {
            "overlaying": "y", "range": [0, 1.0], "visible": False, "fixedrange": True,
        },
        "xaxis2": {
            "type": "category", "anchor": "y2", "automargin": True,
            **_category_ticks(peak["x"], _MOST_BAR_LABELS),
            # Room for a dozen bars from the start, so that one bar is not a slab.
            "range": [-0.5, max(len(peak["x"]), _FEWEST_BAR_SLOTS) - 0.5],
        },
        "yaxis2": {
            "title": {"text": unit, "font": {"size": 10}}, "domain": [0, 0.24],
            "range": _value_range(peak["y"] + retained["y"], unit), "automargin": True,
            "zeroline": True,
        },
        "annotations": [{
            "text": bars_note, "xref": "paper", "yref": "paper", "x": 0, "y": 0.255,
            "xanchor": "left", "yanchor": "bottom", "showarrow": False,
            "font": {"size": 10, "color": "#555555"},
        }],
        "uirevision": "jax_nbmem",  # keep the user's zoom and hidden traces across updates
    }  # fmt: skip
    if axis and (axis.above or axis.earlier):
        colours = {name: colour for name, _, colour in series}
        colours.update({f"{name} earlier": colour for name, _, colour in series})
        layout["annotations"] += off_scale_notes(axis, colours, layout["yaxis"]["domain"][1])
    if title:
        layout["title"] = {"text": title, "x": 0.01, "y": 0.99, "font": {"size": 13}}
    return {"data": traces, "layout": layout}


# A figure's traces: the memory series, then the cells' spans and ticks, then the bars.
TIMELINE_TRACES = len(GPU_SERIES) + len(HOST_SERIES)
_SPAN_TRACES = 3


def figure_parts(figure: dict[str, Any]) -> dict[str, Any]:
    """The figure in parts that change at different times, for a live view to sync.

    ``timeline`` (the memory series) changes with every sample; ``cells`` (spans and ticks)
    and ``bars`` when a cell ends (bars also when the unit changes); ``layout`` rarely. A
    view sends each part only when it differs from what it sent, which keeps updates small.
    """
    data = figure["data"]
    cells_end = TIMELINE_TRACES + _SPAN_TRACES
    return {
        "timeline": data[:TIMELINE_TRACES],
        "cells": data[TIMELINE_TRACES:cells_end],
        "bars": data[cells_end:],
        "layout": figure["layout"],
    }


def _what(recent: Sequence[Any], gpu_index: int | None) -> str:
    """What the timeline shows: "GPU 0", "MIG 3g.71gb instance 1 of GPU 0", or host memory."""
    if gpu_index is None:
        return "host memory (no GPU seen)"
    for sample in reversed(recent):
        gpu = sample.gpu(gpu_index)
        if gpu is not None:
            return gpu_label(gpu)
    return f"GPU {gpu_index}"


def header_text(
    sample: Any,
    gpu_index: int | None,
    mode: str | None,
    caps: Mapping[int, int] | None = None,
    reserved: bool = True,
) -> str:
    """One line: the GPU's name, the allocator mode in effect, free memory; unknowns say so.

    Free memory is written as the lab extension's status bar writes it (:func:`format_gib`):
    one figure on both. The memory the driver reserves for itself, when NVML tells it apart,
    follows (unless *reserved* is False: the widget's header leaves it to its hover text);
    then this process's MPS or HAMi cap there, if any (*caps*: bytes by GPU index).
    """
    mode_text = mode or "unknown"
    if sample is None:
        return f"No sample yet · allocator: {mode_text}"
    gpu = sample.gpu(gpu_index) if gpu_index is not None else None
    if gpu is None:
        rss = format_bytes(getattr(sample.host, "rss_bytes", None))
        return f"No GPU seen — host memory: RSS {rss} · allocator: {mode_text}"
    name = gpu.name or "name unknown"
    free = format_gib(gpu.free_bytes)
    total = format_gib(gpu.total_bytes)
    text = f"{gpu_label(gpu)}: {name} · allocator: {mode_text} · free {free} of {total}"
    held_back = getattr(gpu, "reserved_bytes", None)
    if held_back and reserved:
        text += f" · {format_bytes(held_back)} reserved by the driver"
    cap = (caps or {}).get(gpu_index)
    return f"{text} · capped at {format_bytes(cap)} for this kernel (MPS or HAMi)" if cap else text
