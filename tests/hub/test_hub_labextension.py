"""The JupyterLab extension behind a real JupyterHub: the item and the sidebar render for a
logged-in user, the notebook panel's plot loads plotly.js from the user's server, and every
request they make through the proxy succeeds (the hub's XSRF rule applies to each fetch, GETs
included, and the base URL is /user/NAME/)."""

from __future__ import annotations

import time

import pytest

from tests.hub.conftest import Hub
from tests.hub.test_hub import _login
from tests.jupyterlab import chromium_page, run_all_cells, screenshot
from tests.notebook.test_panel_browser import plotly_source, wait_for_plots

pytestmark = [pytest.mark.kernel, pytest.mark.browser]


@pytest.mark.timeout(300)
def test_the_item_and_sidebar_work_through_the_hub(hub: Hub, tmp_path):
    alice = hub.alice
    status, _ = hub.server(
        alice, "PUT", "api/contents/lab.ipynb",
        {"type": "notebook", "format": "json", "content": {
            "cells": [{"cell_type": "code", "source": "%load_ext jax_nbmem\n%jaxmem",
                       "metadata": {}, "outputs": [], "execution_count": None}],
            "metadata": {"kernelspec": {"name": "python3", "language": "python",
                                                     "display_name": "Python 3"}},
            "nbformat": 4, "nbformat_minor": 5}},
    )  # fmt: skip
    assert status in (200, 201), status
    with chromium_page(tmp_path / "profile") as page:
        answers: list = []
        page.on(
            "response",
            lambda reply: answers.append(reply.status) if "/jax-nbmem/" in reply.url else None,
        )
        _login(page, hub, alice)
        page.goto(f"{hub.url}/user/{alice.name}/lab/tree/lab.ipynb")
        item = page.locator(".jax-nbmem-item")
        page.wait_for_function(
            "s => (document.querySelector(s)?.innerText || '').startsWith('GPU 0 (simulated):')",
            arg=".jax-nbmem-item",
            timeout=90_000,
        )
        item.click()
        sidebar = page.locator("#jax-nbmem-sidebar")
        sidebar.get_by_text("NVIDIA H200 (simulated)").wait_for(timeout=30_000)
        _wait_kernel_connected(hub, alice)
        page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for()
        run_all_cells(page, timeout=120)
        wait_for_plots(page, 1, 90)
        assert plotly_source(page) == "server"  # /user/NAME/jax-nbmem/static/plotly.min.js
        page.wait_for_timeout(4000)  # a few more looks, through the proxy
        screenshot(page, "labext-hub")
    assert len(answers) >= 3 and set(answers) == {200}, answers


def _wait_kernel_connected(
    hub: Hub, user, notebook: str = "lab.ipynb", timeout: float = 90.0
) -> None:
    """Until the notebook's kernel is idle with the page's websocket open (as open_notebook).

    The notebook's own session: earlier hub tests may have left other sessions on this server.
    """
    deadline = time.monotonic() + timeout
    kernel = None
    while time.monotonic() < deadline:
        status, sessions = hub.server(user, "GET", "api/sessions")
        listed = sessions if status == 200 and isinstance(sessions, list) else []
        ours = [s for s in listed if str(s.get("path", "")).endswith(notebook)]
        if ours:
            status, kernel = hub.server(user, "GET", f"api/kernels/{ours[0]['kernel']['id']}")
            if status == 200 and kernel.get("connections", 0) >= 1:
                if kernel.get("execution_state") == "idle":
                    return
        time.sleep(0.25)
    raise TimeoutError(f"no connected idle kernel in {timeout:.0f}s: {kernel}")
