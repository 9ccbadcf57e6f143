"""The memory panel's figure as plain data: plotly traces and layout, and what changed since.

Pure: no plotly, no widgets. :func:`build_figure` turns the sampler's points and the ledger's
cell records into a ``{"data": [...], "layout": {...}}`` dict with a fixed list of traces (see
:data:`TRACE_NAMES`), so that a live view can update them in place; :func:`changed_traces`
says which of them differ from what was sent last. :class:`LiveFigure` makes the same figure
again and again for a live view, keeping the history part between builds. Both the live widget
and the static fallback draw from here, and the benchmark measures what it produces.

The payload stays bounded however long the session: the last ``window_s`` seconds are kept at
``window_points`` points per series, everything older at most ``history_points`` (bins whose
width doubles as the session grows); each point keeps the maximum of what it covers (so peaks
survive), and a series drawn as steps drops points that repeat the previous value. Unknown
values stay ``None`` (a gap in the line), never 0.
"""

from __future__ import annotations

import bisect
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from jax_nbmem.units import format_bytes, format_bytes_delta, format_duration

__all__ = [
    "TRACE_NAMES",
    "FigureLimits",
    "LiveFigure",
    "build_figure",
    "cell_bars_source",
    "changed_traces",
    "gpu_indices",
    "header_text",
    "time_label",
]

MIB = 1024**2
GIB = 1024**3

# Timeline series: (trace name, how to read it from a GpuSample or HostSample, colour).
_GPU_SERIES: tuple[tuple[str, str, str], ...] = (
    ("this kernel (NVML)", "self_bytes", "#1f77b4"),
    ("JAX in use", "jax_in_use", "#2ca02c"),
    ("JAX pool", "jax_reserved", "#98df8a"),
    ("JAX limit", "jax_limit", "#bcbd22"),
    ("other processes", "others_bytes", "#d62728"),
    ("device total", "total_bytes", "#7f7f7f"),
)
_HOST_SERIES: tuple[tuple[str, str, str], ...] = (
    ("process RSS (host, no GPU)", "rss_bytes", "#9467bd"),
    ("JAX live arrays (host, no GPU)", "live_array_bytes", "#17becf"),
)
_MARKERS = "cell starts"
_BAR_PEAK = "cell peak"
_BAR_RETAINED = "cell retained"
TRACE_NAMES: tuple[str, ...] = (
    *(name for name, _, _ in _GPU_SERIES),
    *(name for name, _, _ in _HOST_SERIES),
    _MARKERS,
    _BAR_PEAK,
    _BAR_RETAINED,
)

# The history's bins are this wide times a power of two, counted from the epoch.
_GRID_S = 0.1

_COLOUR_OK = ("#1f77b4", "#aec7e8")  # peak, retained
_COLOUR_ERROR = ("#ff7f0e", "#ffbb78")
_COLOUR_OOM = ("#d62728", "#ff9896")


@dataclass(frozen=True)
class FigureLimits:
    """How much the figure holds: this bounds every update's size.

    ``window_s`` seconds before the newest sample are drawn with ``window_points`` points per
    series, the rest of the session with at most ``history_points`` (at least half as many
    once there are more samples). The last ``max_cells`` cells get a bar and a marker.
    """

    window_s: float = 60.0
    window_points: int = 100
    history_points: int = 60
    max_cells: int = 30


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


def time_label(t: float) -> str:
    """Local time of *t* (``time.time()``) as plotly reads a date: ``2024-05-01 13:45:07.3``.

    Strings, not epoch numbers: every frontend's plotly types a string axis as dates by
    itself, while numbers keep their date meaning only as long as ``xaxis.type`` survives.
    """
    return _tenths_label(round(t * 10))


@functools.lru_cache(maxsize=4096)  # a live view labels mostly the same times again
def _tenths_label(tenths: int) -> str:
    whole, tenth = divmod(tenths, 10)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(whole)) + f".{tenth}"


def _steps(rows: Sequence[_Row], column: int, divisor: int, digits: int) -> dict[str, list]:
    """Plotly x (local time) and y (in the unit) of one series, without repeated values."""
    xs: list[str] = []
    ys: list[float | None] = []
    for position, row in enumerate(rows):
        value = row[column]
        y = None if value is None else round(value / divisor, digits)
        last = position == len(rows) - 1
        if ys and y == ys[-1] and not last:
            continue
        if last and len(ys) >= 2 and y == ys[-1] == ys[-2]:
            xs[-1] = time_label(row[0])  # a flat end: move the previous point, add none
            continue
        xs.append(time_label(row[0]))
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


def _cell_traces(
    records: Sequence[Any], divisor: int, digits: int, unit: str, top: float
) -> tuple[dict, dict, dict]:
    """The cell-start markers on the timeline and the per-cell peak/retained bars."""
    source = cell_bars_source(records)
    markers: dict[str, list] = {"x": [], "y": [], "hovertext": []}
    peak: dict[str, list] = {"x": [], "y": [], "hovertext": [], "marker.color": []}
    retained: dict[str, list] = {"x": [], "y": [], "hovertext": [], "marker.color": []}
    for record in records:
        label = f"[{record.execution_count if record.execution_count is not None else '?'}]"
        hover = f"cell {label} {record.first_line}"
        markers["x"] += [time_label(record.started_at)] * 2 + [None]
        markers["y"] += [0, top, None]
        markers["hovertext"] += [hover, hover, None]
        if source is None:
            continue
        _, before_field, peak_field, after_field = source
        before = getattr(record, before_field)
        rise = _difference(getattr(record, peak_field), before)
        kept = _difference(getattr(record, after_field), before)
        status, colours = _cell_status(record)
        text = (
            f"{hover}<br>{status}, {format_duration(record.duration_s)}<br>"
            f"peak {format_bytes_delta(rise)}, retained {format_bytes_delta(kept)}"
        )
        for trace, value, colour in ((peak, rise, colours[0]), (retained, kept, colours[1])):
            trace["x"].append(label)
            trace["y"].append(None if value is None else round(value / divisor, digits))
            trace["hovertext"].append(text)
            trace["marker.color"].append(colour)
    measure = source[0] if source else "—"
    peak["name"] = f"{_BAR_PEAK} ({measure}, {unit})"
    retained["name"] = f"{_BAR_RETAINED} ({measure}, {unit})"
    return markers, peak, retained


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
    top: float | None = None
    on_gpu = gpu_index is not None
    columns = {name: column for column, (name, _, _) in enumerate(_shown_series(gpu_index), 1)}
    for group in (_GPU_SERIES, _HOST_SERIES):
        for name, field, colour in group:
            column = columns.get(name)
            line = _steps(rows, column, divisor, digits) if column else {"x": [], "y": []}
            known = [y for y in line["y"] if y is not None]
            if known:
                top = max(top or 0.0, *known)
            dash = "dot" if field in ("total_bytes", "jax_limit") else "solid"
            traces.append({
                "type": "scatter", "mode": "lines", "name": name, "visible": bool(known),
                "line": {"shape": "hv", "color": colour, "dash": dash}, **line,
                "hovertemplate": f"%{{y:.{digits}f}} {unit}<extra>{name}</extra>",
            })  # fmt: skip
    shown = list(records)[-limits.max_cells :]
    markers, peak, retained = _cell_traces(shown, divisor, digits, unit, top or 1.0)
    traces.append({
        "type": "scatter", "mode": "lines", "name": _MARKERS, "visible": bool(markers["x"]),
        "line": {"color": "#555555", "width": 1, "dash": "dash"}, "hoverinfo": "text",
        "x": markers["x"], "y": markers["y"], "hovertext": markers["hovertext"],
    })  # fmt: skip
    for trace, offset in ((peak, "peak"), (retained, "retained")):
        traces.append({
            "type": "bar", "name": trace["name"], "xaxis": "x2", "yaxis": "y2",
            "visible": bool(trace["x"]), "offsetgroup": offset, "hoverinfo": "text",
            "x": trace["x"], "y": trace["y"], "hovertext": trace["hovertext"],
            "marker": {"color": trace["marker.color"]},
        })  # fmt: skip
    what = f"GPU {gpu_index}" if on_gpu else "host memory (no GPU seen)"
    layout = {
        "height": 460,
        "margin": {"l": 60, "r": 20, "t": 40 if title else 20, "b": 40},
        "legend": {"orientation": "h", "y": -0.12},
        "hovermode": "closest",
        "barmode": "group",
        "xaxis": {"type": "date", "domain": [0, 1], "anchor": "y"},
        "yaxis": {"title": {"text": f"{what}, {unit}"}, "domain": [0.42, 1], "rangemode": "tozero"},
        "xaxis2": {"type": "category", "anchor": "y2", "title": {"text": "cell"}},
        "yaxis2": {"title": {"text": f"per cell, {unit}"}, "domain": [0, 0.28]},
        "uirevision": "jax_nbmem",  # keep the user's zoom and hidden traces across updates
    }
    if title:
        layout["title"] = {"text": title, "x": 0.01, "font": {"size": 13}}
    return {"data": traces, "layout": layout}


def _trace_fields(trace: dict[str, Any]) -> dict[str, Any]:
    fields = {key: trace[key] for key in ("x", "y", "visible", "name") if key in trace}
    if "hovertext" in trace:
        fields["hovertext"] = trace["hovertext"]
    if trace.get("type") == "bar":
        fields["marker"] = {"color": trace["marker"]["color"]}
    return fields


def changed_traces(
    previous: dict[str, Any] | None, current: dict[str, Any]
) -> dict[int, dict[str, Any]]:
    """The fields (x, y, visible, marker, ...) of each trace that differ from *previous*.

    Keys are trace indices; a field is included only when its value changed. With no
    *previous* every field of every trace is included.
    """
    changes: dict[int, dict[str, Any]] = {}
    old_traces = previous["data"] if previous else []
    for index, trace in enumerate(current["data"]):
        new_fields = _trace_fields(trace)
        old_fields = _trace_fields(old_traces[index]) if index < len(old_traces) else {}
        delta = {k: v for k, v in new_fields.items() if old_fields.get(k, object()) != v}
        if delta:
            changes[index] = delta
    return changes


def header_text(sample: Any, gpu_index: int | None, mode: str | None) -> str:
    """One line: the GPU's name, the allocator mode in effect, free memory; unknowns say so."""
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
    return f"GPU {gpu.index}: {name} · allocator: {mode_text} · free {free} of {total}"
