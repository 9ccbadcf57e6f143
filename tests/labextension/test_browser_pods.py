"""The board and the JupyterLab sidebar on a Kubernetes node, in Debian chromium: a process in a
pod says its container, pod and namespace (and its PID there); a process on the host says none.

The status they read is the server extension's snapshot of tests/server/pods.py (the monitor,
the simulated GPU, the host's view of pods from the stand-in Kubernetes API), served to the
page in place of this server's own: no cluster runs here.
"""

import json

import pytest

from tests.jupyterlab import artifacts_dir, screenshot
from tests.server.pods import pod_snapshot

pytestmark = [pytest.mark.browser]
pytest_plugins = ("tests.jupyterlab",)

ALICE = "container notebook in pod jhub/jupyter-alice (PID 7 there)"
TRAIN = "container main in pod ml/train-7 (PID 1 there)"


@pytest.mark.timeout(180)
def test_the_board_and_the_sidebar_name_each_process_s_pod(
    simgpu_in_process, tmp_path, lab_server, lab_page
):
    snapshot, pids = pod_snapshot(simgpu_in_process, tmp_path)
    body = json.dumps(snapshot)
    lab_page.route(
        "**/jax-nbmem/api/status*",
        lambda route: route.fulfill(status=200, content_type="application/json", body=body),
    )

    lab_page.goto(f"{lab_server.base_url}/jax-nbmem/?token={lab_server.token}")
    gpu = lab_page.get_by_role("region", name="GPU 0")
    gpu.wait_for(timeout=30_000)
    rows = {pid: gpu.get_by_role("row").filter(has_text=str(pid)) for pid in pids.__dict__.values()}
    alice = rows[pids.alice].inner_text()
    assert ALICE in alice and "alice/train.ipynb" in alice and "alice (Unix user" in alice
    assert TRAIN in rows[pids.train].inner_text()
    assert "container" not in rows[pids.plain].inner_text()  # on the host: nothing more
    screenshot(lab_page, "board-pods")

    lab_page.goto(f"{lab_server.base_url}/lab?token={lab_server.token}")
    lab_page.locator('.lm-TabBar-tab[data-id="jax-nbmem-sidebar"]').click(timeout=60_000)
    sidebar = lab_page.locator("#jax-nbmem-sidebar")
    items = {pid: sidebar.locator("li", has_text=f"PID {pid}") for pid in pids.__dict__.values()}
    items[pids.alice].wait_for(timeout=30_000)
    assert items[pids.alice].locator(".jax-nbmem-container").inner_text() == ALICE
    assert "alice/train.ipynb" in items[pids.alice].inner_text()
    assert items[pids.train].locator(".jax-nbmem-container").inner_text() == TRAIN
    assert items[pids.plain].locator(".jax-nbmem-container").count() == 0
    assert "container" not in items[pids.plain].inner_text()
    sidebar.screenshot(path=str(artifacts_dir() / "labext-sidebar-pods.png"))
    screenshot(lab_page, "labext-sidebar-pods-page")
