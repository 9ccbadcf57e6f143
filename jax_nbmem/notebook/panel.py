"""The live memory panel of ``%jaxmem``: a widget that follows the sampler, or a fallback.

The panel reads only snapshots: the sampler's history, the ledger's records, the allocator
report and the session's banner lines (the status watcher's last report). It never calls NVML.
What every kind says (header, banner, text, snapshot) is in :mod:`jax_nbmem.notebook.panel_text`.

Three ways to show it (``c.JaxNbMem.panel``):

* ``widget`` (:mod:`jax_nbmem.notebook.panel_live`): ipywidgets for the header, banner and
  buttons, and our own plot widget (:mod:`jax_nbmem.notebook.panel_view`) whose synced state
  is the current figure, so every view of it (a second ``%jaxmem``, a page reload) draws the
  same picture. A small daemon thread pushes at most one update every 0.25 s, and only the
  parts that changed.
  Under the widget comes a static **snapshot** (its words, then its picture as an image
  output, SVG and PNG, :func:`jax_nbmem.notebook.snapshot.picture_bundle`) that a drawn view
  hides: it is what exports, a notebook reopened without its kernel, a sanitising viewer and
  a frontend that cannot draw the widget show. The snapshot is redrawn after cells on the
  cell's path, from a budget of 2% of the wall time with a burst, so a saved notebook and a
  headless run (``nbconvert --execute``) end with the picture of their last cell.
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
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from IPython import get_ipython
from IPython.display import display

from jax_nbmem.notebook.figure import LiveFigure
from jax_nbmem.notebook.panel_live import LivePanel
from jax_nbmem.notebook.panel_text import fallback_bundle, summary_text
from jax_nbmem.notebook.snapshot import picture_bundle

__all__ = ["cell_finished", "close_panels", "frontend", "show_panel"]

log = logging.getLogger("jax_nbmem")

_FIRST_SAMPLE_WAIT_S = 0.5
# The snapshot is redrawn on the cell's path, from a budget that fills with this
# share of the wall time up to a burst: a run's last cells are in its picture, while a long run
# of quick cells redraws it only every few cells.
_HEADLESS_SNAPSHOT_SHARE = 0.02
_HEADLESS_SNAPSHOT_BURST_S = 0.25


@dataclass
class _PanelState:
    """What :func:`show_panel` left on the session (``session._panel_state``)."""

    live: LivePanel | None = None
    handle: Any = None  # DisplayHandle of the static or text fallback
    kind: str | None = None
    listener: Any = None  # our cell listener on the session, once registered
    snapshot: Any = None  # DisplayHandle of the widget's static snapshot
    picture: Any = None  # DisplayHandle of the snapshot's picture (an image output)
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
        bundle = fallback_bundle(session, kind == "static", state.timeline)
    except Exception:
        log.debug("jax_nbmem: static panel failed; showing text", exc_info=True)
        state.kind, bundle = "text", {"text/plain": summary_text(session, None)}
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
        live = LivePanel(session)
        state.live = live
    else:
        live.refresh_from_session(session)
    live.start()
    state.kind = "widget"
    state.refresh_after_cells = _in_a_kernel()
    # Text and HTML ride along for frontends that cannot draw widgets at all.
    fallback = fallback_bundle(session, with_figure=False)
    display({**live.widget._repr_mimebundle_(), **fallback}, raw=True)
    # Every snapshot of this panel shares one display id: a refresh updates them all.
    state.snapshot = display(
        _snapshot_bundle(live), raw=True, display_id=f"jax-nbmem-snapshot-{live.plot.panel_id}"
    )
    # Right after the words: a drawn view hides the output that follows them (panel_view.js).
    state.picture = display(
        picture_bundle(live.figure), raw=True, display_id=f"jax-nbmem-picture-{live.plot.panel_id}"
    )
    state.snapshot_at = time.monotonic()


def _snapshot_bundle(live: LivePanel) -> dict[str, str]:
    return {
        "text/plain": "(jax_nbmem: a snapshot of the panel, for views without the live widget)",
        "text/html": live.snapshot_html(),
    }


def _update_snapshot(state: _PanelState, live: LivePanel) -> None:
    state.snapshot.update(_snapshot_bundle(live), raw=True)
    if state.picture is not None:
        state.picture.update(picture_bundle(live.figure), raw=True)


def _refresh_snapshot(state: _PanelState) -> None:
    """Keep the widget's snapshot current for places where no view draws the widget.

    Until a view has drawn, nothing on screen is live (a headless run, an export, a frontend
    without the widget), so the figure is brought up to date here, on the cell's path, where
    the export sees it: from a budget of ``_HEADLESS_SNAPSHOT_SHARE`` of the wall time (with a
    burst of ``_HEADLESS_SNAPSHOT_BURST_S``), so the last cells of a run are in its picture
    and only a long run of quick cells skips some in between. The picture says which cell it
    shows last. The same holds once a view draws: the snapshot is what the saved notebook
    keeps, and what a sanitising viewer of it shows.
    """
    live = state.live
    if live is None or state.snapshot is None or not state.refresh_after_cells:
        return  # a terminal: an update would print the snapshot again, and nothing exports it
    now = time.monotonic()
    refill = (now - state.snapshot_at) * _HEADLESS_SNAPSHOT_SHARE
    budget = min(_HEADLESS_SNAPSHOT_BURST_S, state.snapshot_budget + refill)
    if budget < state.snapshot_cost:
        state.snapshot_budget, state.snapshot_at = budget, now
        return
    live.refresh_after_cell()
    _update_snapshot(state, live)
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
            bundle = fallback_bundle(session, state.kind == "static", state.timeline)
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
    state.picture = None
    state.listener = None
