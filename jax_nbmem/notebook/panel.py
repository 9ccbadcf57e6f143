"""The live memory panel of ``%jaxmem``: a widget that follows the sampler, or a fallback.

The panel reads only snapshots: the sampler's history, the ledger's records, the allocator
report and the session's banner lines (the status watcher's last report). It never calls NVML.
What every kind says (header, banner, text, snapshot) is in :mod:`jax_nbmem.notebook.panel_text`.

Four ways to show it (``c.JaxNbMem.panel``, or ``%jaxmem panel KIND`` for one display):

* ``widget`` (:mod:`jax_nbmem.notebook.panel_live`): ipywidgets for the header, banner and
  buttons, and our own plot widget (:mod:`jax_nbmem.notebook.panel_view`) whose synced state
  is the current figure, so every view of it (a second ``%jaxmem``, a page reload) draws the
  same picture. A small daemon thread pushes at most one update every 0.25 s, and only the
  parts that changed. After each cell the kernel's main thread sends what changed too
  (scheduled on the kernel's event loop at the cell's end, so the cell does not wait for
  it): frontends that drop comm messages from other threads (Colab, googlecolab/colabtools
  #3373) still show every cell.
* ``cells``: the same widget without the thread, updated only after each cell, from the
  main thread; it says so (never "live").
  Under the widget comes a static **snapshot** (its words, then its picture as an image
  output, SVG and PNG, :func:`jax_nbmem.notebook.snapshot.picture_bundle`) that a drawn view
  hides: it is what exports, a notebook reopened without its kernel, a sanitising viewer and
  a frontend that cannot draw the widget show. The snapshot is redrawn after cells on the
  cell's path, from a budget of 2% of the wall time with a burst, so a saved notebook and a
  headless run (``nbconvert --execute``) end with the picture of their last cell.
* ``static``: a picture (HTML with an inline SVG, and text) whose output is replaced after
  each cell through its display id (``update_display``), from the cell that ran. Every
  renderer draws a replaced HTML output anew (JupyterLab's plotly renderer would keep its
  first picture of a plotly figure). In Colab, comm messages from later cells do not reach
  widget views made earlier (colabtools#498), so ``auto`` chooses this there.
* ``text``: a text table, refreshed the same way in a kernel; in terminal IPython, where an
  update would print the table again after every command, printed once, when asked.

After a cell the panel is only marked dirty: the update thread re-reads a few facts of the
session (the mode, the banner lines, both in memory) and rebuilds the figure from the last
cells' records only, so the cost after a cell does not grow with the notebook. The banner (its
warnings, the kernels they name, their shut-down buttons) also follows the status watcher's
reports while no cell runs: each new report is read on the update thread, within the same
rate limits as the header's updates.

``auto`` picks ``static`` in Colab, ``widget`` in other Jupyter kernels (JupyterLab, Notebook
7, VS Code, Voilà) and ``text`` in a terminal. Each session has one widget panel: showing it
again displays the same widget again, with the same single update thread (or none, as
``cells``).
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
from jax_nbmem.notebook.panel_text import WIDGET_STAND_IN, fallback_bundle, summary_text
from jax_nbmem.notebook.snapshot import picture_bundle

__all__ = ["KINDS", "cell_finished", "close_panels", "frontend", "show_panel"]

# What c.JaxNbMem.panel and `%jaxmem panel KIND` accept.
KINDS = ("auto", "widget", "cells", "static", "text")

log = logging.getLogger("jax_nbmem")

_FIRST_SAMPLE_WAIT_S = 0.5
# The snapshot is redrawn on the cell's path, from a budget that fills with this
# share of the wall time up to a burst: a run's last cells are in its picture, while a long run
# of quick cells redraws it only every few cells.
_HEADLESS_SNAPSHOT_SHARE = 0.02
_HEADLESS_SNAPSHOT_BURST_S = 0.25
# The widget's push after a cell runs between cells, on the main thread: at most this share of
# the wall time. A quick Run All gets one push per few cells (each shows every cell so far)
# and the last cell always gets its own, at most cost / share seconds after it ends.
_PUSH_SHARE = 0.05


@dataclass
class _PanelState:
    """What :func:`show_panel` left on the session (``session._panel_state``)."""

    live: LivePanel | None = None
    handle: Any = None  # DisplayHandle of the static or text fallback
    kind: str | None = None  # the kind shown last
    fallback_kind: str | None = None  # "static" or "text": what the handle shows
    listener: Any = None  # our cell listener on the session, once registered
    snapshot: Any = None  # DisplayHandle of the widget's static snapshot
    picture: Any = None  # DisplayHandle of the snapshot's picture (an image output)
    snapshot_at: float = 0.0  # time.monotonic() of its last refresh
    snapshot_cost: float = 0.0  # seconds its last refresh on the cell's path took
    snapshot_budget: float = _HEADLESS_SNAPSHOT_BURST_S  # seconds it may take on the path
    timeline: Any = None  # LiveFigure of the static fallback, kept between its updates
    refresh_after_cells: bool = True  # False in a terminal: an update would print again
    main_loop: Any = None  # the kernel's main-thread event loop, for the push after a cell
    push_pending: bool = False  # a push after a cell is scheduled and has not run yet
    push_at: float = 0.0  # time.monotonic() when the last push began
    push_cost: float = 0.0  # seconds it took


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
    if setting in KINDS and setting != "auto":
        return setting
    where = frontend()
    if where == "terminal":
        return "text"
    # Colab drops widget updates sent from threads (colabtools#3373), and comm messages from
    # later cells miss views made earlier (#498): an output replaced from each cell shows.
    # VS Code, Voilà and Jupyter draw the widget; where one does not, its snapshot shows.
    return "static" if where == "colab" else "widget"


def show_panel(session: Any, kind: str | None = None) -> None:
    """Show the memory panel under the current cell (``%jaxmem``, ``%jaxmem panel KIND``).

    Main thread only. The kind is *kind* (one of :data:`KINDS`) or else follows
    ``session.settings.panel``; a widget that cannot be built falls back to the static
    picture, and that to text. Never raises.
    """
    state = _state(session)
    kind = _choose_kind(kind or getattr(session.settings, "panel", "auto"))
    _ensure_a_sample(getattr(session, "sampler", None))
    _listen_to_cells(session, state)
    state.main_loop = _main_loop()
    if kind in ("widget", "cells"):
        try:
            _show_widget(session, state, live=kind == "widget")
            return
        except Exception:
            log.debug("jax_nbmem: widget panel failed; showing the static one", exc_info=True)
            kind = "static"
    state.kind = state.fallback_kind = kind
    state.refresh_after_cells = _in_a_kernel()
    if state.timeline is None:
        state.timeline = LiveFigure()
    try:
        bundle = fallback_bundle(session, _words(state), state.timeline)
    except Exception:
        log.debug("jax_nbmem: static panel failed; showing text", exc_info=True)
        state.kind = state.fallback_kind = "text"
        bundle = {"text/plain": summary_text(session, None, _words(state))}
    state.handle = display(bundle, raw=True, display_id=True)


def _words(state: _PanelState) -> str:
    """The kind whose words a fallback says: its own, or ``terminal`` where printed once."""
    return state.fallback_kind if state.refresh_after_cells else "terminal"


def _main_loop() -> Any:
    """The kernel's main-thread event loop (ipykernel's ``io_loop``), or None (a terminal)."""
    shell = get_ipython()
    return getattr(getattr(shell, "kernel", None), "io_loop", None)


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


def _show_widget(session: Any, state: _PanelState, live: bool) -> None:
    panel = state.live
    if panel is None or panel.sampler is not getattr(session, "sampler", None):
        if panel is not None:
            panel.close()
        panel = LivePanel(session, live=live)
        state.live = panel
    else:
        panel.set_live(live)
        panel.refresh_from_session(session)
    panel.start()
    state.kind = "widget" if live else "cells"
    state.refresh_after_cells = _in_a_kernel()
    # Where the widget is not drawn (a frontend without widgets, a saved notebook reopened
    # untrusted), this line shows in its place: no figures of its own, which would go stale
    # above the snapshot that follows and is kept current (issue 49: two headers).
    display({**panel.widget._repr_mimebundle_(), "text/plain": WIDGET_STAND_IN}, raw=True)
    # Every snapshot of this panel shares one display id: a refresh updates them all.
    state.snapshot = display(
        _snapshot_bundle(panel), raw=True, display_id=f"jax-nbmem-snapshot-{panel.plot.panel_id}"
    )
    # Right after the words: a drawn view hides the output that follows them (panel_view.js).
    state.picture = display(
        picture_bundle(panel.figure),
        raw=True,
        display_id=f"jax-nbmem-picture-{panel.plot.panel_id}",
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
    """After each cell (from ``post_run_cell``, the cell's reading taken): refresh the panel.

    The widget panel is marked dirty for its thread, and its push from the main thread is
    scheduled on the kernel's event loop (:func:`_schedule_push`); its snapshot, see
    :func:`_refresh_snapshot`, is kept here. The static and text panels replace their output
    through their display id, here, from the cell that ran. Never raises.
    """
    try:
        state = getattr(session, "_panel_state", None)
        if state is None:
            return
        if state.live is not None:
            state.live.cell_finished()
            if state.refresh_after_cells:  # not in a terminal: there nothing shows a widget
                _schedule_push(state)
                if state.snapshot is not None:
                    _refresh_snapshot(state)
        # The static or text panel shown last, whatever was shown since (a widget too).
        if state.handle is not None and state.fallback_kind and state.refresh_after_cells:
            bundle = fallback_bundle(session, state.fallback_kind, state.timeline)
            state.handle.update(bundle, raw=True)
    except Exception:
        log.debug("jax_nbmem: panel refresh after a cell failed", exc_info=True)


def _schedule_push(state: _PanelState) -> None:
    """Have the kernel's main thread push the widget panel once the cell's turn is over.

    One push is pending at most: cells that end before it runs share it (it sends the state
    as of when it runs, every cell ended so far included). It runs on the main thread, after
    the cell's reply, so the cell pays only for scheduling it; pushes take at most
    ``_PUSH_SHARE`` of the wall time (a costly one delays the next). Without the kernel's
    loop (a kernel other than ipykernel), it runs here.
    """
    if state.push_pending:
        return
    live, loop = state.live, state.main_loop

    def push() -> None:
        state.push_pending = False
        state.push_at = time.monotonic()
        try:
            if state.live is live:  # not closed or replaced meanwhile
                live.push_after_cell()
        except Exception:
            log.debug("jax_nbmem: the panel's push after a cell failed", exc_info=True)
        state.push_cost = time.monotonic() - state.push_at

    if loop is None:
        push()
        return
    state.push_pending = True
    wait = state.push_at + state.push_cost / _PUSH_SHARE - time.monotonic()
    if wait > 0:
        loop.call_later(wait, push)  # within the share: cells meanwhile share this push
    else:
        loop.add_callback(push)


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
    state.push_pending = False
