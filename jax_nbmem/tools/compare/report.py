"""The report of ``%%jaxalloc compare``: a table with the recommendation, and a bar chart.

Plain text and a plain-dict plotly figure, read from `CompareResult` / `ModeResult` by their
attributes only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jax_nbmem.units import format_bytes, format_duration

if TYPE_CHECKING:
    from jax_nbmem.tools.compare.results import CompareResult, ModeResult

__all__ = ["compare_figure", "format_compare"]

_COLUMNS = (
    "mode",
    "result",
    "time",
    "JAX peak",
    "GPU held peak",
    "JAX pool",
    "free block / free in pool",
    "host RSS peak",
)


def _row(result: ModeResult) -> list[str]:
    block = result.largest_free_block_bytes
    free = result.jax_free_bytes
    fragmentation = (
        f"{format_bytes(block)} / {format_bytes(free)}"
        if block is not None and free is not None
        else format_bytes(None)
    )
    # A mode that was stopped would have taken longer: its time is a lower bound.
    at_least = "≥" if result.state in ("timeout", "stopped") and result.wall_s is not None else ""
    return [
        result.mode,
        result.state_text,
        at_least + format_duration(result.wall_s),
        format_bytes(result.jax_peak_bytes),
        format_bytes(result.gpu_peak_bytes),
        format_bytes(result.jax_pool_bytes),
        fragmentation,
        format_bytes(result.host_peak_rss_bytes),
    ]


def format_compare(result: CompareResult) -> str:
    """The comparison as text: a table, what was not measured, errors, the recommendation."""
    rows = [list(_COLUMNS), *(_row(mode) for mode in result.modes)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]

    def render(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    lines = [render(rows[0]), "  ".join("-" * w for w in widths), *map(render, rows[1:])]
    lines += [
        "One run per mode. time: the cell alone (JAX import left out; backend start and "
        "compilation included).",
        "GPU held: this subprocess per NVML, sampled every 50 ms. JAX pool: what its allocator "
        "holds (pool_bytes; the limit for cuda_async; none for platform). free block / free "
        "in pool: fragmentation inside that pool. host RSS: the whole subprocess.",
    ]
    lines += [f"Note: {note}." for note in result.notes]
    # Each mode's note once, naming the modes it concerns unless it concerns them all.
    modes_by_note: dict[str, list[str]] = {}
    for mode in result.modes:
        for note in mode.notes:
            modes_by_note.setdefault(note, []).append(mode.mode)
    for note, names in modes_by_note.items():
        scope = "" if len(names) == len(result.modes) else f" ({', '.join(names)})"
        lines.append(f"Note{scope}: {note}.")
    lines += _failures(result.modes)
    lines.append(result.recommendation)
    return "\n".join(lines)


def _failures(modes: Sequence[ModeResult]) -> list[str]:
    """Each distinct failure once, naming the modes that had it."""
    groups: dict[tuple, list[str]] = {}
    for mode in modes:
        if mode.state != "ok":
            detail = mode.traceback or (mode.stderr_tail.strip() if mode.state == "crashed" else "")
            key = (mode.state_text, mode.error, mode.hint, detail)
            groups.setdefault(key, []).append(mode.mode)
    lines = []
    for (state_text, error, hint, detail), names in groups.items():
        lines.append(f"{', '.join(names)}: {state_text}" + (f": {error}" if error else ""))
        if hint:
            lines.append(f"  {hint}.")
        lines += [f"  {line}" for line in detail.splitlines()[-8:]]
    return lines


def compare_figure(result: CompareResult) -> dict[str, Any]:
    """A plotly figure as plain data: time per mode on the left, memory per mode on the right.

    Memory is GPU memory (JAX peak, NVML peak held) when any mode ran on a GPU, else host RSS.
    Modes that failed keep their bars, in grey, labelled with what happened.
    """
    names = [mode.mode for mode in result.modes]
    if result.on_gpu:
        series = [
            ("JAX peak", "jax_peak_bytes", "#2ca02c"),
            ("GPU held peak (NVML)", "gpu_peak_bytes", "#1f77b4"),
        ]
    else:
        series = [("host RSS peak (no GPU)", "host_peak_rss_bytes", "#9467bd")]
    known = [getattr(m, attr) for m in result.modes for _, attr, _ in series]
    largest = max([value for value in known if value is not None], default=0)
    unit, scale = ("GiB", 1024**3) if largest >= 1024**3 else ("MiB", 1024**2)
    time_trace = {
        "type": "bar",
        "name": "time (s)",
        "x": names,
        "y": [mode.wall_s for mode in result.modes],
        "text": ["" if m.state == "ok" else m.state_text for m in result.modes],
        "hovertext": [format_duration(mode.wall_s) for mode in result.modes],
        "marker": {"color": ["#ff7f0e" if m.state == "ok" else "#bbbbbb" for m in result.modes]},
        "xaxis": "x",
        "yaxis": "y",
    }
    memory_traces = [
        {
            "type": "bar",
            "name": name,
            "x": names,
            "y": [
                None if getattr(m, attr) is None else getattr(m, attr) / scale for m in result.modes
            ],
            "hovertext": [format_bytes(getattr(m, attr)) for m in result.modes],
            "marker": {"color": color},
            "xaxis": "x2",
            "yaxis": "y2",
        }
        for name, attr, color in series
    ]
    layout = {
        "title": {"text": "%%jaxalloc compare: one run per mode"},
        "barmode": "group",
        "height": 320,
        "xaxis": {"domain": [0.0, 0.3], "title": {"text": "mode"}},
        "yaxis": {"title": {"text": "time (s)"}, "rangemode": "tozero"},
        "xaxis2": {"domain": [0.42, 1.0], "anchor": "y2", "title": {"text": "mode"}},
        "yaxis2": {"anchor": "x2", "title": {"text": unit}, "rangemode": "tozero"},
        "legend": {"orientation": "h", "y": -0.3},
    }
    return {"data": [time_trace, *memory_traces], "layout": layout}
