"""The browser harness, proven on a plotly FigureWidget that a background thread keeps growing.

This is the shape the live memory panel takes: a widget drawn once, then updated from a
thread while the kernel sits idle. If this test passes, JupyterLab's widget manager, anywidget
and plotly render in our chromium, and updates sent from a thread reach the page.
"""

import os
import signal
import time

import psutil
import pytest

import tests.jupyterlab as harness
from tests.jupyterlab import (
    open_notebook,
    require_chromium,
    run_all_cells,
    running_lab,
    screenshot,
    wait_kernel_connected,
    write_notebook,
)

pytest_plugins = ("tests.jupyterlab",)

STEPS = 15  # one point per trace every 0.2 s: about 3 s of growth
POINTS_AT_START = 2  # one per trace

BUILD_FIGURE = """\
import plotly.graph_objects as go

fig = go.FigureWidget(
    data=[
        go.Scatter(x=[0], y=[0], mode="lines+markers", name="used"),
        go.Scatter(x=[0], y=[1], mode="lines+markers", name="reserved"),
    ],
    layout=dict(title="growing", width=700, height=380),
)
fig
"""

GROW_IN_BACKGROUND = f"""\
import threading
import time

def grow(steps={STEPS}, interval=0.2):
    # Start once the figure is on screen: the page counts its views in _view_count.
    deadline = time.monotonic() + 60
    while not fig._view_count and time.monotonic() < deadline:
        time.sleep(0.05)
    for step in range(1, steps + 1):
        time.sleep(interval)
        with fig.batch_update():
            for offset, trace in enumerate(fig.data):
                trace.x = trace.x + (step,)
                trace.y = trace.y + (offset + step % 3,)  # a zigzag: every point shows

grower = threading.Thread(target=grow, daemon=True)
grower.start()
"""

PLOT = ".jp-OutputArea-output .js-plotly-plot"


def drawn_points(page) -> int:
    """Count the markers plotly drew, over all traces."""
    return page.locator(f"{PLOT} .scatterlayer .trace .points path.point").count()


@pytest.mark.browser
@pytest.mark.timeout(180)
def test_figure_widget_grows_from_a_thread(lab_server, lab_page):
    write_notebook(lab_server.root_dir / "harness.ipynb", [BUILD_FIGURE, GROW_IN_BACKGROUND])

    kernel = open_notebook(lab_page, lab_server, "harness.ipynb")
    assert kernel["connections"] >= 1
    run_all_cells(lab_page)

    lab_page.locator(PLOT).wait_for(timeout=60_000)
    assert lab_page.locator(f"{PLOT} .scatterlayer .trace").count() == 2

    expected = 2 * (1 + STEPS)
    seen = [drawn_points(lab_page)]
    deadline = time.monotonic() + 60
    while seen[-1] < expected and time.monotonic() < deadline:
        time.sleep(0.1)
        count = drawn_points(lab_page)
        if count != seen[-1]:
            seen.append(count)

    assert seen == sorted(seen), f"points went backwards: {seen}"
    assert seen[-1] == expected, f"not every point arrived: {seen}"
    # Drawn while the thread ran: counts strictly between the first and the last points.
    between = [count for count in seen if POINTS_AT_START < count < expected]
    assert len(between) >= 2, f"no growth seen while the thread ran: {seen}"
    # The kernel is still connected and idle once the thread is done.
    assert wait_kernel_connected(lab_server, 30, notebook="harness.ipynb")["connections"] >= 1
    shot = screenshot(lab_page, "browser-harness-figurewidget")
    assert shot.stat().st_size > 10_000


def kernel_process(server) -> psutil.Process:
    """The one ipykernel process the server started."""

    def arguments(child: psutil.Process) -> str:
        try:
            return " ".join(child.cmdline())
        except psutil.Error:  # a short-lived helper that is already a zombie, or gone
            return ""

    children = psutil.Process(server.process.pid).children(recursive=True)
    kernels = [child for child in children if "ipykernel" in arguments(child)]
    assert len(kernels) == 1, [arguments(child) for child in children]
    return kernels[0]


@pytest.mark.kernel
@pytest.mark.timeout(120)
@pytest.mark.parametrize("server_crashes", [False, True], ids=["clean-stop", "after-crash"])
def test_stop_ends_the_server_and_the_kernels_it_left(tmp_path, server_crashes):
    env = dict(os.environ, JAX_NBMEM_HARNESS_PROBE=tmp_path.name)
    with running_lab(tmp_path / "notebooks", tmp_path / "lab", env=env) as server:
        server.api(
            "sessions",
            method="POST",
            body={"path": "idle.ipynb", "type": "notebook", "kernel": {"name": "python3"}},
        )
        # No page has opened the notebook: its kernel is up but nobody is connected to it.
        with pytest.raises(TimeoutError, match="no connected idle kernel"):
            wait_kernel_connected(server, timeout=3, notebook="idle.ipynb")
        kernel = kernel_process(server)
        # The kernel got the environment the caller gave the server.
        assert kernel.environ()["JAX_NBMEM_HARNESS_PROBE"] == tmp_path.name
        if server_crashes:
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait(10)
            assert kernel.is_running(), "the orphaned kernel should outlive its server"
    assert server.process.returncode is not None
    assert not kernel.is_running() or kernel.status() == psutil.STATUS_ZOMBIE
    server.stop()  # a second stop is a no-op


@pytest.mark.parametrize(
    ("ci", "outcome"),
    [(None, pytest.skip.Exception), ("true", pytest.fail.Exception)],
    ids=["local-skips", "ci-fails"],
)
def test_missing_chromium_skips_locally_but_fails_under_ci(monkeypatch, tmp_path, ci, outcome):
    monkeypatch.setattr(harness, "CHROMIUM_PATH", str(tmp_path / "no-chromium"))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="no-chromium is missing"):
        require_chromium()
