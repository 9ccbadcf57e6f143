"""Text for ``%jaxmem top`` and ``%jaxmem free``: tables with human-readable sizes."""

from __future__ import annotations

from jax_nbmem.tools.arrays import FreeReport, TopReport
from jax_nbmem.units import MISSING, format_bytes

__all__ = ["format_free", "format_top"]


def format_top(report: TopReport) -> str:
    """Render a :class:`TopReport` as a plain-text table with human-readable sizes."""
    if not report.available:
        return f"No live JAX arrays to show: {report.reason}."
    if not report.rows:
        return "No live JAX arrays."
    lines = [
        f"Largest live JAX arrays: {len(report.rows)} of {report.live_count}, "
        f"{format_bytes(report.live_bytes)} in all",
        f"{'on device':>10}  {'shape':<18} {'dtype':<9} {'devices':<12} held by",
    ]
    for row in report.rows:
        if row.names:
            holders = ", ".join(row.names)
        elif row.history:
            holders = f"only IPython's output history: {', '.join(row.history)}"
        else:
            holders = "(no name)"
        devices = ",".join(row.devices[:3]) + (f",+{len(row.devices) - 3}" * (len(row.devices) > 3))
        shape = str(row.shape) if len(str(row.shape)) <= 18 else str(row.shape)[:17] + "…"
        lines.append(
            f"{format_bytes(row.size_bytes):>10}  {shape:<18} {row.dtype:<9} "
            f"{devices or MISSING:<12} {holders}"
        )
    if report.history_only_count:
        lines.append(
            f"{report.history_only_count} array(s), {format_bytes(report.history_only_bytes)}, "
            "held only by IPython's output history (Out): `%reset -f out` lets them go."
        )
    if report.unnamed_count:
        lines.append(
            f"{report.unnamed_count} array(s), {format_bytes(report.unnamed_bytes)}, held by no "
            "name: nested deeper in containers, in objects or closures, or in jit caches."
        )
    return "\n".join(lines)


def format_free(report: FreeReport) -> str:
    """Render a :class:`FreeReport`: what was freed, what was kept and why, memory returned."""
    lines = []
    for outcome in report.outcomes:
        size = f"{outcome.arrays} array(s), {format_bytes(outcome.bytes)}"
        if outcome.status == "freed":
            lines.append(f"freed {outcome.name}: {size}")
        elif outcome.status == "kept":
            lines.append(f"kept {outcome.name} ({size}): also held by {', '.join(outcome.held_by)}")
        else:
            lines.append(f"skipped {outcome.name}: {outcome.reason}")
    if report.caches_cleared:
        lines.append("cleared JAX's compilation caches (jax.clear_caches())")
    pool = report.pool_bytes_returned
    if pool is not None:
        lines.append(f"returned to JAX's pool: {format_bytes(pool)} (bytes_in_use before - after)")
    else:
        lines.append(
            f"returned to JAX's pool: {format_bytes(report.deleted_bytes)} "
            "(sum of the deleted arrays' nbytes; this backend reports no bytes_in_use)"
        )
    gpu = report.gpu_bytes_returned
    if gpu is None:
        lines.append("returned to the GPU: unknown (NVML does not show this process)")
    else:
        note = "" if gpu > 0 else " (JAX's allocator keeps freed memory for reuse)"
        lines.append(f"returned to the GPU: {format_bytes(gpu)}{note}")
    return "\n".join(lines)
