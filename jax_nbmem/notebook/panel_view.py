"""The panel's plot as a widget of our own: its synced state is the current picture.

plotly's ``FigureWidget`` keeps the figure as of its last display and sends every later change
as a transient message, so a view made later (a second ``%jaxmem``, a page reload, another
browser) starts from stale data and never catches up. :class:`PlotView` holds the figure's
parts (see :func:`jax_nbmem.notebook.figure.figure_parts`) as ordinary synced traits instead:
every view draws from the model's current state, and an update sends only the parts that
changed. Its front end (``static/panel_view.js``) draws them with the plotly.js that the
installed plotly package ships; nothing comes from a CDN and there is no JavaScript build.

A view tells the kernel when it has drawn (``views_drawn``): until one has, the panel's
static snapshot is what the user sees, and it is kept current after every cell.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import uuid
from pathlib import Path
from typing import Any

__all__ = ["plot_view"]

log = logging.getLogger("jax_nbmem")

_STATIC = Path(__file__).with_name("static")
# figure_parts() name → the synced trait that holds it, in the order an update sends them:
# the scale and the memory lines first, they move with every sample.
_TRAITS = {"layout": "plot_layout", "timeline": "timeline", "bars": "bars", "cells": "cells"}
UPDATE_BUDGET_BYTES = 32 * 1024 - 1024  # a message adds its envelope to the value


@functools.lru_cache(maxsize=1)
def _front_end() -> tuple[str, str]:
    """The view's ES module (plotly.js inlined as a string) and its CSS, read once."""
    from plotly.offline import get_plotlyjs

    script = (_STATIC / "panel_view.js").read_text(encoding="utf-8")
    source = json.dumps(get_plotlyjs())  # a JS string literal; the bundle is run on demand
    css = (_STATIC / "panel_view.css").read_text(encoding="utf-8")
    return f"const PLOTLY_SOURCE = {source};\n{script}", css


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

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(panel_id=uuid.uuid4().hex, **kwargs)
            self._views_lock = threading.Lock()
            # How many views have drawn the plot so far (a reload draws a new one). A plain
            # attribute, not a property: the panel reads it after every cell.
            self.views_drawn = 0
            self.on_msg(self._on_view_message)

        def _on_view_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
            if isinstance(content, dict) and content.get("event") == "rendered":
                with self._views_lock:
                    self.views_drawn += 1

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


def plot_view(parts: dict[str, Any]) -> Any:
    """A new :class:`PlotView` showing *parts*; raises if anywidget or plotly is missing."""
    # In the constructor, so the first state travels with the widget's opening message.
    return _plot_view_class()(**{trait: parts[part] for part, trait in _TRAITS.items()})
