"""The plot widget's stored state holds no plotly.js; a view that cannot get it elsewhere asks
its kernel, which sends it in a message of its own (what VS Code and Colab use).

The browser's side of both ways (the server's copy, the kernel's) is in test_panel_browser.py.
"""

import json

import pytest

from jax_nbmem.notebook import panel_view
from jax_nbmem.notebook.panel_view import PLOTLY_REPLY, PLOTLY_REQUEST, plot_view

PARTS = {"layout": {"height": 440}, "timeline": [], "cells": [], "bars": []}


@pytest.fixture
def view_and_sent():
    view = plot_view(PARTS)
    sent = []
    # What goes onto the widget's comm (without a kernel, ipywidgets 8.0 would drop it).
    view._send = lambda msg, buffers=None: sent.append((msg, buffers))
    yield view, sent
    view.close()


def test_the_stored_state_is_a_few_kb_without_plotly_js(view_and_sent):
    view, _ = view_and_sent
    state = view.get_state()
    assert len(json.dumps(state, default=str)) < 20_000
    assert "plotly.js v" not in state["_esm"] and PLOTLY_REQUEST in state["_esm"]
    assert "jax-nbmem/static/plotly.min.js" in state["_esm"]  # the server's copy, first


def test_a_view_that_asks_gets_the_installed_plotly_js_as_one_binary_buffer(view_and_sent):
    from plotly.offline import get_plotlyjs

    view, sent = view_and_sent
    view._handle_custom_msg({"event": PLOTLY_REQUEST}, [])
    ((data, buffers),) = sent
    assert data["method"] == "custom" and data["content"] == {"event": PLOTLY_REPLY}
    assert len(buffers) == 1 and bytes(buffers[0]) == get_plotlyjs().encode()
    assert view.views_drawn == 0  # asking is not drawing
    view._handle_custom_msg({"event": "rendered"}, [])
    assert view.views_drawn == 1 and len(sent) == 1


def test_without_plotly_js_the_view_is_told_why(view_and_sent, monkeypatch):
    view, sent = view_and_sent

    def missing():
        raise FileNotFoundError("plotly.min.js")

    monkeypatch.setattr(panel_view, "plotly_source", missing)
    view._handle_custom_msg({"event": PLOTLY_REQUEST}, [])
    ((data, buffers),) = sent
    assert data["content"]["event"] == PLOTLY_REPLY
    assert "FileNotFoundError" in data["content"]["error"] and not buffers
    view._send = None  # a comm gone: nothing raises into the kernel
    view._handle_custom_msg({"event": PLOTLY_REQUEST}, [])


def test_the_kernels_first_view_sends_plotly_js_unasked_and_later_ones_do_not(monkeypatch):
    # Sent from the cell that shows the panel: a request would wait behind queued cells.
    monkeypatch.setattr(panel_view, "_sent_unasked", False)
    sent = []
    cls = panel_view._plot_view_class()
    monkeypatch.setattr(cls, "_send", lambda self, msg, buffers=None: sent.append((msg, buffers)))
    first, second = plot_view(PARTS), plot_view(PARTS)
    try:
        custom = [(m, b) for m, b in sent if m.get("method") == "custom"]
        ((data, buffers),) = custom
        assert data["content"] == {"event": PLOTLY_REPLY} and len(buffers) == 1
        assert b"plotly.js v" in bytes(buffers[0])[:1000]
        assert len(json.dumps(first.get_state(), default=str)) < 20_000  # not in the state
    finally:
        first.close()
        second.close()
