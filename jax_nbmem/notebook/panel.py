"""The live memory panel of ``%jaxmem``: a widget that follows the sampler, or a fallback.

The panel reads only snapshots: the sampler's history, the ledger's records, the allocator
report and the session's banner lines (the status watcher's last report). It never calls NVML.

Three ways to show it (``c.JaxNbMem.panel``):

* ``widget``: ipywidgets for the header, banner and buttons, and our own plot widget
  (:mod:`jax_nbmem.notebook.panel_view`) whose synced state is the current figure, so every
  view of it (a second ``%jaxmem``, a page reload) draws the same picture. The sampler's
  callback only marks the panel dirty; a small daemon thread pushes at most one update every
  0.25 s, and only the parts that changed. That thread sets traits (and makes the shut-down
  buttons, widgets opened over their comms) and nothing else: ``display()`` or ``print()``
  from a thread would land in whatever cell runs at that moment.
  Under the widget comes a static **snapshot** (an SVG, :mod:`jax_nbmem.notebook.snapshot`)
  that a drawn view hides: it is what exports, a notebook reopened without its kernel, and a
  frontend that cannot draw the widget show. Until a view has drawn, the snapshot is redrawn
  after cells on the cell's path, from a budget of 2% of the wall time with a burst (headless
  runs, ``nbconvert --execute``, end with the picture of their last cell); once one has, at
  most every 30 s.
* ``static``: a plotly figure (with the SVG and a text fallback in the same output) refreshed
  after each cell through a display handle, for frontends without widgets.
* ``text``: a text table, refreshed the same way in a kernel; in terminal IPython, where an
  update would print the table again after every command, printed once, when asked.

After a cell the panel is only marked dirty: the update thread re-reads a few facts of the
session (the mode, the banner lines, both in memory) and rebuilds the figure from the last
cells' records only, so the cost after a cell does not grow with the notebook. The banner (its
warnings, the kernels they name, their shut-down buttons) also follows the status watcher's
reports while no cell runs: each new report is read on the update thread, within the same
rate limits as the header's updates.

``auto`` picks ``widget`` in a Jupyter kernel (JupyterLab, Notebook 7, VS Code, Colab: anywidget
turns on Colab's widget manager) and ``text`` in a terminal. Each session has one live panel:
showing it again displays the same widget again, with the same single update thread.
"""

from __future__ import annotations

import functools
import html
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from IPython import get_ipython
from IPython.display import display

from jax_nbmem.gpu.mig import gpu_label
from jax_nbmem.notebook.figure import (
    FigureLimits,
    LiveFigure,
    figure_parts,
    gpu_indices,
    header_text,
)
from jax_nbmem.notebook.panel_actions import ShutdownActions
from jax_nbmem.notebook.panel_view import plot_view
from jax_nbmem.notebook.snapshot import figure_svg
from jax_nbmem.record.ledger import format_table
from jax_nbmem.text import printable
from jax_nbmem.units import format_bytes, format_duration

__all__ = ["cell_finished", "close_panels", "frontend", "show_panel"]

log = logging.getLogger("jax_nbmem")

_MIN_UPDATE_INTERVAL_S = 0.25  # at most four figure updates a second
# The share of a core the updates may take: a costly update (a large figure, a slow frontend
# link) spaces the next one out, so the panel never competes with the user's cells for long.
_UPDATE_BUDGET = 0.02
_IDLE_CHECK_S = 1.0
_TABLE_CELLS = 10
_FIRST_SAMPLE_WAIT_S = 0.5
# The GPU selector: ipywidgets' description column (80 px) and a margin, then about 8 px per
# character of the widest name at JupyterLab's 13 px font; never narrower than "GPU 12".
_SELECTOR_MIN_PX, _SELECTOR_DESCRIPTION_PX, _SELECTOR_CHAR_PX = 160, 90, 8
_PLOTLY_MIME = "application/vnd.plotly.v1+json"
_SNAPSHOT_EVERY_S = 30.0  # once a view draws live, the snapshot only backs up the saved file
# Until then the snapshot is redrawn on the cell's path, from a budget that fills with this
# share of the wall time up to a burst: a run's last cells are in its picture, while a long run
# of quick cells redraws it only every few cells.
_HEADLESS_SNAPSHOT_SHARE = 0.02
_HEADLESS_SNAPSHOT_BURST_S = 0.25


@dataclass
class _PanelState:
    """What :func:`show_panel` left on the session (``session._panel_state``)."""

    live: _LivePanel | None = None
    handle: Any = None  # DisplayHandle of the static or text fallback
    kind: str | None = None
    listener: Any = None  # our cell listener on the session, once registered
    snapshot: Any = None  # DisplayHandle of the widget's static snapshot
    snapshot_at: float = 0.0  # time.monotonic() of its last refresh
    snapshot_cost: float = 0.0  # seconds its last refresh on the cell's path took
    snapshot_budget: float = _HEADLESS_SNAPSHOT_BURST_S  # seconds it may take on the path
    timeline: Any = None  # LiveFigure of the static fallback, kept between its updates
    refresh_after_cells: bool = True  # False in a terminal: an update would print again


def _state(session: Any) -> _PanelState:
    state = getattr(session, "_panel_state", None)
    if state is None:
        state = _PanelState()
        session._panel_state = state
    return state


def frontend() -> str:
    """Where this kernel's outputs go: ``colab``, ``vscode``, ``jupyter`` or ``terminal``."""
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return "terminal"
    if "google.colab" in sys.modules:
        return "colab"
    # VS Code's Jupyter extension starts kernels from its own process tree.
    if any(name in os.environ for name in ("VSCODE_PID", "VSCODE_CWD", "VSCODE_IPC_HOOK_CLI")):
        return "vscode"
    return "jupyter"


def _choose_kind(setting: str) -> str:
    if setting in ("widget", "static", "text"):
        return setting
    # In VS Code and Colab too: where the widget does not draw, its snapshot shows instead.
    return "text" if frontend() == "terminal" else "widget"


def _mode_text(session: Any) -> str | None:
    """The allocator mode in effect, or the one JAX will start with (main thread only)."""
    try:
        report = session.control.report()
        if report.backend is not None:
            if report.backend.without_gpu:
                mode = report.backend.effective.mode_name
                shown = "/".join(report.backend.platforms).upper()
                return f"{mode}, unused: JAX runs on {shown} (allocator modes apply to GPUs)"
            return f"{report.backend.effective.mode_name} (in effect)"
        return f"{report.pending.mode_name} (when JAX starts)"
    except Exception:
        log.debug("jax_nbmem: allocator report failed", exc_info=True)
        return None


def _session_banner(session: Any) -> list[str]:
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


def _sampler_status(sampler: Any, latest: Any) -> list[str]:
    """What the panel itself says about its data (safe on any thread)."""
    if sampler is None:
        return []
    if latest is not None and not latest.gpus:
        return ["No GPU seen: showing this process's host memory (RSS, JAX live arrays)."]
    interval = getattr(sampler, "interval", None)
    every = f" every {format_duration(interval)}" if interval else ""
    return [f"Live: sampling{every}."]


def _gpu_option(latest: Any, index: int) -> str:
    """The selector's name for a GPU: "GPU 1", "MIG 3g.71gb instance 1 of GPU 0"."""
    gpu = latest.gpu(index) if latest is not None else None
    return gpu_label(gpu) if gpu is not None else f"GPU {index}"


def _selector_width(labels: Iterable[str]) -> str:
    """Wide enough for its longest name ("MIG 3g.71gb instance 2 of GPU 0" is 31 characters)."""
    longest = max((len(label) for label in labels), default=0)
    return f"{max(_SELECTOR_MIN_PX, _SELECTOR_DESCRIPTION_PX + _SELECTOR_CHAR_PX * longest)}px"


def _unique(lines: list[str]) -> list[str]:
    # Other people's notebook paths and GPU names reach these lines: neutralised once here.
    return list(dict.fromkeys(printable(line) for line in lines))


def _caps(report: Any) -> dict[int, int]:
    """This kernel's MPS or HAMi cap by GPU index, from a status report (or None: none)."""
    gpus = report.get("gpus", []) if isinstance(report, dict) else []
    return {g["index"]: g["memory_cap_bytes"] for g in gpus if g.get("memory_cap_bytes")}


def _summary_text(session: Any, gpu_index: int | None) -> str:
    sampler = getattr(session, "sampler", None)
    latest = sampler.latest() if sampler is not None else None
    caps = _caps(getattr(session, "watcher", None) and session.watcher.latest())
    lines = [printable(header_text(latest, gpu_index, _mode_text(session), caps))]
    lines += _unique(_session_banner(session) + _sampler_status(sampler, latest))
    for gpu in getattr(latest, "gpus", ()):
        lines.append(
            f"{gpu_label(gpu)}: {getattr(session, 'own_name', 'this kernel')} "
            f"{format_bytes(gpu.self_bytes)}, "
            f"JAX in use {format_bytes(gpu.jax_in_use)}, pool {format_bytes(gpu.jax_reserved)}"
            f", others {format_bytes(gpu.others_bytes)}, total {format_bytes(gpu.total_bytes)}"
        )
    records = _recent_records(session, _TABLE_CELLS)
    if records:
        lines += ["", format_table(records)]
    return "\n".join(lines)


def _recent_records(session: Any, count: int) -> list[Any]:
    ledger = getattr(session, "ledger", None)
    return ledger.recent(count) if ledger is not None else []


def _first_gpu(sampler: Any) -> int | None:
    latest = sampler.latest() if sampler is not None else None
    indices = gpu_indices([latest]) if latest is not None else []
    return indices[0] if indices else None


def _snapshot_html(
    figure: dict | None,
    text: str,
    panel_id: str = "",
    live: bool = False,
    last_cell: int | None = None,
) -> str:
    """The panel as static HTML: its first lines, the SVG picture, and when it was taken."""
    lines = text.split("\n\n", 1)[0].splitlines()
    header = html.escape(lines[0]) if lines else ""
    banner = "<br>".join(html.escape(line) for line in lines[1:])
    picture = figure_svg(figure) if figure is not None else ""
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


def _fallback_bundle(
    session: Any, with_figure: bool, timeline: LiveFigure | None = None
) -> dict[str, Any]:
    sampler = getattr(session, "sampler", None)
    gpu = _first_gpu(sampler)
    text = _summary_text(session, gpu)
    bundle: dict[str, Any] = {
        "text/plain": text,
        "text/html": f"<pre class='jax-nbmem-text'>{html.escape(text)}</pre>",
    }
    if with_figure:
        timeline = timeline or LiveFigure()
        records = _recent_records(session, timeline.limits.max_spans)
        title = html.escape(text.splitlines()[0])
        history = sampler.history if sampler is not None else lambda since: []
        figure = timeline.build(history, records, gpu, title=title)
        bundle[_PLOTLY_MIME] = {**figure, "config": {"displaylogo": False}}
        bundle["text/html"] = _snapshot_html(figure, text)
    return bundle


class _LivePanel:
    """The widget panel: header, banner, GPU selector, pause button, and the figure."""

    def __init__(self, session: Any, limits: FigureLimits | None = None) -> None:
        import ipywidgets as widgets

        self.sampler = getattr(session, "sampler", None)
        self._session = session
        self._session_changed = False
        # Set when a cell's end woke the update thread, cleared by the thread once it looks:
        # cells in quick succession wake it once (an Event's set costs a cell microseconds).
        self._woken_by_cell = False
        self._ledger = getattr(session, "ledger", None)
        self._timeline = LiveFigure(limits)  # keeps the history part between updates
        self._lock = threading.RLock()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Any = None
        self._mode: str | None = None
        self._banner_lines: list[str] = []
        self._report_read: Any = None  # the watcher's report the banner lines were read from
        self.gpu_index = _first_gpu(self.sampler)
        self._gpu_choices = gpu_indices(self._history(None))  # every GPU seen so far
        self.updates = 0

        self.header = widgets.HTML(layout=widgets.Layout(margin="0 0 2px 0"))
        self.banner = widgets.HTML()
        self.banner.add_class("jax-nbmem-banner")
        self.gpu_selector = widgets.Dropdown(
            description="GPU", layout={"width": f"{_SELECTOR_MIN_PX}px"}
        )
        self.gpu_selector.observe(self._on_gpu_chosen, names="value")
        self.pause = widgets.ToggleButton(value=False, description="Pause", icon="pause")
        self.pause.observe(self._on_pause, names="value")
        figure = self._timeline.build(self._history, self._records(), self.gpu_index)
        self.figure = figure  # the last figure drawn, for the snapshot
        self.plot = plot_view(figure_parts(figure))
        controls = widgets.HBox([self.gpu_selector, self.pause])
        self.actions = ShutdownActions(
            session, on_change=lambda: self.refresh_from_session(session)
        )
        self.widget = widgets.VBox(
            [self.header, self.banner, self.actions.widget, controls, self.plot],
            layout=widgets.Layout(width="100%"),
        )
        self.widget.add_class("jax-nbmem-panel")
        self.refresh_from_session(session)

    def _history(self, since: float | None) -> list[Any]:
        return self.sampler.history(since) if self.sampler is not None else []

    def _records(self) -> list[Any]:
        # Only the cells the figure draws: reading all of them would grow with the notebook.
        if self._ledger is None:
            return []
        return self._ledger.recent(self._timeline.limits.max_spans)

    def snapshot_html(self) -> str:
        """The last picture drawn, as static HTML that a drawn view hides."""
        text = _summary_text(self._session, self.gpu_index)
        records = self._records()
        last = records[-1].execution_count if records else None
        return _snapshot_html(self.figure, text, self.plot.panel_id, live=True, last_cell=last)

    def start(self) -> None:
        """Subscribe to the sampler and start the update thread (no-op when running)."""
        if self.sampler is None or (self._thread is not None and self._thread.is_alive()):
            return
        self._stop = threading.Event()  # a panel closed before may be started again
        self._unsubscribe = self.sampler.subscribe(self._on_sample)
        self._thread = threading.Thread(target=self._run, name="jax_nbmem-panel", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Unsubscribe and stop the update thread; the widgets stay on screen, frozen."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    @property
    def alive(self) -> bool:
        """Whether the update thread runs (False after :meth:`close`)."""
        return self._thread is not None and self._thread.is_alive()

    def refresh_from_session(self, session: Any) -> None:
        """Re-read the session's facts (mode, banner lines, shutdown buttons), then update."""
        self._read_session()
        self.actions.refresh()
        self.update()

    def cell_finished(self) -> None:
        """A cell ended (on its path): mark the panel, leave the work to the update thread."""
        self._session_changed = True
        if not self._woken_by_cell:
            self._woken_by_cell = True
            self._dirty.set()

    def refresh_after_cell(self) -> None:
        """Bring the figure up to date now, on the main thread (see ``_refresh_snapshot``)."""
        self._session_changed = False
        self._read_session()
        self.update()

    def _read_session(self) -> None:
        self._report_read = self._watcher_report()  # first: a newer one is read next time
        self._mode = _mode_text(self._session)
        self._banner_lines = _session_banner(self._session)

    def _watcher_report(self) -> Any:
        """The status watcher's last report (cheap, any thread), or None."""
        watcher = getattr(self._session, "watcher", None)
        try:
            return watcher.latest() if watcher is not None else None
        except Exception:
            log.debug("jax_nbmem: the watcher's report is unavailable", exc_info=True)
            return None

    def _on_sample(self, sample: Any) -> None:
        self._dirty.set()  # the sampler's thread: nothing more here

    def _on_gpu_chosen(self, change: dict) -> None:
        if change["new"] is not None and change["new"] != self.gpu_index:
            self.gpu_index = change["new"]
            self._dirty.set()

    def _on_pause(self, change: dict) -> None:
        self.pause.description = "Resume" if change["new"] else "Pause"
        self.pause.icon = "play" if change["new"] else "pause"
        self._dirty.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            woken = self._dirty.wait(_IDLE_CHECK_S)
            if self.pause.value:
                if woken:
                    self._dirty.clear()
                    self._woken_by_cell = False
                    self._render_banner(self.sampler.latest(), paused=True)
                continue
            # A new look at who is on the GPU: its warnings reach the banner with no cell run.
            news = self._watcher_report() is not self._report_read
            if not woken and not news:
                continue
            started, cpu = time.monotonic(), time.thread_time()
            self._dirty.clear()
            # Reset before _session_changed is read: a cell that ends from here on wakes the
            # thread again, and one that ended before is seen now.
            self._woken_by_cell = False
            try:
                if self._session_changed or news:  # a cell ended, or the watcher reported
                    self._session_changed = False
                    self._read_session()
                    self.actions.refresh()  # its own lock: a click may redraw it meanwhile
                self.update()
            except Exception:
                log.debug("jax_nbmem: panel update failed", exc_info=True)
            pause = max(_MIN_UPDATE_INTERVAL_S, (time.thread_time() - cpu) / _UPDATE_BUDGET)
            self._stop.wait(max(0.0, started + pause - time.monotonic()))

    def update(self) -> None:
        """Push what changed since the last update to the figure and the header lines."""
        with self._lock:
            latest = self.sampler.latest() if self.sampler is not None else None
            # A sample without GPUs (NVML failed once) keeps the choice of GPUs seen before.
            indices = gpu_indices([latest] if latest is not None else []) or self._gpu_choices
            self._gpu_choices = indices
            if self.gpu_index not in indices:
                self.gpu_index = indices[0] if indices else None
            options = [(_gpu_option(latest, i), i) for i in indices]
            if list(self.gpu_selector.options) != options:
                self.gpu_selector.options = options
                self.gpu_selector.layout.width = _selector_width(label for label, _ in options)
            if self.gpu_selector.value != self.gpu_index and self.gpu_index is not None:
                self.gpu_selector.value = self.gpu_index
            self.gpu_selector.layout.display = "" if len(indices) > 1 else "none"
            figure = self._timeline.build(self._history, self._records(), self.gpu_index)
            if not self.plot.show(figure_parts(figure)):
                self._dirty.set()  # over one update's budget: the rest goes next time
            self.figure = figure
            header = header_text(latest, self.gpu_index, self._mode, _caps(self._report_read))
            self.header.value = f"<b>{html.escape(printable(header))}</b>"
            self._render_banner(latest, paused=False)
            self.updates += 1

    def _render_banner(self, latest: Any, paused: bool) -> None:
        lines = _unique(self._banner_lines + _sampler_status(self.sampler, latest))
        if paused:
            lines = ["Paused: press Resume to follow the GPU again.", *lines]
        warn = any(not line.startswith("Live:") for line in lines)
        style = "background:#fff3cd;color:#664d03" if warn else "background:#e7f1ff;color:#084298"
        items = "<br>".join(html.escape(line) for line in lines)
        value = f"<div style='{style};padding:3px 8px;border-radius:4px'>{items}</div>"
        if self.banner.value != value:
            self.banner.value = value


def show_panel(session: Any) -> None:
    """Show the memory panel under the current cell (``%jaxmem`` with no arguments).

    Main thread only. The kind follows ``session.settings.panel``; a widget that cannot be
    built falls back to the static figure, and that to text. Never raises.
    """
    state = _state(session)
    kind = _choose_kind(getattr(session.settings, "panel", "auto"))
    _ensure_a_sample(getattr(session, "sampler", None))
    _listen_to_cells(session, state)
    if kind == "widget":
        try:
            _show_widget(session, state)
            return
        except Exception:
            log.debug("jax_nbmem: widget panel failed; showing the static one", exc_info=True)
            kind = "static"
    state.kind = kind
    state.refresh_after_cells = _in_a_kernel()
    if state.timeline is None:
        state.timeline = LiveFigure()
    try:
        bundle = _fallback_bundle(session, kind == "static", state.timeline)
    except Exception:
        log.debug("jax_nbmem: static panel failed; showing text", exc_info=True)
        state.kind, bundle = "text", {"text/plain": _summary_text(session, None)}
    state.handle = display(bundle, raw=True, display_id=True)


def _in_a_kernel() -> bool:
    """Whether outputs can be replaced in place (a Jupyter kernel), not printed anew."""
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _listen_to_cells(session: Any, state: _PanelState) -> None:
    """Have the session call :func:`cell_finished` after each cell (once per session)."""
    add = getattr(session, "add_cell_listener", None)
    if state.listener is None and callable(add):
        state.listener = functools.partial(cell_finished, session)
        add(state.listener)


def _ensure_a_sample(sampler: Any) -> None:
    """Let the panel open with numbers: wait briefly for the sampler's first sample.

    The wait is bounded: with a slow NVML the panel opens at once and fills in later. Only a
    sampler without its thread is read here, on the caller's thread.
    """
    if sampler is None or sampler.latest() is not None:
        return
    try:
        if not sampler.running:
            sampler.sample_now(include_live_arrays=False)
            return
        deadline = time.monotonic() + _FIRST_SAMPLE_WAIT_S
        while sampler.latest() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    except Exception:
        log.debug("jax_nbmem: first sample failed", exc_info=True)


def _show_widget(session: Any, state: _PanelState) -> None:
    live = state.live
    if live is None or live.sampler is not getattr(session, "sampler", None):
        if live is not None:
            live.close()
        live = _LivePanel(session)
        state.live = live
    else:
        live.refresh_from_session(session)
    live.start()
    state.kind = "widget"
    state.refresh_after_cells = _in_a_kernel()
    # Text and HTML ride along for frontends that cannot draw widgets at all.
    fallback = _fallback_bundle(session, with_figure=False)
    display({**live.widget._repr_mimebundle_(), **fallback}, raw=True)
    # Every snapshot of this panel shares one display id: a refresh updates them all.
    state.snapshot = display(
        _snapshot_bundle(live), raw=True, display_id=f"jax-nbmem-snapshot-{live.plot.panel_id}"
    )
    state.snapshot_at = time.monotonic()


def _snapshot_bundle(live: _LivePanel) -> dict[str, str]:
    return {
        "text/plain": "(jax_nbmem: a snapshot of the panel, for views without the live widget)",
        "text/html": live.snapshot_html(),
    }


def _refresh_snapshot(state: _PanelState) -> None:
    """Keep the widget's snapshot current for places where no view draws the widget.

    Until a view has drawn, nothing on screen is live (a headless run, an export, a frontend
    without the widget), so the figure is brought up to date here, on the cell's path, where
    the export sees it: from a budget of ``_HEADLESS_SNAPSHOT_SHARE`` of the wall time (with a
    burst of ``_HEADLESS_SNAPSHOT_BURST_S``), so the last cells of a run are in its picture
    and only a long run of quick cells skips some in between. The picture says which cell it
    shows last. Once a view
    draws, the snapshot only backs up the saved notebook: redrawn from the last figure every
    ``_SNAPSHOT_EVERY_S``.
    """
    live = state.live
    if live is None or state.snapshot is None or not state.refresh_after_cells:
        return  # a terminal: an update would print the snapshot again, and nothing exports it
    now = time.monotonic()
    if live.plot.views_drawn:
        if now - state.snapshot_at < _SNAPSHOT_EVERY_S:
            return
        state.snapshot.update(_snapshot_bundle(live), raw=True)
        state.snapshot_at = now
        return
    refill = (now - state.snapshot_at) * _HEADLESS_SNAPSHOT_SHARE
    budget = min(_HEADLESS_SNAPSHOT_BURST_S, state.snapshot_budget + refill)
    if budget < state.snapshot_cost:
        state.snapshot_budget, state.snapshot_at = budget, now
        return
    live.refresh_after_cell()
    state.snapshot.update(_snapshot_bundle(live), raw=True)
    state.snapshot_at = time.monotonic()
    state.snapshot_cost = state.snapshot_at - now
    state.snapshot_budget = budget - state.snapshot_cost


def cell_finished(session: Any) -> None:
    """After each cell (from ``post_run_cell``): refresh the panel; never raises.

    The live panel is only marked dirty: its update thread re-reads the session and redraws
    (its snapshot, see :func:`_refresh_snapshot`, is the exception). The static and text
    fallbacks replace their output through their display handle (they have no thread; a
    frontend without widgets asked for them).
    """
    try:
        state = getattr(session, "_panel_state", None)
        if state is None:
            return
        if state.live is not None:
            state.live.cell_finished()
            if state.snapshot is not None and state.refresh_after_cells:  # not in a terminal
                _refresh_snapshot(state)
        fallback = state.kind in ("static", "text") and state.refresh_after_cells
        if state.handle is not None and fallback:
            bundle = _fallback_bundle(session, state.kind == "static", state.timeline)
            state.handle.update(bundle, raw=True)
    except Exception:
        log.debug("jax_nbmem: panel refresh after a cell failed", exc_info=True)


def close_panels(session: Any) -> None:
    """Stop the live panel's updates and forget the fallback's handle (``%unload_ext``)."""
    state = getattr(session, "_panel_state", None)
    if state is None:
        return
    try:
        if state.live is not None:
            state.live.close()
    except Exception:
        log.debug("jax_nbmem: closing the panel failed", exc_info=True)
    remove = getattr(session, "remove_cell_listener", None)
    if state.listener is not None and callable(remove):
        remove(state.listener)
    state.live = None
    state.handle = None
    state.snapshot = None
    state.listener = None
