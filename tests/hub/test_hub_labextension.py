"""The JupyterLab extension behind a real JupyterHub: the item and the sidebar render for a
logged-in user, and every request they make through the proxy succeeds (the hub's XSRF rule
applies to each fetch, GETs included, and the base URL is /user/NAME/)."""

from __future__ import annotations

import pytest

from tests.hub.conftest import Hub
from tests.hub.test_hub import _login
from tests.jupyterlab import chromium_page, screenshot

pytestmark = [pytest.mark.kernel, pytest.mark.browser]


@pytest.mark.timeout(300)
def test_the_item_and_sidebar_work_through_the_hub(hub: Hub, tmp_path):
    alice = hub.alice
    status, _ = hub.server(
        alice, "PUT", "api/contents/lab.ipynb",
        {"type": "notebook", "format": "json", "content": {
            "cells": [], "metadata": {"kernelspec": {"name": "python3", "language": "python",
                                                     "display_name": "Python 3"}},
            "nbformat": 4, "nbformat_minor": 5}},
    )  # fmt: skip
    assert status in (200, 201), status
    with chromium_page(tmp_path / "profile") as page:
        answers: list = []
        page.on(
            "response",
            lambda reply: answers.append(reply.status) if "/jax-nbmem/api/" in reply.url else None,
        )
        _login(page, hub, alice)
        page.goto(f"{hub.url}/user/{alice.name}/lab/tree/lab.ipynb")
        item = page.locator(".jax-nbmem-item")
        page.wait_for_function(
            "s => (document.querySelector(s)?.innerText || '').startsWith('GPU 0:')",
            arg=".jax-nbmem-item",
            timeout=90_000,
        )
        item.click()
        sidebar = page.locator("#jax-nbmem-sidebar")
        sidebar.get_by_text("NVIDIA H200 (simulated)").wait_for(timeout=30_000)
        page.wait_for_timeout(4000)  # a few more looks, through the proxy
        screenshot(page, "labext-hub")
    assert len(answers) >= 2 and set(answers) == {200}, answers
