"""The ``%jaxmem cells`` table: one row per cell record, unknown values as "—"."""

from __future__ import annotations

import time
from collections.abc import Iterable

from jax_nbmem.record.cells import CellRecord, truncate
from jax_nbmem.text import printable
from jax_nbmem.units import MISSING, format_bytes, format_bytes_delta, format_duration

__all__ = ["format_table"]

_TABLE_CELL_CHARS = 28


def _status(record: CellRecord) -> str:
    if record.oom:
        return "OOM"
    if record.success is None:
        return "unfinished"
    if not record.success:
        return f"error: {record.error}" if record.error else "error"
    return "ok"


def _live_arrays(record: CellRecord) -> str:
    """The live arrays after the cell, or the latest walk's total "as of" its time."""
    if record.live_array_bytes_after is not None or record.live_array_bytes_seen is None:
        return format_bytes(record.live_array_bytes_after)
    at = record.live_array_seen_at
    when = MISSING if at is None else time.strftime("%H:%M:%S", time.localtime(at))
    return f"{format_bytes(record.live_array_bytes_seen)} as of {when}"


# Under the table on jax_nbmem's simulated GPU: what its figures are, and what they cannot be.
SIMULATED_NOTE = (
    "Simulated GPU: JAX runs on the CPU and the GPU holds what its live arrays would (the "
    "mirror), read at the cells' boundaries and the sampler's ticks. A cell's temporaries never "
    "reach it: its peak is the live arrays' at the boundaries, not what a real GPU's pool "
    "would reach."
)
# Its "JAX peak" (the mirror's counters, see jax_nbmem.record.simulated), said as what it is.
SIMULATED_PEAK_HEADER = "JAX peak*"
SIMULATED_PEAK_NOTE = (
    "* JAX peak on the simulated GPU: live arrays at the boundaries (each cell's end and the "
    "mirror's looks every 0.25 s), not XLA's peak."
)


def format_table(records: Iterable[CellRecord], *, simulated: bool = False) -> str:
    """Render records as a text table for ``%jaxmem cells``; unknown values show as "—".

    Shows this process's GPU memory when any record saw a GPU, else host memory (RSS). The
    "JAX peak" column only where some record has JAX's figure (JAX on a GPU, or the
    simulated GPU's mirror): a column nothing can fill is left out. ``simulated``: the GPU is
    jax_nbmem's simulated one, whose peaks are said to be what they are
    (:data:`SIMULATED_NOTE`; its JAX peak is the live arrays at the boundaries,
    :data:`SIMULATED_PEAK_NOTE`, never marked "≥").
    """
    rows_in = list(records)
    if not rows_in:
        return "No cells recorded yet."
    on_gpu = any(r.gpu_count > 0 for r in rows_in)
    jax_peaks = on_gpu and any(r.jax_in_use_peak is not None for r in rows_in)
    if on_gpu:
        peak_header = SIMULATED_PEAK_HEADER if simulated else "JAX peak"
        header = ["#", "cell", "duration", "status", "GPU before", "GPU peak", "GPU after",
                  "retained", *([peak_header] if jax_peaks else []), "free min"]  # fmt: skip
    else:
        header = ["#", "cell", "duration", "status", "RSS before", "RSS peak", "RSS after",
                  "retained", "live arrays"]  # fmt: skip
    rows = []
    for r in rows_in:
        number = MISSING if r.execution_count is None else str(r.execution_count)
        if r.span_start is not None:  # its memory figures are the span's
            number = f"{r.span_start}–{number}"
        row = [
            number,
            printable(truncate(r.first_line, _TABLE_CELL_CHARS)),
            format_duration(r.duration_s),
            _status(r),
        ]
        if on_gpu:
            jax_peak = format_bytes(r.jax_in_use_peak)
            if r.jax_in_use_peak is not None and not r.peak_exact and not simulated:
                jax_peak = "≥" + jax_peak
            row += [format_bytes(r.gpu_self_before), format_bytes(r.gpu_self_peak),
                    format_bytes(r.gpu_self_after), format_bytes_delta(r.gpu_self_retained),
                    *([jax_peak] if jax_peaks else []), format_bytes(r.free_min)]  # fmt: skip
        else:
            row += [format_bytes(r.host_rss_before), format_bytes(r.host_rss_peak),
                    format_bytes(r.host_rss_after), format_bytes_delta(r.host_rss_retained),
                    _live_arrays(r)]  # fmt: skip
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
        at_least = "; ≥ = JAX peak at least this" if jax_peaks and not simulated else ""
        lines.append(f"GPU = this process per NVML; peaks are sampled{at_least}.")
        if simulated:
            lines.append(SIMULATED_NOTE)
            if jax_peaks:
                lines.append(SIMULATED_PEAK_NOTE)
    else:
        lines.append("No GPU seen: host memory of this process (RSS) instead of GPU memory.")
    if any(r.span_start is not None for r in rows_in):
        lines.append(
            "a–b = cells with no reading between them (readings were slow): memory figures "
            "for them together."
        )
    return "\n".join(lines)
