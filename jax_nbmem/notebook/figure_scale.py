"""The GPU timeline's y axis: fitted to what is in use, so that a notebook's memory shows.

On a 140 GiB card, a notebook's few hundred MiB is a flat line at zero when the axis runs to
the card's total, and so is it next to a neighbour's 105 GiB pool. The panel is there to show
this kernel's memory, cell by cell; the card's total and free memory are in its header, the
neighbour in its banner. So the axis holds, with 20% headroom:

* this kernel's series (NVML's figure for it, JAX's bytes in use and its pool), always;
* the other processes too, while they are at most :data:`SHARE` times this kernel's largest
  (then this kernel still fills a quarter of the axis);
* the device total, and JAX's limit, only when they fall within that.

A series above the axis is clipped at its top, as plotly clips every line, and marked: a note
at the axis' top right gives its latest value ("device total 139.7 GiB ↑"). When the other
processes shrink (a neighbour shut down), their line comes down into view, and the axis holds
its fall while that is within the recent window (``recent_from``): a line through the chart's
top with nothing to say what it was would leave the reader guessing, so the units follow what
the chart shows (GiB while 105 GiB falls to 0). Once the fall is older, the axis fits this
kernel again and a note says how high the line went ("other processes earlier 105 GiB ↑").
Before this kernel holds anything, the axis holds whatever is in use; with nothing in use, the
device total, so that an empty card looks empty. The unit follows the axis: MiB below 2 GiB.

Pure: no plotly, no widgets; :mod:`jax_nbmem.notebook.figure` assembles the figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jax_nbmem.notebook.figure_rows import GIB, MIB, Row
from jax_nbmem.units import format_bytes

__all__ = ["HEADROOM", "SHARE", "Axis", "fitted_top", "gpu_axis", "off_scale_notes"]

SHARE = 4
HEADROOM = 1.2
_OWN = ("this kernel", "JAX in use", "JAX pool")
_OTHERS = ("other processes",)
_NOTE_LINE_PX = 13


@dataclass(frozen=True)
class Axis:
    """The timeline's unit, its top in bytes, and the series above it (name, latest bytes).

    ``earlier``: the series whose line went above the top before the recent window and has
    come down since (name, its highest bytes).
    """

    unit: str
    divisor: int
    top_bytes: int
    above: tuple[tuple[str, int], ...] = ()
    earlier: tuple[tuple[str, int], ...] = ()

    @property
    def range(self) -> list[float]:
        """Plotly's ``yaxis.range`` in the unit."""
        return [0.0, self.top_bytes / self.divisor]


def fitted_top(peaks: Mapping[str, int]) -> int | None:
    """The largest value the axis must hold, from each series' largest; None: none known."""
    own = max((peaks[name] for name in _OWN if peaks.get(name)), default=0)
    used = max((peaks[name] for name in (*_OWN, *_OTHERS) if peaks.get(name)), default=0)
    if own and used > SHARE * own:
        return own
    if used:
        return used
    return max(peaks.values(), default=None)  # nothing in use: the card's total, if known


def gpu_axis(
    rows: Sequence[Row], names: Sequence[str], recent_from: float | None = None
) -> Axis | None:
    """The axis for the timeline's *rows*, whose columns 1, 2, ... are the series *names*.

    Rows from *recent_from* (their time, column 0) on are the recent window (``None``: all).
    ``None`` when no value is known at all (the figure then keeps a plain axis).
    """
    peaks: dict[str, int] = {}
    recent_peaks: dict[str, int] = {}
    latest: dict[str, int] = {}
    for column, name in enumerate(names, 1):
        for row in rows:
            value = row[column]
            if value is not None:
                latest[name] = value
                peaks[name] = max(value, peaks.get(name, -1))
                if recent_from is None or row[0] >= recent_from:
                    recent_peaks[name] = max(value, recent_peaks.get(name, -1))
    top = fitted_top(peaks)
    if not top:
        return None
    top = int(top * HEADROOM)
    # A line that went above the top and has come down (a neighbour shut down): while its fall
    # is recent, the axis holds it.
    fallen = [peak for name, peak in recent_peaks.items()
              if peak > top and latest.get(name, 0) <= top]  # fmt: skip
    if fallen:
        top = int(max(fallen) * HEADROOM)
    unit, divisor = ("GiB", GIB) if top >= 2 * GIB else ("MiB", MIB)
    above = tuple((name, latest[name]) for name in names if latest.get(name, 0) > top)
    earlier = tuple(
        (name, peaks[name])
        for name in names
        if peaks.get(name, 0) > top and latest.get(name, 0) <= top
    )
    return Axis(unit, divisor, top, above, earlier)


def off_scale_notes(
    axis: Axis, colours: Mapping[str, str], domain_top: float
) -> list[dict[str, Any]]:
    """Plotly annotations marking the series above *axis*, at the timeline's top right."""
    return [
        {
            "text": f"{name} {format_bytes(value)} ↑",
            "xref": "paper",
            "yref": "paper",
            "x": 1.0,
            "y": domain_top,
            "xanchor": "right",
            "yanchor": "top",
            "yshift": -_NOTE_LINE_PX * line,
            "showarrow": False,
            "bgcolor": "rgba(255,255,255,0.8)",
            "font": {"size": 10, "color": colours.get(name, "#555555")},
        }  # fmt: skip
        for line, (name, value) in enumerate(
            [*axis.above, *((f"{name} earlier", value) for name, value in axis.earlier)]
        )
    ]
