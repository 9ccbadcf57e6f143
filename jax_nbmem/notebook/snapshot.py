"""The panel's picture as a self-contained SVG, for places where no widget runs.

An exported notebook (``nbconvert --to html``), one reopened without its kernel, a frontend
that cannot draw our widget: all they keep of the panel is an output's static data. This draws
the same figure the live plot draws (:func:`jax_nbmem.notebook.figure.build_figure`'s dict:
step lines, shaded cell spans, per-cell bars) as plain SVG: no script, no network, a few tens
of kilobytes. :func:`picture_bundle` gives it as an image output, SVG and a PNG of the same
drawing (:mod:`.snapshot_png`): each viewer takes the richest one it shows, and one that
sanitises markup (nbconvert's sanitiser, an untrusted notebook in JupyterLab) the PNG.
"""

from __future__ import annotations

import base64
import html
import math
import time
from collections.abc import Sequence
from typing import Any

from jax_nbmem.notebook.snapshot_png import svg_to_png

__all__ = ["figure_svg", "picture_bundle"]

_WIDTH, _HEIGHT = 960, 440
_LEFT, _RIGHT, _TOP, _BOTTOM = 62, 16, 40, 30
_FONT = "font-family:sans-serif;font-size:11px"
_GRID = "#e5e5e5"
_AXIS_TEXT = "#444444"


def _nice_ticks(low: float, high: float, most: int = 5) -> list[float]:
    """Round tick values between *low* and *high* (1, 2 or 5 times a power of ten apart)."""
    if not high > low:
        return [low]
    raw = (high - low) / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step) * step
    count = int((high - first) / step + 1e-9) + 1
    return [round(first + i * step, 10) for i in range(count)]


def _time_ticks(start_ms: float, end_ms: float, most: int = 7) -> list[float]:
    steps_s = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200)
    span_s = max(1e-3, (end_ms - start_ms) / 1000)
    step = next((s for s in steps_s if span_s / s <= most), 86400) * 1000
    first = math.ceil(start_ms / step) * step
    return [first + i * step for i in range(int((end_ms - first) / step) + 1)]


def _clock(ms: float) -> str:
    # The figure's numbers are local wall-clock times written as if they were UTC.
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000))


def _number(value: float) -> str:
    return f"{value:g}" if abs(value) >= 0.01 or value == 0 else f"{value:.2g}"


class _Area:
    """A plotting rectangle with linear x and y scales."""

    def __init__(self, left, top, width, height, x_range, y_range):
        self.left, self.top, self.width, self.height = left, top, width, height
        self.x0, self.x1 = x_range
        self.y0, self.y1 = y_range

    def x(self, value: float) -> float:
        span = (self.x1 - self.x0) or 1
        return round(self.left + (value - self.x0) / span * self.width, 1)

    def y(self, value: float) -> float:
        span = (self.y1 - self.y0) or 1
        return round(self.top + self.height - (value - self.y0) / span * self.height, 1)


def _step_path(area: _Area, xs: Sequence, ys: Sequence) -> str:
    """An SVG path of a step line (plotly's ``hv``); ``None`` breaks the line.

    A value outside the area is drawn at its edge (the figure marks series above its axis).
    """
    parts, drawing, last_y = [], False, None
    bottom = area.top + area.height
    for x, y in zip(xs, ys, strict=False):
        if x is None or y is None:
            drawing = False
            continue
        px, py = area.x(x), min(max(area.y(y), area.top), bottom)
        if not drawing:
            parts.append(f"M{px},{py}")
            drawing = True
        else:
            parts.append(f"H{px}V{py}" if py != last_y else f"H{px}")
        last_y = py
    return "".join(parts)


def _polygons(area: _Area, xs: Sequence, ys: Sequence) -> str:
    """Closed polygons (plotly's ``fill: toself``), separated by ``None``."""
    parts, first = [], True
    for x, y in zip(xs, ys, strict=False):
        if x is None or y is None:
            if not first:
                parts.append("Z")
            first = True
            continue
        parts.append(f"{'M' if first else 'L'}{area.x(x)},{area.y(y)}")
        first = False
    return "".join(parts)


def _colour_at(colour: Any, index: int, default: str) -> str:
    if isinstance(colour, list):
        return colour[index] if index < len(colour) and colour[index] else default
    return colour or default


def figure_svg(figure: dict[str, Any], width: int = _WIDTH, height: int = _HEIGHT) -> str:
    """An SVG drawing of *figure* (the panel's figure dict), ``width`` × ``height`` pixels."""
    layout = figure.get("layout", {})
    traces = [t for t in figure.get("data", []) if t.get("visible", True)]
    lines = [t for t in traces if t.get("type") == "scatter" and t.get("yaxis", "y") == "y"]
    cells = [t for t in traces if t.get("yaxis") == "y3"]
    bars = [t for t in traces if t.get("type") == "bar"]
    plot_width = width - _LEFT - _RIGHT
    plot_height = height - _TOP - _BOTTOM
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" style="{_FONT};background:#fff;max-width:100%">'
    ]
    xs = [x for t in lines + cells for x in t.get("x", []) if x is not None]
    if not xs:
        out.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#666">'
            "no readings yet</text></svg>"
        )
        return "".join(out)
    x_range = (min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1000)
    y_axis = layout.get("yaxis", {})
    domain = y_axis.get("domain", [0.38, 1])
    timeline = _Area(
        _LEFT,
        _TOP + (1 - domain[1]) * plot_height,
        plot_width,
        (domain[1] - domain[0]) * plot_height,
        x_range,
        y_axis.get("range", [0, 1]),
    )
    spans = _Area(timeline.left, timeline.top, timeline.width, timeline.height, x_range, (0, 1))
    out += _y_axis(timeline, y_axis)
    for tick in _time_ticks(*x_range):
        px = timeline.x(tick)
        bottom = timeline.top + timeline.height
        out.append(
            f'<line x1="{px}" x2="{px}" y1="{timeline.top}" y2="{bottom}" stroke="{_GRID}"/>'
        )
        out.append(
            f'<text x="{px}" y="{bottom + 13}" text-anchor="middle" '
            f'fill="{_AXIS_TEXT}">{_clock(tick)}</text>'
        )
    for trace in cells:
        if trace.get("fill") == "toself":
            path = _polygons(spans, trace.get("x", []), trace.get("y", []))
            out.append(f'<path d="{path}" style="fill:{trace.get("fillcolor", "#eee")}"/>')
        else:
            colour = trace.get("marker", {}).get("color")
            for i, (x, y) in enumerate(zip(trace.get("x", []), trace.get("y", []), strict=False)):
                px, py = spans.x(x), spans.y(y)
                fill = _colour_at(colour, i, "#6c757d")
                out.append(f'<path d="M{px - 4},{py}L{px + 4},{py}L{px},{py + 6}Z" fill="{fill}"/>')
    for trace in lines:
        line = trace.get("line", {})
        dash = ' stroke-dasharray="2,3"' if line.get("dash") == "dot" else ""
        path = _step_path(timeline, trace.get("x", []), trace.get("y", []))
        out.append(
            f'<path d="{path}" fill="none" stroke="{line.get("color", "#333")}" '
            f'stroke-width="{line.get("width", 1.5)}"{dash}/>'
        )
    for line, note in enumerate(layout.get("annotations", [])[1:]):  # series above the axis
        colour = html.escape(str(note.get("font", {}).get("color", _AXIS_TEXT)))
        out.append(
            f'<text x="{timeline.left + timeline.width - 4}" y="{timeline.top + 12 + 13 * line}" '
            f'text-anchor="end" fill="{colour}">{html.escape(str(note.get("text", "")))}</text>'
        )
    out += _bars(layout, bars, plot_width, plot_height)
    out += _legend(lines + cells[:1] + bars, width)
    out.append("</svg>")
    return "".join(out)


def _y_axis(area: _Area, axis: dict[str, Any]) -> list[str]:
    out = []
    for tick in _nice_ticks(area.y0, area.y1):
        py = area.y(tick)
        out.append(
            f'<line x1="{area.left}" x2="{area.left + area.width}" y1="{py}" y2="{py}" '
            f'stroke="{_GRID}"/>'
        )
        out.append(
            f'<text x="{area.left - 5}" y="{py + 4}" text-anchor="end" '
            f'fill="{_AXIS_TEXT}">{_number(tick)}</text>'
        )
    title = html.escape(str(axis.get("title", {}).get("text", "")))
    middle = area.top + area.height / 2
    out.append(
        f'<text x="14" y="{middle}" text-anchor="middle" fill="{_AXIS_TEXT}" '
        f'transform="rotate(-90 14 {middle})">{title}</text>'
    )
    return out


def _bars(layout: dict[str, Any], bars: list[dict], plot_width: float, plot_height: float):
    axis = layout.get("yaxis2", {})
    domain = axis.get("domain", [0, 0.24])
    labels = list(dict.fromkeys(x for t in bars for x in t.get("x", [])))
    area = _Area(
        _LEFT,
        _TOP + (1 - domain[1]) * plot_height,
        plot_width,
        (domain[1] - domain[0]) * plot_height,
        (0, max(1, len(labels))),
        axis.get("range", [0, 1]),
    )
    out = _y_axis(area, axis)
    note = layout.get("annotations", [{}])[0].get("text", "")
    out.append(f'<text x="{_LEFT}" y="{area.top - 4}" fill="#555">{html.escape(note)}</text>')
    if not labels:
        return out
    zero = area.y(0)
    slot = area.width / len(labels)
    width = slot * 0.75 / max(1, len(bars))
    shown_labels = set(layout.get("xaxis2", {}).get("tickvals", labels))
    for group, label in enumerate(labels):
        if label in shown_labels:
            px, py = area.left + (group + 0.5) * slot, area.top + area.height + 13
            out.append(
                f'<text x="{px}" y="{py}" text-anchor="middle" fill="{_AXIS_TEXT}">'
                f"{html.escape(label)}</text>"
            )
    for offset, trace in enumerate(bars):
        colour = trace.get("marker", {}).get("color")
        pairs = zip(trace.get("x", []), trace.get("y", []), strict=False)
        for i, (label, value) in enumerate(pairs):
            if value is None:
                continue
            left = area.left + labels.index(label) * slot + slot * 0.125 + offset * width
            top, bottom = sorted((area.y(value), zero))
            out.append(
                f'<rect x="{round(left, 1)}" y="{top}" width="{round(width, 1)}" '
                f'height="{round(max(bottom - top, 0.5), 1)}" '
                f'fill="{_colour_at(colour, i, "#1f77b4")}"/>'
            )
    return out


def _legend(traces: list[dict], width: int) -> list[str]:
    out, x, y = [], _LEFT, 14
    for trace in traces:
        if trace.get("showlegend") is False:
            continue
        name = html.escape(str(trace.get("name", "")))
        colour = (
            trace.get("fillcolor")
            or _colour_at(trace.get("marker", {}).get("color"), 0, "")
            or trace.get("line", {}).get("color", "#333")
        )
        is_line = trace.get("mode") == "lines" and not trace.get("fill")
        if trace.get("type") == "scatter" and is_line:
            colour = trace.get("line", {}).get("color", "#333")
            out.append(
                f'<line x1="{x}" x2="{x + 18}" y1="{y}" y2="{y}" stroke="{colour}" '
                'stroke-width="2"/>'
            )
        else:
            out.append(f'<rect x="{x}" y="{y - 5}" width="18" height="10" style="fill:{colour}"/>')
        out.append(f'<text x="{x + 22}" y="{y + 4}" fill="#222">{name}</text>')
        x += 22 + 6.2 * len(name) + 14
        if x > width - 120:
            x, y = _LEFT, y + 14
    return out


def picture_bundle(figure: dict[str, Any] | None) -> dict[str, str]:
    """*figure* as an image output's bundle: SVG, PNG (when Pillow draws it) and a line of text."""
    if figure is None:
        return {"text/plain": "(jax_nbmem: no picture of the panel yet)"}
    svg = figure_svg(figure)
    bundle = {"text/plain": "(jax_nbmem: a picture of the panel)", "image/svg+xml": svg}
    png = svg_to_png(svg)
    if png is not None:
        bundle["image/png"] = base64.b64encode(png).decode("ascii")
    else:
        bundle["text/plain"] = "(jax_nbmem: a picture of the panel; no PNG without Pillow)"
    return bundle
