"""The panel's plot as a widget of our own: its synced state is the current picture.

plotly's ``FigureWidget`` keeps the figure as of its last display and sends every later change
as a transient message, so a view made later (a second ``%jaxmem``, a page reload, another
browser) starts from stale data and never catches up. :class:`PlotView` holds the figure's
parts (see :func:`jax_nbmem.notebook.figure.figure_parts`) as ordinary synced traits instead:
every view draws from the model's current state, and an update sends only the parts that
changed. Its front end (``static/panel_view.js``) draws them with the plotly.js that the
installed plotly package ships; nothing comes from a CDN and there is no JavaScript build.

plotly.js (4.6 MB) is not in the widget's state, which a notebook saves (``nbconvert
--execute`` always does): a view loads it from the Jupyter server
(``/jax-nbmem/static/plotly.min.js``, served by the server extension, kept by the browser),
and where there is no such server (VS Code, Colab, Voilà, a server without jax_nbmem) takes
the copy its kernel sends, in a message of its own that no notebook stores. The kernel sends
it unasked with its first panel (:func:`plot_view`), from the cell that shows it: a view's
request would wait behind every queued cell (Run All), since a kernel reads widget messages
only between cells. A view that missed that copy (a page reloaded later) asks for it
(:data:`PLOTLY_REQUEST`).

A view tells the kernel when it has drawn (``views_drawn``): until one has, the panel's
static snapshot is what the user sees, and it is kept current after every cell.

A view keeps its own clock (issue 49). "Live" is written by the kernel over the very channel a
frontend may drop (Colab drops comm messages sent from a kernel's threads; a busy or hung
kernel sends nothing), so only the view can tell that nothing arrives. While the panel is meant
to follow the GPU (``live``), a view that has heard nothing for a few update intervals
(``update_interval_s``) pings the kernel (:data:`PING`); the kernel answers on the comm's
message handler, which runs on its main thread between cells, and the panel sends what changed
from there (``on_ping``) with a :data:`PONG`. A view that still hears nothing stops saying
"Live" and says how old its picture is and what to do.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import uuid
from pathlib import Path
from typing import Any

__all__ = ["PING", "PLOTLY_REPLY", "PLOTLY_REQUEST", "PONG", "plot_view", "plotly_source"]

log = logging.getLogger("jax_nbmem")

_STATIC = Path(__file__).with_name("static")
# figure_parts() name → the synced trait that holds it, in the order an update sends them:
# the scale and the memory lines first, they move with every sample.
_TRAITS = {"layout": "plot_layout", "timeline": "timeline", "bars": "bars", "cells": "cells"}
UPDATE_BUDGET_BYTES = 32 * 1024 - 1024  # a message adds its envelope to the value
# A view without the server's copy of plotly.js sends PLOTLY_REQUEST; the kernel answers
# PLOTLY_REPLY with the file as the message's one binary buffer (or an "error" and none).
PLOTLY_REQUEST = "send-plotly.js"
PLOTLY_REPLY = "plotly.js"
# A view that has heard nothing for a while sends PING (with its "id"); the kernel answers PONG
# with the same id, after sending what changed (static/panel_view.js keeps the clock).
PING = "ping"
PONG = "pong"
# Whether this kernel has sent plotly.js unasked: once per kernel, with its first panel.
_unasked_send = threading.Lock()
_sent_unasked = False


@functools.lru_cache(maxsize=1)
def _front_end() -> tuple[str, str]:
    """The view's ES module and its CSS, read once (a few KB: no plotly.js in them)."""
    script = (_STATIC / "panel_view.js").read_text(encoding="utf-8")
    css = (_STATIC / "panel_view.css").read_text(encoding="utf-8")
    return script, css


def plotly_source() -> bytes:
    """The installed plotly package's plotly.js, read when a view asks (not kept in memory)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode("utf-8")


@functools.lru_cache(maxsize=1)
def _plot_view_class() -> type:
    """Define the widget class on first use: importing this module reads no large file."""
    import anywidget
    import traitlets

    esm, css = _front_end()

    class PlotView(anywidget.AnyWidget):
        """The figure's parts as synced state (see the module's docstring)."""

        _esm = esm
        _css = css
        panel_id = traitlets.Unicode("").tag(sync=True)
        timeline = traitlets.List().tag(sync=True)
        cells = traitlets.List().tag(sync=True)
        bars = traitlets.List().tag(sync=True)
        # Not ``layout``: every DOM widget has that trait already (its CSS Layout model).
        plot_layout = traitlets.Dict().tag(sync=True)
        # Whether the panel follows the GPU between cells (not ``cells``, not paused), and how
        # often it sends when it does: what a view's clock measures silence against.
        live = traitlets.Bool(False).tag(sync=True)
        update_interval_s = traitlets.Float(0.25).tag(sync=True)

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(panel_id=uuid.uuid4().hex, **kwargs)
            self._views_lock = threading.Lock()
            # How many views have drawn the plot so far (a reload draws a new one). A plain
            # attribute, not a property: the panel reads it after every cell.
            self.views_drawn = 0
            # Called on the kernel's main thread when a view pings (see the module); None: none.
            self.on_ping: Any = None
            self.on_msg(self._on_view_message)

        def _on_view_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
            event = content.get("event") if isinstance(content, dict) else None
            if event == "rendered":
                with self._views_lock:
                    self.views_drawn += 1
            elif event == PLOTLY_REQUEST:
                self._send_plotly()
            elif event == PING:
                _answer_ping(self, content.get("id"))

        def _send_plotly(self) -> None:
            """Answer a view that could not load plotly.js from the server (never raises)."""
            try:
                try:
                    source = plotly_source()
                except Exception as error:  # plotly went missing, or its file is unreadable
                    log.debug("jax_nbmem: no plotly.js for a view", exc_info=True)
                    reason = f"{type(error).__name__}: {error}"
                    self.send({"event": PLOTLY_REPLY, "error": reason})
                    return
                self.send({"event": PLOTLY_REPLY}, buffers=[source])
            except Exception:  # the comm closed meanwhile: the view is gone
                log.debug("jax_nbmem: plotly.js not sent", exc_info=True)

        def show(self, parts: dict[str, Any], budget: int | None = UPDATE_BUDGET_BYTES) -> bool:
            """Sync the parts that differ from what was sent; False if some must wait.

            Each part goes in a message of its own. An update sends parts in order until the
            next would take it over *budget* bytes (the first changed part always goes); the
            caller sends the rest in its next update, a quarter of a second later.
            """
            used = 0
            for part, trait in _TRAITS.items():
                value = parts[part]
                if getattr(self, trait) == value:
                    continue
                size = len(json.dumps(value)) if budget is not None else 0
                if budget is not None and used and used + size > budget:
                    return False
                setattr(self, trait, value)
                used += size
            return True

    return PlotView


def _answer_ping(view: Any, ping_id: Any) -> None:
    """Send what changed, then the pong, from this (the main) thread; never raises."""
    try:
        if view.on_ping is not None:
            view.on_ping()
    except Exception:
        log.debug("jax_nbmem: the panel's answer to a ping failed", exc_info=True)
    try:
        view.send({"event": PONG, "id": ping_id if isinstance(ping_id, int) else None})
    except Exception:  # the comm closed meanwhile: the view is gone
        log.debug("jax_nbmem: pong not sent", exc_info=True)


def plot_view(parts: dict[str, Any]) -> Any:
    """A new :class:`PlotView` showing *parts*; raises if anywidget or plotly is missing.

    The kernel's first view also sends plotly.js, once: its pages can draw without the
    server's copy even while later cells run (see the module's docstring).
    """
    # In the constructor, so the first state travels with the widget's opening message.
    view = _plot_view_class()(**{trait: parts[part] for part, trait in _TRAITS.items()})
    global _sent_unasked
    with _unasked_send:
        first, _sent_unasked = not _sent_unasked, True
    if first:
        view._send_plotly()
    return view
