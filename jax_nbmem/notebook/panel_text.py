"""What the panel says, in every kind of panel: its header, its banner lines, its text.

The header is one line: the GPU, the allocator mode (:func:`mode_text`), free memory; what
does not fit in it is its hover text (:func:`header_details`). The banner carries the
session's warnings (:func:`session_banner`, a yellow box where there are some); under it, in
plain words, how the panel follows the GPU (:func:`sampler_status`: live, or after each cell,
never "live" when it is not) and what this kernel's memory is made of (:func:`context_line`;
:func:`frameworks_line` where PyTorch, CuPy or TensorFlow hold some of it too).
The text summary and the static snapshot (:func:`summary_text`, :func:`snapshot_html`) are
what a terminal, an export or a frontend without widgets shows. All of it reads snapshots only: the
sampler's history, the ledger's records, the allocator report and the session's banner lines.
"""

from __future__ import annotations

import html
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from jax_nbmem.gpu.frameworks import split_lines
from jax_nbmem.gpu.mig import gpu_label
from jax_nbmem.notebook.figure import LiveFigure, gpu_indices, header_text
from jax_nbmem.notebook.snapshot import figure_svg
from jax_nbmem.record.ledger import format_table
from jax_nbmem.text import printable
from jax_nbmem.units import format_bytes, format_duration

__all__ = [
    "HeaderMode",
    "cells_table",
    "code_html",
    "beside_jax",
    "context_line",
    "fallback_bundle",
    "first_gpu",
    "frameworks_line",
    "header_details",
    "header_line",
    "is_simulated",
    "mode_text",
    "recent_records",
    "sampler_status",
    "session_banner",
    "snapshot_html",
    "summary_text",
    "unique_lines",
    "WIDGET_STAND_IN",
]

log = logging.getLogger("jax_nbmem")

TABLE_CELLS = 10  # cells in the text summary's table
# The widget output's text, shown where no view draws the widget: true whenever it is read.
WIDGET_STAND_IN = (
    "jax_nbmem panel: drawn live where its kernel runs and widgets are shown; "
    "the snapshot below is its latest picture."
)
_CODE = re.compile(r"`([^`]+)`")
# How each kind of panel follows the GPU, in its own words (see sampler_status).
_NOT_LIVE = {
    "cells": "Updated after each cell, not live: `%jaxmem panel widget` follows the GPU "
    "between cells too.",
    "static": "Redrawn after each cell, not live.",
    "text": "Redrawn after each cell, not live.",
    "terminal": "As of {time}: run `%jaxmem` again for a new look.",
    "snapshot": "",  # the snapshot says when it was taken, below its picture
}


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

    def short(self, gpu: Any) -> str:
        """The header's few words for the same (:meth:`shown` is its hover text)."""
        if self.cpu_only is None:
            return f"{self.name} ({self.when})"
        if is_simulated(gpu) and (getattr(gpu, "self_bytes", None) or 0) > 0:
            return f"{self.name} (simulated pool; JAX on {self.cpu_only})"
        return f"{self.name} (unused: JAX on {self.cpu_only})"


def is_simulated(gpu: Any) -> bool:
    """Whether *gpu* is jax_nbmem's simulated GPU: its name says so ("... (simulated)")."""
    return "(simulated)" in (getattr(gpu, "name", None) or "")


def cells_table(session: Any, records: list[Any]) -> str:
    """The cells table (``%jaxmem cells``, the panel's text), said to be simulated where it is."""
    sampler = getattr(session, "sampler", None)
    latest = sampler.latest() if sampler is not None else None
    simulated = any(is_simulated(gpu) for gpu in getattr(latest, "gpus", ()))
    return format_table(records, simulated=simulated)


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
    latest: Any,
    gpu_index: int | None,
    mode: HeaderMode | None,
    report: Any = None,
    reserved: bool = True,
) -> str:
    """The panel's one-line header for the GPU *gpu_index* of the sample *latest* (printable).

    *report*: the watcher's latest status report, whose GPUs say this kernel's MPS or HAMi cap.
    *reserved*: say the driver's reserved memory (the widget leaves it to the hover text).
    """
    gpu = latest.gpu(gpu_index) if latest is not None and gpu_index is not None else None
    said = mode.short(gpu) if mode is not None else None
    caps = memory_caps(report)
    return printable(header_text(latest, gpu_index, said, caps, reserved=reserved))


def header_details(
    latest: Any, gpu_index: int | None, mode: HeaderMode | None, report: Any = None
) -> str:
    """The header said in full, for its hover text: the mode explained, the driver's share."""
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


def sampler_status(sampler: Any, latest: Any, kind: str = "widget") -> list[str]:
    """How a panel of *kind* follows the GPU, in its own words (safe on any thread).

    Only the live widget says "Live"; ``cells``, ``static`` and ``text`` say when they are
    redrawn, ``terminal`` when it was printed, and a ``snapshot`` nothing here (it says when it
    was taken). A host-memory note comes first where no GPU is seen.
    """
    if sampler is None:
        return []
    lines = []
    if latest is not None and not latest.gpus:
        lines.append("No GPU seen: showing this process's host memory (RSS, JAX live arrays).")
    if kind == "widget":
        interval = getattr(sampler, "interval", None)
        every = f" every {format_duration(interval)}" if interval else ""
        lines.append(f"Live: sampling{every}.")
    elif _NOT_LIVE.get(kind):
        lines.append(_NOT_LIVE[kind].format(time=time.strftime("%H:%M:%S")))
    return lines


def frameworks_line(report: Any, gpu_index: int | None) -> str | None:
    """This kernel's memory on the GPU by holder, where another framework holds some (or None).

    From the status's ``own_split`` (the watcher's last report): JAX's pool, PyTorch's, CuPy's
    or TensorFlow's, and the CUDA contexts with the rest.
    """
    rows = report.get("own_split") if isinstance(report, dict) else None
    for row in rows or ():
        others = [k for k in row["parts"] if not k.startswith("jax")]
        if row["gpu"] == gpu_index and others:
            return "This kernel by holder: " + split_lines([row])[0]
    return None


def beside_jax(report: Any, gpu_index: int | None) -> int:
    """What other frameworks of this kernel hold on the GPU (0: none, or not known)."""
    rows = report.get("own_split") if isinstance(report, dict) else None
    for row in rows or ():
        if row["gpu"] == gpu_index:
            return sum(v or 0 for k, v in row["parts"].items() if not k.startswith("jax"))
    return 0


def context_line(latest: Any, gpu_index: int | None, beside: int = 0) -> str | None:
    """What this kernel's memory on the GPU is made of, where more than its arrays (or None).

    NVML counts a process's CUDA context (a few hundred MiB before any array) and JAX's pool;
    the notebook counts its arrays. Said so that 684 MiB on the GPU against 384 MiB of arrays
    is not a puzzle. The arrays: JAX's bytes in use on this GPU, else (JAX on the CPU, as in
    the simulated demo) the live arrays' bytes.
    """
    gpu = latest.gpu(gpu_index) if latest is not None and gpu_index is not None else None
    held = getattr(gpu, "self_bytes", None)
    if not held:
        return None
    if beside:  # other frameworks' memory is no puzzle of JAX's: frameworks_line says it
        return None
    arrays = gpu.jax_in_use
    if arrays is None and latest.host is not None:
        arrays = latest.host.live_array_bytes
    pool = gpu.jax_reserved
    counted = max(pool or 0, arrays or 0)
    if arrays is None or held <= counted:
        return None
    # Beyond a known pool: the context and XLA's own buffers. Without one, also what JAX's
    # allocator keeps after arrays are freed (the simulated GPU mirrors that too).
    kept = "XLA's own buffers" if pool else "what JAX's allocator keeps for reuse"
    context = "the simulated CUDA context" if is_simulated(gpu) else "the CUDA context"
    what = f"the rest, {format_bytes(held - counted)}, is {context} and {kept}"
    pool_said = f" in a pool of {format_bytes(pool)}" if pool else ""
    return (
        f"This kernel holds {format_bytes(held)} of {gpu_label(gpu)}: "
        f"{format_bytes(arrays)} of JAX arrays{pool_said}; {what}."
    )


def code_html(line: str) -> str:
    """*line* as HTML, its `backticked` parts as code (escaped first, so nothing else is HTML)."""
    return _CODE.sub(r"<code>\1</code>", html.escape(line))


def unique_lines(lines: list[str]) -> list[str]:
    """*lines* without repeats, each made printable."""
    # Other people's notebook paths and GPU names reach these lines: neutralised once here.
    return list(dict.fromkeys(printable(line) for line in lines))


def summary_text(session: Any, gpu_index: int | None, kind: str = "text") -> str:
    """The panel as text: header, banner lines, one line per GPU, the last cells' table.

    *kind* says how this text is kept current (see :func:`sampler_status`).
    """
    sampler = getattr(session, "sampler", None)
    latest = sampler.latest() if sampler is not None else None
    watcher = getattr(session, "watcher", None)
    report = watcher.latest() if watcher is not None else None
    lines = [header_line(latest, gpu_index, mode_text(session), report)]
    context = context_line(latest, gpu_index, beside_jax(report, gpu_index))
    split = frameworks_line(report, gpu_index)
    notes = sampler_status(sampler, latest, kind) + [n for n in (context, split) if n]
    lines += unique_lines(session_banner(session) + notes)
    for gpu in getattr(latest, "gpus", ()):
        lines.append(
            f"{gpu_label(gpu)}: {getattr(session, 'own_name', 'this kernel')} "
            f"{format_bytes(gpu.self_bytes)}, "
            f"JAX in use {format_bytes(gpu.jax_in_use)}, pool {format_bytes(gpu.jax_reserved)}"
            f", others {format_bytes(gpu.others_bytes)}, total {format_bytes(gpu.total_bytes)}"
        )
    records = recent_records(session, TABLE_CELLS)
    if records:
        lines += ["", cells_table(session, records)]
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
    banner = "<br>".join(code_html(line) for line in lines[1:])
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


def fallback_bundle(session: Any, kind: str, timeline: LiveFigure | None = None) -> dict[str, Any]:
    """The ``static`` (a picture: HTML with inline SVG, and text) or ``text`` panel's bundle.

    *kind* may also be ``terminal`` (text printed once) or ``snapshot`` (the text beside the
    widget). The static panel has no plotly figure (``application/vnd.plotly.v1+json``):
    JupyterLab's plotly renderer keeps what it drew when the output is updated, so after the
    first cell it would stay on its first picture. HTML is rendered anew on every update by
    every frontend (JupyterLab, Notebook 7, Voilà, VS Code, Colab); the live plot is the
    widget's.
    """
    sampler = getattr(session, "sampler", None)
    gpu = first_gpu(sampler)
    text = summary_text(session, gpu, kind)
    bundle: dict[str, Any] = {
        "text/plain": text,
        "text/html": f"<pre class='jax-nbmem-text'>{html.escape(text)}</pre>",
    }
    if kind == "static":
        timeline = timeline or LiveFigure()
        records = recent_records(session, timeline.limits.max_spans)
        title = html.escape(text.splitlines()[0])
        history = sampler.history if sampler is not None else lambda since: []
        figure = timeline.build(history, records, gpu, title=title)
        last = records[-1].execution_count if records else None
        bundle["text/html"] = snapshot_html(figure, text, last_cell=last)
    return bundle
