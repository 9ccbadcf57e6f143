"""Text for ``%jaxmem top`` and ``%jaxmem free``: tables with human-readable sizes."""

from __future__ import annotations

from jax_nbmem.gpu import own_process
from jax_nbmem.tools.arrays import FreeReport, TopReport
from jax_nbmem.tools.last_error import LastErrorReport
from jax_nbmem.units import MISSING, format_bytes

__all__ = ["format_free", "format_free_last_error", "format_top"]

# Frames named per array in the table; the rest are counted.
_FRAMES_SHOWN = 2


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
        elif row.frames:
            holders = f"only the last error's frames: {_frames(row.frames)}"
        else:
            holders = "(no name)"
        if row.frames and (row.names or row.history):
            holders += f"; the last error's frames: {_frames(row.frames)}"
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
    if report.error_only_count:
        lines.append(
            f"{report.error_only_count} array(s), {format_bytes(report.error_only_bytes)}, held "
            "only by the last error's frames: `%jaxmem free --last-error` lets them go."
        )
    if report.unnamed_count:
        lines.append(
            f"{report.unnamed_count} array(s), {format_bytes(report.unnamed_bytes)}, held by no "
            "name: nested deeper in containers, in objects or closures, or in jit caches."
        )
    return "\n".join(lines)


def _frames(labels: tuple[str, ...]) -> str:
    shown = ", ".join(labels[:_FRAMES_SHOWN])
    more = len(labels) - _FRAMES_SHOWN
    return f"{shown} and {more} more frame(s)" if more > 0 else shown


def format_free_last_error(report: LastErrorReport, error: str | None) -> str:
    """Render what ``%jaxmem free --last-error`` did; *error* names the error (``ValueError``)."""
    if error is None:
        return "No error to free: no cell has failed since the last error was freed."
    lines = [
        f"released the frames of the last error ({error}): {report.frames} frame(s); "
        f"{report.released_arrays} array(s), {format_bytes(report.released_bytes)}, "
        "held only there are gone"
    ]
    for label, size, names in report.kept:
        holders = ", ".join(names) if names else "something outside the namespace"
        lines.append(f"kept {label} ({format_bytes(size)}): also held by {holders}")
    live = report.live_bytes_returned
    if live is not None:
        lines.append(
            f"live JAX arrays: {format_bytes(report.live_bytes_before)} before, "
            f"{format_bytes(report.live_bytes_after)} after"
        )
    lines.extend(
        _returned(report.before, report.after, report.released_bytes, "the released arrays'")
    )
    lines.append("`%debug` and `%tb` have no error to show now.")
    return "\n".join(lines)


def _returned(before, after, fallback: int, whose: str) -> list[str]:
    """The "returned to JAX's pool / to the GPU" lines from two memory readings."""
    lines = []
    if before.jax_bytes_in_use is not None and after.jax_bytes_in_use is not None:
        pool = before.jax_bytes_in_use - after.jax_bytes_in_use
        lines.append(f"returned to JAX's pool: {format_bytes(pool)} (bytes_in_use before - after)")
    else:
        lines.append(
            f"returned to JAX's pool: {format_bytes(fallback)} "
            f"(sum of {whose} nbytes; this backend reports no bytes_in_use)"
        )
    if before.gpu_self_bytes is None or after.gpu_self_bytes is None:
        why = "NVML does not show this process"
        if own_process.nvml_pid() is None:  # in a container, until the node agent proves it
            why = own_process.unknown_reason()
        lines.append(f"returned to the GPU: unknown ({why})")
    else:
        gpu = before.gpu_self_bytes - after.gpu_self_bytes
        note = "" if gpu > 0 else " (JAX's allocator keeps freed memory for reuse)"
        lines.append(f"returned to the GPU: {format_bytes(gpu)}{note}")
    return lines


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
    lines.extend(
        _returned(report.before, report.after, report.deleted_bytes, "the deleted arrays'")
    )
    return "\n".join(lines)
