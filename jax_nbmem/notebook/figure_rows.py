"""The panel's timeline as rows: each memory series read from the samples, at bounded size.

A row is ``[time, value of each shown series]``. The last window is drawn as sampled, or in
bins (:func:`window_rows`); everything before it is folded one sample at a time into bins on a
fixed grid whose width doubles as the session grows (:class:`HistoryRows`). A bin keeps each
series' largest known value, so peaks survive; unknown stays ``None``. :func:`steps` turns a
column into plotly's x and y, and :func:`time_ms` a time into plotly's date number.
Pure: no plotly, no widgets; :mod:`jax_nbmem.notebook.figure` assembles the figure.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from jax_nbmem.gpu.mig import shown_order

__all__ = [
    "GIB",
    "GPU_SERIES",
    "HOST_SERIES",
    "MIB",
    "HistoryRows",
    "Row",
    "gpu_indices",
    "reader",
    "scale",
    "shown_series",
    "steps",
    "time_ms",
    "time_text",
    "window_rows",
]

MIB = 1024**2
GIB = 1024**3

# Timeline series: (trace name, how to read it from a GpuSample or HostSample, colour).
GPU_SERIES: tuple[tuple[str, str, str], ...] = (
    ("this kernel", "self_bytes", "#1f77b4"),
    ("JAX in use", "jax_in_use", "#2ca02c"),
    ("JAX pool", "jax_reserved", "#98df8a"),
    ("JAX limit", "jax_limit", "#bcbd22"),
    ("other processes", "others_bytes", "#d62728"),
    ("device total", "total_bytes", "#7f7f7f"),
)
HOST_SERIES: tuple[tuple[str, str, str], ...] = (
    ("process RSS", "rss_bytes", "#9467bd"),
    ("JAX live arrays", "live_array_bytes", "#17becf"),
)
# The history's bins are this wide times a power of two, counted from the epoch.
_GRID_S = 0.1


def gpu_indices(samples: Sequence[Any]) -> list[int]:
    """NVML indices of every GPU seen in *samples*; empty when no GPU was seen.

    In the order the status lists them: a MIG instance right after the GPU it splits.
    """
    parents = {
        gpu.index: getattr(getattr(gpu, "mig", None), "parent_index", None)
        for sample in samples
        for gpu in sample.gpus
    }
    return sorted(parents, key=lambda index: shown_order(index, parents[index]))


def scale(samples: Sequence[Any], gpu_index: int | None) -> tuple[str, int]:
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


def shown_series(gpu_index: int | None) -> tuple[tuple[str, str, str], ...]:
    """The series the timeline reads for *gpu_index* (``None``: the host's)."""
    return HOST_SERIES if gpu_index is None else GPU_SERIES


def reader(gpu_index: int | None) -> Callable[[Any], tuple[int | None, ...]]:
    """Every shown series' value in one sample, in the order of :func:`shown_series`."""
    read_fields = attrgetter(*(field for _, field, _ in shown_series(gpu_index)))
    unknown = (None,) * len(shown_series(gpu_index))
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
Row = list


def _absorb(row: Row, values: Sequence[int | None]) -> None:
    for column, value in enumerate(values, 1):
        if value is not None and (row[column] is None or value > row[column]):
            row[column] = value


def window_rows(
    samples: Sequence[Any],
    read: Callable[[Any], tuple],
    start: float,
    window_s: float,
    window_points: int,
) -> list[Row]:
    """The last *window_s*: as sampled, or one row per ``window_s / window_points`` bin."""
    if len(samples) <= window_points:  # few enough to draw as they are
        return [[sample.t, *read(sample)] for sample in samples]
    width = window_s / window_points
    rows: list[Row] = []
    current_bin = None
    for sample in samples:
        key = math.floor((sample.t - start) / width)
        if key != current_bin:
            rows.append([sample.t, *read(sample)])
            current_bin = key
        else:
            _absorb(rows[-1], read(sample))
    return rows


class HistoryRows:
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
        self.rows: list[Row] = []

    def add(self, sample: Any) -> None:
        """Fold *sample* (newer than every one before) into the rows."""
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
        rows: list[Row] = []
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


def steps(rows: Sequence[Row], column: int, divisor: int, digits: int) -> dict[str, list]:
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
