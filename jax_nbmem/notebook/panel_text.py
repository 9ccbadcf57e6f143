"""What the panel says, in every kind of panel: its header, its banner lines, its text.

The header names the allocator mode (:func:`mode_text`); the banner carries the session's
warnings and the sampler's own state (:func:`session_banner`, :func:`sampler_status`); the
text summary and the static snapshot (:func:`summary_text`, :func:`snapshot_html`) are what a
terminal, an export or a frontend without widgets shows. All of it reads snapshots only: the
sampler's history, the ledger's records, the allocator report and the session's banner lines.
"""

from __future__ import annotations

import html
import logging
import time
from dataclasses import dataclass
from typing import Any

from jax_nbmem.gpu.mig import gpu_label
from jax_nbmem.notebook.figure import LiveFigure, gpu_indices, header_text
from jax_nbmem.notebook.snapshot import figure_svg
from jax_nbmem.record.ledger import format_table
from jax_nbmem.text import printable
from jax_nbmem.units import format_bytes, format_duration

__all__ = [
    "HeaderMode",
    "fallback_bundle",
    "first_gpu",
    "header_line",
    "is_simulated",
    "mode_text",
    "recent_records",
    "sampler_status",
    "session_banner",
    "snapshot_html",
    "summary_text",
    "unique_lines",
]

log = logging.getLogger("jax_nbmem")

TABLE_CELLS = 10  # cells in the text summary's table
_PLOTLY_MIME = "application/vnd.plotly.v1+json"


@dataclass(frozen=True)
class HeaderMode:
    """The allocator mode as the header says it; see :meth:`shown`."""

    name: str  # "off", "fraction 0.3", ...
    when: str  # "in effect", "when JAX starts"
    cpu_only: str | None = None  # JAX's platforms ("CPU") when it started with no GPU

    def shown(self, gpu: Any) -> str:
        """The words for the header above *gpu* (a sample's GPU, or None).

        Where JAX runs on no GPU its mode is unused, except on the simulated GPU once this
        process holds memory there: the demo's mirror then holds the pool this mode would take.
        """
        if self.cpu_only is None:
            return f"{self.name} ({self.when})"
        if is_simulated(gpu) and (getattr(gpu, "self_bytes", None) or 0) > 0:
            return (
                f"{self.name}, simulated: JAX runs on {self.cpu_only}; the simulated GPU holds "
                "the pool this mode would take"
            )
        return f"{self.name}, unused: JAX runs on {self.cpu_only} (allocator modes apply to GPUs)"


def is_simulated(gpu: Any) -> bool:
    """Whether *gpu* is jax_nbmem's simulated GPU: its name says so ("... (simulated)")."""
    return "(simulated)" in (getattr(gpu, "name", None) or "")


def mode_text(session: Any) -> HeaderMode | None:
    """The allocator mode in effect, or the one JAX will start with (main thread only)."""
    try:
        report = session.control.report()
        if report.backend is not None:
            mode = report.backend.effective.mode_name
            if report.backend.without_gpu:
                shown = "/".join(report.backend.platforms).upper()
                return HeaderMode(mode, "in effect", cpu_only=shown)
            return HeaderMode(mode, "in effect")
        return HeaderMode(report.pending.mode_name, "when JAX starts")
    except Exception:
        log.debug("jax_nbmem: allocator report failed", exc_info=True)
        return None


def header_line(
    latest: Any, gpu_index: int | None, mode: HeaderMode | None, report: Any = None
) -> str:
    """The panel's first line for the GPU *gpu_index* of the sample *latest* (printable).

    *report*: the watcher's latest status report, whose GPUs say this kernel's MPS or HAMi cap.
    """
    gpu = latest.gpu(gpu_index) if latest is not None and gpu_index is not None else None
    said = mode.shown(gpu) if mode is not None else None
    return printable(header_text(latest, gpu_index, said, memory_caps(report)))


def memory_caps(report: Any) -> dict[int, int]:
    """This kernel's MPS or HAMi cap by GPU index, from a status report (empty: none)."""
    gpus = report.get("gpus", []) if isinstance(report, dict) else []
    return {g["index"]: g["memory_cap_bytes"] for g in gpus if g.get("memory_cap_bytes")}


def session_banner(session: Any) -> list[str]:
    """The session's warnings and NVML/JAX status lines (main thread only)."""
    lines = []
    try:
        messages = getattr(session, "banner_messages", None)
        lines = [str(m) for m in (messages() if callable(messages) else [])]
    except Exception:
        log.debug("jax_nbmem: banner_messages failed", exc_info=True)
    if getattr(session, "sampler", None) is None and not lines:
        lines.append("Sampling is off: no live readings, cell records only.")
    return lines


def sampler_status(sampler: Any, latest: Any) -> list[str]:
    """What the panel itself says about its data (safe on any thread)."""
    if sampler is None:
        return []
    if latest is not None and not latest.gpus:
        return ["No GPU seen: showing this process's host memory (RSS, JAX live arrays)."]
    interval = getattr(sampler, "interval", None)
    every = f" every {format_duration(interval)}" if interval else ""
    return [f"Live: sampling{every}."]


def unique_lines(lines: list[str]) -> list[str]:
    """*lines* without repeats, each made printable."""
    # Other people's notebook paths and GPU names reach these lines: neutralised once here.
    return list(dict.fromkeys(printable(line) for line in lines))


def summary_text(session: Any, gpu_index: int | None) -> str:
    """The panel as text: header, banner lines, one line per GPU, the last cells' table."""
    sampler = getattr(session, "sampler", None)
    latest = sampler.latest() if sampler is not None else None
    watcher = getattr(session, "watcher", None)
    report = watcher.latest() if watcher is not None else None
    lines = [header_line(latest, gpu_index, mode_text(session), report)]
    lines += unique_lines(session_banner(session) + sampler_status(sampler, latest))
    for gpu in getattr(latest, "gpus", ()):
        lines.append(
            f"{gpu_label(gpu)}: {getattr(session, 'own_name', 'this kernel')} "
            f"{format_bytes(gpu.self_bytes)}, "
            f"JAX in use {format_bytes(gpu.jax_in_use)}, pool {format_bytes(gpu.jax_reserved)}"
            f", others {format_bytes(gpu.others_bytes)}, total {format_bytes(gpu.total_bytes)}"
        )
    records = recent_records(session, TABLE_CELLS)
    if records:
        lines += ["", format_table(records)]
    return "\n".join(lines)


def recent_records(session: Any, count: int) -> list[Any]:
    """The session's last *count* cell records (none without a ledger)."""
    ledger = getattr(session, "ledger", None)
    return ledger.recent(count) if ledger is not None else []


def first_gpu(sampler: Any) -> int | None:
    """The index of the first GPU in the sampler's latest sample, or None."""
    latest = sampler.latest() if sampler is not None else None
    indices = gpu_indices([latest]) if latest is not None else []
    return indices[0] if indices else None


def snapshot_html(
    figure: dict | None,
    text: str,
    panel_id: str = "",
    live: bool = False,
    last_cell: int | None = None,
) -> str:
    """The panel as static HTML: its first lines, the SVG picture, and when it was taken.

    A *live* panel's picture is an image output of its own (``panel.py``), not in the HTML.
    """
    lines = text.split("\n\n", 1)[0].splitlines()
    header = html.escape(lines[0]) if lines else ""
    banner = "<br>".join(html.escape(line) for line in lines[1:])
    picture = figure_svg(figure) if figure is not None and not live else ""
    taken = time.strftime("%Y-%m-%d %H:%M:%S")
    if last_cell is not None:
        taken += f", after cell [{last_cell}]"
    note = (
        f"Snapshot of the live panel at {taken}; the panel itself is live while its kernel runs."
        if live
        else f"Snapshot at {taken}."
    )
    attributes = f" data-panel='{html.escape(panel_id)}'" if panel_id else ""
    return (
        f"<div class='jax-nbmem-snapshot'{attributes} style='font-family:sans-serif'>"
        f"<div style='font-weight:bold;font-size:13px'>{header}</div>"
        f"<div style='font-size:12px;color:#664d03'>{banner}</div>{picture}"
        f"<div style='font-size:11px;color:#666'>{html.escape(note)}</div></div>"
    )


def fallback_bundle(
    session: Any, with_figure: bool, timeline: LiveFigure | None = None
) -> dict[str, Any]:
    """The static (plotly figure, SVG, text) or text panel as a display bundle."""
    sampler = getattr(session, "sampler", None)
    gpu = first_gpu(sampler)
    text = summary_text(session, gpu)
    bundle: dict[str, Any] = {
        "text/plain": text,
        "text/html": f"<pre class='jax-nbmem-text'>{html.escape(text)}</pre>",
    }
    if with_figure:
        timeline = timeline or LiveFigure()
        records = recent_records(session, timeline.limits.max_spans)
        title = html.escape(text.splitlines()[0])
        history = sampler.history if sampler is not None else lambda since: []
        figure = timeline.build(history, records, gpu, title=title)
        bundle[_PLOTLY_MIME] = {**figure, "config": {"displaylogo": False}}
        bundle["text/html"] = snapshot_html(figure, text)
    return bundle
