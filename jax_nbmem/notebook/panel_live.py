"""The widget panel: header, banner, notes, shut-down buttons, GPU selector, pause, and the plot.

Live (``live=True``, the ``widget`` kind), its synced state follows the sampler: the
sampler's callback only marks the panel dirty; a small daemon thread pushes at most one update
every 0.25 s (less often when an update is costly: ``_UPDATE_BUDGET`` of a core), and only the
parts that changed. That thread sets traits (and makes the shut-down buttons, widgets opened
over their comms) and nothing else: ``display()`` or ``print()`` from a thread would land in
whatever cell runs at that moment.

After every cell, live or not, :meth:`LivePanel.push_after_cell` runs on the kernel's main
thread: it re-reads the session's facts (mode, banner lines, buttons), rebuilds the figure
from the last cells' records only, and sends what changed since the main thread last sent,
including what the thread set meanwhile. Some frontends (Colab) drop comm messages sent from
other threads; there every cell still reaches the panel. Not live (``live=False``, the
``cells`` kind) there is no thread, and the panel says it is updated after each cell. See
:mod:`jax_nbmem.notebook.panel` for how it is shown and how its snapshot is kept.
"""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from jax_nbmem.gpu.mig import gpu_label
from jax_nbmem.notebook.figure import (
    FigureLimits,
    LiveFigure,
    figure_parts,
    gpu_indices,
)
from jax_nbmem.notebook.panel_actions import ShutdownActions
from jax_nbmem.notebook.panel_text import (
    HeaderMode,
    beside_jax,
    code_html,
    context_line,
    first_gpu,
    frameworks_line,
    header_details,
    header_line,
    mode_text,
    sampler_status,
    session_banner,
    snapshot_html,
    summary_text,
    unique_lines,
)
from jax_nbmem.notebook.panel_view import UPDATE_BUDGET_BYTES, plot_view

__all__ = ["LivePanel"]

log = logging.getLogger("jax_nbmem")

_MIN_UPDATE_INTERVAL_S = 0.25  # at most four figure updates a second
# The share of a core the updates may take: a costly update (a large figure, a slow frontend
# link) spaces the next one out, so the panel never competes with the user's cells for long.
_UPDATE_BUDGET = 0.02
_IDLE_CHECK_S = 1.0
# The GPU selector: ipywidgets' description column (80 px) and a margin, then about 8 px per
# character of the widest name at JupyterLab's 13 px font; never narrower than "GPU 12".
_SELECTOR_MIN_PX, _SELECTOR_DESCRIPTION_PX, _SELECTOR_CHAR_PX = 160, 90, 8
# One line at any width: what does not fit is cut with an ellipsis, and all of it (the mode
# explained, the driver's reserved memory) is the hover text.
_HEADER_STYLE = "display:block;white-space:nowrap;overflow:hidden;text-overflow:ellipsis"
_WARNING_STYLE = (
    "background:#fff3cd;color:#664d03;padding:3px 8px;border-radius:4px;line-height:1.5"
)
_NOTES_STYLE = "color:#555;font-size:12px;padding:1px 8px;line-height:1.5"
_UNSENT = object()  # a part the main thread has not sent yet
# The plot widget's synced parts (panel_view.PlotView's traits; it syncs its figure in these).
_PLOT_TRAITS = ("plot_layout", "timeline", "bars", "cells")


class LivePanel:
    """The widget panel: header, banner, notes, GPU selector, pause button, and the figure.

    *live*: follow the sampler from a thread (``widget``), or only after cells (``cells``).
    """

    def __init__(self, session: Any, limits: FigureLimits | None = None, live: bool = True) -> None:
        import ipywidgets as widgets

        self.live = live
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
        self._mode: HeaderMode | None = None
        self._banner_lines: list[str] = []
        self._report_read: Any = None  # the watcher's report the banner lines were read from
        self.gpu_index = first_gpu(self.sampler)
        self._gpu_choices = gpu_indices(self._history(None))  # every GPU seen so far
        self.updates = 0
        # What the main thread last sent of each synced part, by (model id, trait): after a
        # cell it sends again what differs, so parts the thread set reach every frontend.
        self._sent_on_main: dict[tuple[str, str], Any] = {}

        self.header = widgets.HTML(layout=widgets.Layout(margin="0 0 2px 0"))
        self.banner = widgets.HTML()
        self.banner.add_class("jax-nbmem-banner")
        # How the panel follows the GPU and what this kernel's memory is made of: plain notes,
        # apart from the warnings' yellow box.
        self.notes = widgets.HTML()
        self.notes.add_class("jax-nbmem-notes")
        self.gpu_selector = widgets.Dropdown(
            description="GPU", layout={"width": f"{_SELECTOR_MIN_PX}px"}
        )
        self.gpu_selector.observe(self._on_gpu_chosen, names="value")
        self.pause = widgets.ToggleButton(value=False, description="Pause", icon="pause")
        self.pause.observe(self._on_pause, names="value")
        self.pause.layout.display = "" if live else "none"  # nothing to pause after cells
        figure = self._timeline.build(self._history, self._records(), self.gpu_index)
        self.figure = figure  # the last figure drawn, for the snapshot
        self.plot = plot_view(figure_parts(figure))
        self.plot.on_ping = self._answer_ping
        self._sync_liveness()
        controls = widgets.HBox([self.gpu_selector, self.pause])
        self.actions = ShutdownActions(
            session, on_change=lambda: self.refresh_from_session(session)
        )
        self.widget = widgets.VBox(
            [self.header, self.banner, self.notes, self.actions.widget, controls, self.plot],
            layout=widgets.Layout(width="100%"),
        )
        self.widget.add_class("jax-nbmem-panel")
        self.refresh_from_session(session)
        self._note_sent_on_main()  # the state the widgets opened with, from the main thread

    def _history(self, since: float | None) -> list[Any]:
        return self.sampler.history(since) if self.sampler is not None else []

    def _records(self) -> list[Any]:
        # Only the cells the figure draws: reading all of them would grow with the notebook.
        if self._ledger is None:
            return []
        return self._ledger.recent(self._timeline.limits.max_spans)

    def snapshot_html(self) -> str:
        """The last picture drawn, as static HTML that a drawn view hides."""
        text = summary_text(self._session, self.gpu_index, "snapshot")
        records = self._records()
        last = records[-1].execution_count if records else None
        return snapshot_html(self.figure, text, self.plot.panel_id, live=True, last_cell=last)

    def set_live(self, live: bool) -> None:
        """Follow the sampler from the thread (True) or only after cells (False); main thread."""
        if live == self.live:
            return
        self.live = live
        self.pause.layout.display = "" if live else "none"
        self._sync_liveness()
        if live:
            self.start()
        else:
            self.close()
        self.update()

    def start(self) -> None:
        """Subscribe to the sampler and start the update thread (no-op when running or not live)."""
        if not self.live or self.sampler is None:
            return
        if self._thread is not None and self._thread.is_alive():
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

    def push_after_cell(self) -> None:
        """After a cell, on the kernel's main thread: update everything and send what changed.

        What the update thread set since the main thread last sent is sent again: a frontend
        that drops messages from other threads gets it now, one that took them gets a copy.
        """
        with self._lock:
            before = self._synced_values()
            self._session_changed = False
            self._read_session()
            self.actions.refresh()
            self.update(whole=True)
            for (widget, trait), value in self._synced_values().items():
                sent = self._sent_on_main.get((widget.model_id, trait), _UNSENT)
                # Changed by this update: traitlets sent it, from this thread, just now.
                if value == before[(widget, trait)] and value != sent:
                    widget.send_state(trait)
            self._note_sent_on_main()

    def _synced_values(self) -> dict[tuple[Any, str], Any]:
        """The parts a cell's end may change, by (widget, trait): their current values."""
        parts = [(self.header, "value"), (self.banner, "value"), (self.notes, "value")]
        parts += [(self.plot, trait) for trait in _PLOT_TRAITS]
        parts += [(self.actions.rows, "children"), (self.actions.result, "value")]
        return {(widget, trait): getattr(widget, trait) for widget, trait in parts}

    def _note_sent_on_main(self) -> None:
        self._sent_on_main = {
            (widget.model_id, trait): value
            for (widget, trait), value in self._synced_values().items()
        }

    def _read_session(self) -> None:
        self._report_read = self._watcher_report()  # first: a newer one is read next time
        self._mode = mode_text(self._session)
        self._banner_lines = session_banner(self._session)

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
        self._sync_liveness()
        self._dirty.set()

    def _sync_liveness(self) -> None:
        """Tell the view whether, and how often, to expect updates between cells."""
        interval = getattr(self.sampler, "interval", None) or 0.0
        self.plot.update_interval_s = max(_MIN_UPDATE_INTERVAL_S, float(interval))
        self.plot.live = bool(self.live and self.sampler is not None and not self.pause.value)

    def _answer_ping(self) -> None:
        """A view heard nothing for a while and asked: send everything from here, as after a cell.

        This runs on the kernel's main thread, between cells (the comm's message handler).
        """
        self.push_after_cell()

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

    def update(self, whole: bool = False) -> None:
        """Push what changed since the last update to the figure and the header lines.

        *whole*: send every changed part of the figure now, however large (after a cell);
        otherwise parts over one update's budget wait for the next update.
        """
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
            budget = None if whole else UPDATE_BUDGET_BYTES
            if not self.plot.show(figure_parts(figure), budget=budget):
                self._dirty.set()  # over one update's budget: the rest goes next time
            self.figure = figure
            report = self._report_read  # the watcher's: it says this kernel's memory caps
            line = header_line(latest, self.gpu_index, self._mode, report, reserved=False)
            details = header_details(latest, self.gpu_index, self._mode, report)
            self.header.value = (
                f"<b title='{html.escape(details, quote=True)}' style='{_HEADER_STYLE}'>"
                f"{html.escape(line)}</b>"
            )
            self._render_banner(latest, paused=False)
            self.updates += 1

    def _render_banner(self, latest: Any, paused: bool) -> None:
        """The warnings in a yellow box (none: no box), then the notes in plain grey."""
        warnings = unique_lines(self._banner_lines)
        items = "<br>".join(code_html(line) for line in warnings)
        value = f"<div style='{_WARNING_STYLE}'>{items}</div>" if warnings else ""
        if self.banner.value != value:
            self.banner.value = value
        kind = "widget" if self.live else "cells"
        notes = sampler_status(self.sampler, latest, kind)
        if paused:
            notes = ["Paused: press Resume to follow the GPU again."]
        report = self._watcher_report()
        context = context_line(latest, self.gpu_index, beside_jax(report, self.gpu_index))
        split = frameworks_line(report, self.gpu_index)
        notes = unique_lines(notes + [n for n in (context, split) if n])
        value = f"<div style='{_NOTES_STYLE}'>{'<br>'.join(map(_note_html, notes))}</div>"
        if self.notes.value != value:
            self.notes.value = value


def _note_html(line: str) -> str:
    """A note as HTML; the "Live" line marked, for a view that hears nothing to hide it."""
    shown = code_html(line)
    return f"<span class='jax-nbmem-live'>{shown}</span>" if line.startswith("Live:") else shown


def _gpu_option(latest: Any, index: int) -> str:
    """The selector's name for a GPU: "GPU 1", "MIG 3g.71gb instance 1 of GPU 0"."""
    gpu = latest.gpu(index) if latest is not None else None
    return gpu_label(gpu) if gpu is not None else f"GPU {index}"


def _selector_width(labels: Iterable[str]) -> str:
    """Wide enough for its longest name ("MIG 3g.71gb instance 2 of GPU 0" is 31 characters)."""
    longest = max((len(label) for label in labels), default=0)
    return f"{max(_SELECTOR_MIN_PX, _SELECTOR_DESCRIPTION_PX + _SELECTOR_CHAR_PX * longest)}px"
