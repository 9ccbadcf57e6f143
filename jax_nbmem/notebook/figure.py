"""The memory panel's figure as plain data: plotly traces and layout, in parts a view syncs.

Pure: no plotly, no widgets. :func:`build_figure` turns the sampler's points and the ledger's
cell records into a ``{"data": [...], "layout": {...}}`` dict with a fixed list of traces (see
:data:`TRACE_NAMES`), and :func:`figure_parts` splits it into the parts a live view syncs.
:class:`LiveFigure` makes the same figure again and again for a live view, keeping the history
part between builds. The live widget, the static fallback and the snapshot all draw from here,
and the benchmark measures what it produces. Times are numbers on a date axis (:func:`time_ms`).

The payload stays bounded however long the session: the last ``window_s`` seconds are kept at
``window_points`` points per series, everything older at most ``history_points`` (bins whose
width doubles as the session grows); each point keeps the maximum of what it covers (so peaks
survive), and a series drawn as steps drops points that repeat the previous value. Unknown
values stay ``None`` (a gap in the line), never 0.
"""

from __future__ import annotations

import bisect
import functools
import html
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from jax_nbmem.units import format_bytes, format_bytes_delta, format_duration

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

MIB = 1024**2
GIB = 1024**3

# Timeline series: (trace name, how to read it from a GpuSample or HostSample, colour).
_GPU_SERIES: tuple[tuple[str, str, str], ...] = (
    ("this kernel", "self_bytes", "#1f77b4"),
    ("JAX in use", "jax_in_use", "#2ca02c"),
    ("JAX pool", "jax_reserved", "#98df8a"),
    ("JAX limit", "jax_limit", "#bcbd22"),
    ("other processes", "others_bytes", "#d62728"),
    ("device total", "total_bytes", "#7f7f7f"),
)
_HOST_SERIES: tuple[tuple[str, str, str], ...] = (
    ("process RSS", "rss_bytes", "#9467bd"),
    ("JAX live arrays", "live_array_bytes", "#17becf"),
)
_SPANS = "cells"
_SPANS_ALT = "cells (alternate shade)"
_TICKS = "cell records"
_BAR_PEAK = "cell peak"
_BAR_RETAINED = "cell retained"
TRACE_NAMES: tuple[str, ...] = (
    *(name for name, _, _ in _GPU_SERIES),
    *(name for name, _, _ in _HOST_SERIES),
    _SPANS,
    _SPANS_ALT,
    _TICKS,
    _BAR_PEAK,
    _BAR_RETAINED,
)

# The history's bins are this wide times a power of two, counted from the epoch.
_GRID_S = 0.1

_COLOUR_OK = ("#1f77b4", "#aec7e8")  # peak, retained
_COLOUR_ERROR = ("#ff7f0e", "#ffbb78")
_COLOUR_OOM = ("#d62728", "#ff9896")
_TICK_COLOUR = "#6c757d"
_SPAN_FILL = ("rgba(108,117,125,0.22)", "rgba(108,117,125,0.11)")  # the first shows in the legend
_HOVER_CODE_CHARS = 48
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


def gpu_indices(samples: Sequence[Any]) -> list[int]:
    """NVML indices of every GPU seen in *samples*, sorted; empty when no GPU was seen."""
    return sorted({gpu.index for sample in samples for gpu in sample.gpus})


def _scale(samples: Sequence[Any], gpu_index: int | None) -> tuple[str, int]:
    """The unit for the y axis: GiB for memory sizes of GPUs and big hosts, else MiB."""
    largest = 0
    for sample in samples:
        if gpu_index is None:
            values = [getattr(sample.host, "rss_bytes", None)]
        else:
            gpu = sample.gpu(gpu_index)
            values = [gpu.total_bytes, gpu.used_bytes] if gpu is not None else []
        largest = max([largest, *(v for v in values if v is not None)])
    return ("GiB", GIB) if largest >= 2 * GIB else ("MiB", MIB)


def _shown_series(gpu_index: int | None) -> tuple[tuple[str, str, str], ...]:
    return _HOST_SERIES if gpu_index is None else _GPU_SERIES


def _reader(gpu_index: int | None) -> Callable[[Any], tuple[int | None, ...]]:
    """Every shown series' value in one sample, in the order of :func:`_shown_series`."""
    read_fields = attrgetter(*(field for _, field, _ in _shown_series(gpu_index)))
    unknown = (None,) * len(_shown_series(gpu_index))
    if gpu_index is None:
        return lambda sample: unknown if sample.host is None else read_fields(sample.host)

    def read(sample: Any) -> tuple[int | None, ...]:
        for gpu in sample.gpus:
            if gpu.index == gpu_index:
                return read_fields(gpu)
        return unknown

    return read


# A timeline row: [time, value of each shown series]; a binned row holds the first time and
# each series' largest known value in its bin (unknown only when no sample in it knew).
_Row = list


def _absorb(row: _Row, values: Sequence[int | None]) -> None:
    for column, value in enumerate(values, 1):
        if value is not None and (row[column] is None or value > row[column]):
            row[column] = value


def _window_rows(
    samples: Sequence[Any], read: Callable[[Any], tuple], start: float, limits: FigureLimits
) -> list[_Row]:
    """The last ``window_s``: as sampled, or one row per ``window_s / window_points`` bin."""
    if len(samples) <= limits.window_points:  # few enough to draw as they are
        return [[sample.t, *read(sample)] for sample in samples]
    width = limits.window_s / limits.window_points
    rows: list[_Row] = []
    current_bin = None
    for sample in samples:
        key = math.floor((sample.t - start) / width)
        if key != current_bin:
            rows.append([sample.t, *read(sample)])
            current_bin = key
        else:
            _absorb(rows[-1], read(sample))
    return rows


class _HistoryRows:
    """Everything before the window, folded one sample at a time, oldest first.

    Up to *cap* samples are kept as they are; beyond that they go into bins on a fixed grid
    (``_GRID_S * 2**k`` seconds, counted from the epoch), and *k* grows by one, merging
    neighbours, whenever the bins would exceed *cap*. The grid does not depend on when
    samples arrive, so folding them in one go or a few at a time gives the same rows.
    """

    def __init__(self, read: Callable[[Any], tuple], cap: int) -> None:
        self._read = read
        self._cap = max(1, cap)
        self._binned = False
        self._shift = 0
        self._keys: list[int] = []
        self.rows: list[_Row] = []

    def add(self, sample: Any) -> None:
        key = math.floor(sample.t / _GRID_S) >> self._shift
        if self._binned and key == self._keys[-1]:
            _absorb(self.rows[-1], self._read(sample))
            return
        self._keys.append(key)
        self.rows.append([sample.t, *self._read(sample)])
        while len(self.rows) > self._cap:
            step = 1 if self._binned else 0  # the first time: bin at the finest width
            self._binned, self._shift = True, self._shift + step
            self._merge_neighbours(step)

    def _merge_neighbours(self, step: int) -> None:
        keys: list[int] = []
        rows: list[_Row] = []
        for key, row in zip(self._keys, self.rows, strict=True):
            if keys and keys[-1] == key >> step:
                _absorb(rows[-1], row[1:])
            else:
                keys.append(key >> step)
                rows.append(row)
        self._keys, self.rows = keys, rows


def time_ms(t: float) -> int:
    """*t* (``time.time()``) as plotly's date number for this kernel's local clock, to 0.1 s.

    Plotly reads a number on a date axis as milliseconds of UTC; shifting by the local offset
    makes the axis show the kernel's wall clock, the one ``%jaxmem cells`` prints. Numbers,
    not date strings: they are a third of the size in every update. Every figure here sets
    ``xaxis.type`` to ``date`` itself, so the numbers never lose their meaning.
    """
    tenths = round(t * 10)
    return tenths * 100 + _utc_offset_ms(tenths // 9000)  # the offset, per 15 minutes


@functools.lru_cache(maxsize=64)
def _utc_offset_ms(quarter_hour: int) -> int:
    return time.localtime(quarter_hour * 900).tm_gmtoff * 1000


def time_text(t: float) -> str:
    """*t* as this kernel's clock time, ``13:45:07.3``, for hover texts."""
    whole, tenth = divmod(round(t * 10), 10)
    return time.strftime("%H:%M:%S", time.localtime(whole)) + f".{tenth}"


def _steps(rows: Sequence[_Row], column: int, divisor: int, digits: int) -> dict[str, list]:
    """Plotly x (local time) and y (in the unit) of one series, without repeated values."""
    xs: list[int] = []
    ys: list[float | None] = []
    for position, row in enumerate(rows):
        value = row[column]
        y = None if value is None else round(value / divisor, digits)
        last = position == len(rows) - 1
        if ys and y == ys[-1] and not last:
            continue
        if last and len(ys) >= 2 and y == ys[-1] == ys[-2]:
            xs[-1] = time_ms(row[0])  # a flat end: move the previous point, add none
            continue
        xs.append(time_ms(row[0]))
        ys.append(y)
    return {"x": xs, "y": ys}


def cell_bars_source(records: Sequence[Any]) -> tuple[str, str, str, str] | None:
    """Which measure the cell bars show: (label, before, peak, after) field names.

    JAX's own counter when the newest records have it (it sees arrays, not the preallocated
    pool), else this process's GPU memory per NVML, else host RSS; ``None`` with no records.
    """
    candidates = (
        ("JAX in use", "jax_in_use_before", "jax_in_use_peak", "jax_in_use_after"),
        ("GPU (NVML)", "gpu_self_before", "gpu_self_peak", "gpu_self_after"),
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
def _span_traces(records: tuple, source: tuple | None) -> tuple[dict, dict, dict]:
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
def _bar_traces(
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


def _one_or_each(colours: list[str]) -> str | list[str]:
    """One colour for all when they agree (the usual case): a smaller update."""
    return colours[0] if colours and len(set(colours)) == 1 else colours


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
        self._read = _reader(None)
        self._history: _HistoryRows | None = None
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
        self._gpu_index, self._read = gpu_index, _reader(gpu_index)
        self._history = _HistoryRows(self._read, self.limits.history_points)
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
        window_rows = _window_rows(window, self._read, self._window_start, self.limits)
        rows = [*self._history.rows, *window_rows]
        return _assemble(rows, window[-50:], records, self._gpu_index, self.limits, title)


def _assemble(
    rows: Sequence[_Row],
    recent: Sequence[Any],
    records: Sequence[Any],
    gpu_index: int | None,
    limits: FigureLimits,
    title: str | None,
) -> dict[str, Any]:
    """The figure from the timeline's *rows*; the y unit follows the *recent* samples."""
    unit, divisor = _scale(recent, gpu_index)
    digits = 3 if unit == "GiB" else 1
    traces: list[dict[str, Any]] = []
    known_values: list[float] = []
    columns = {name: column for column, (name, _, _) in enumerate(_shown_series(gpu_index), 1)}
    for group in (_GPU_SERIES, _HOST_SERIES):
        for name, field, colour in group:
            column = columns.get(name)
            line = _steps(rows, column, divisor, digits) if column else {"x": [], "y": []}
            known = [y for y in line["y"] if y is not None]
            known_values += known
            dash = "dot" if field in ("total_bytes", "jax_limit") else "solid"
            traces.append({
                "type": "scatter", "mode": "lines", "name": name, "visible": bool(known),
                "line": {"shape": "hv", "color": colour, "dash": dash, "width": 1.6}, **line,
                "hovertemplate": f"%{{y:.{digits}f}} {unit}<extra>{name}</extra>",
            })  # fmt: skip
    y_range = _value_range(known_values, unit)
    all_records = list(records)
    source = cell_bars_source(all_records)
    spanned = all_records[-limits.max_spans :]
    even, odd, ticks = _span_traces(tuple(spanned), source)
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
            "symbol": "triangle-down", "size": 7, "color": _one_or_each(ticks["marker.color"])
        },
        "x": ticks["x"], "y": ticks["y"], "hovertext": ticks["hovertext"],
    })  # fmt: skip
    barred = all_records[-limits.max_cells :]
    peak, retained = _bar_traces(tuple(barred), source, divisor, digits)
    for name, trace, offset in ((_BAR_PEAK, peak, "peak"), (_BAR_RETAINED, retained, "kept")):
        traces.append({
            "type": "bar", "name": name, "xaxis": "x2", "yaxis": "y2",
            "visible": bool(trace["x"]), "offsetgroup": offset, "hoverinfo": "text",
            "x": trace["x"], "y": trace["y"], "hovertext": trace["hovertext"],
            "marker": {"color": _one_or_each(trace["marker.color"])},
        })  # fmt: skip
    measure = source[0] if source else "no measure yet"
    what = f"GPU {gpu_index}" if gpu_index is not None else "host memory (no GPU seen)"
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
    if title:
        layout["title"] = {"text": title, "x": 0.01, "y": 0.99, "font": {"size": 13}}
    return {"data": traces, "layout": layout}


# A figure's traces: the memory series, then the cells' spans and ticks, then the bars.
TIMELINE_TRACES = len(_GPU_SERIES) + len(_HOST_SERIES)
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


def header_text(sample: Any, gpu_index: int | None, mode: str | None) -> str:
    """One line: the GPU's name, the allocator mode in effect, free memory; unknowns say so.

    The memory the driver reserves for itself, when NVML tells it apart, ends the line.
    """
    mode_text = mode or "unknown"
    if sample is None:
        return f"No sample yet · allocator: {mode_text}"
    gpu = sample.gpu(gpu_index) if gpu_index is not None else None
    if gpu is None:
        rss = format_bytes(getattr(sample.host, "rss_bytes", None))
        return f"No GPU seen — host memory: RSS {rss} · allocator: {mode_text}"
    name = gpu.name or "name unknown"
    free = format_bytes(gpu.free_bytes)
    total = format_bytes(gpu.total_bytes)
    text = f"GPU {gpu.index}: {name} · allocator: {mode_text} · free {free} of {total}"
    reserved = getattr(gpu, "reserved_bytes", None)
    return f"{text} · {format_bytes(reserved)} reserved by the driver" if reserved else text
