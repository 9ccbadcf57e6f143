"""The board against a server that asks for the XSRF token on every fetch, as JupyterHub does.

A plain Jupyter server given JupyterHub >= 4.1's rule (:mod:`tests.server.hub_xsrf_rule`): the
board's refreshes must keep working, where a fetch without the token is refused (403).
"""

import json
import os
import urllib.request

import pytest

from jax_nbmem.simgpu import GIB
from tests.jupyterlab import REPO_ROOT
from tests.server.test_extension import call
from tests.waiting import wait_for

pytestmark = pytest.mark.browser
pytest_plugins = ("tests.jupyterlab",)


@pytest.fixture
def hub_rule_server(start_lab_server, sim_state, simgpu_env, tmp_path):
    sim_state.gpu(0, total=80 * GIB).write()
    config = tmp_path / "hub-rule-config"
    config.mkdir()
    rule = "tests.server.hub_xsrf_rule.HubXsrfRule"
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"identity_provider_class": rule}})
    )
    path = os.pathsep.join(p for p in (str(REPO_ROOT), simgpu_env.get("PYTHONPATH")) if p)
    env = {**simgpu_env, "JAX_PLATFORMS": "cpu", "JUPYTER_CONFIG_DIR": str(config)}
    return start_lab_server(env={**env, "PYTHONPATH": path})


def _no_redirect() -> urllib.request.OpenerDirector:
    class Keep(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    return urllib.request.build_opener(Keep())


@pytest.mark.timeout(180)
def test_the_board_keeps_refreshing_where_every_fetch_needs_the_xsrf_token(
    hub_rule_server, lab_page
):
    server = hub_rule_server
    # Not logged in: the page sends the browser to the login page; the API says 403.
    status, _ = call(server, "jax-nbmem/", token=False, opener=_no_redirect())
    assert status == 302
    assert call(server, "jax-nbmem/api/status", token=False)[0] == 403

    answers = []

    def seen(reply):
        if "/jax-nbmem/api/" in reply.url:
            answers.append((reply.url.rsplit("/", 1)[1], reply.status))

    lab_page.on("response", seen)
    lab_page.goto(f"{server.base_url}/jax-nbmem/?token={server.token}")
    gpu = lab_page.get_by_role("region", name="GPU 0")
    gpu.wait_for(timeout=30_000)
    # Two refreshes more (each asks for status and history), on the login cookie alone.
    # (Playwright hands over the page's events while it is called: evaluate lets them in.)
    wait_for(
        "two refreshes of the board",
        lambda: lab_page.evaluate("0") == 0 and len(answers) >= 6,
        timeout=30,
    )
    assert lab_page.locator("#problem").inner_text() == ""
    assert "updated" in lab_page.locator("#age").inner_text()
    assert {"status", "history"} <= {name for name, code in answers if code == 200}
    assert len(answers) >= 6 and all(code == 200 for _, code in answers), answers

    # The rule is in force: the same fetch without the token is refused.
    refused = lab_page.evaluate(
        "async () => (await fetch('/jax-nbmem/api/status', {credentials: 'same-origin'})).status"
    )
    assert refused == 403
