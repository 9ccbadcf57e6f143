"""Issue 49: a view that knows how fresh it is, in a frontend that drops the panel's updates.

The kernel is an ordinary one whose comms drop every message sent from a thread other than the
main one (Colab's behaviour, tests/notebook/test_panel_main_thread.py's stand-in) and which has
no Colab module: jax_nbmem cannot tell, picks the live widget and says "Live". Only the view
can see that nothing arrives. In JupyterLab, as a user would meet it:

* while a long cell runs, nothing reaches the view: within seconds it stops saying "Live",
  says how old its picture is and what to do; when the cell ends, it is live again;
* while the notebook sits idle, a neighbour that ends reaches the plot all the same: the view
  pings, and the kernel answers on its main thread with what changed.

JupyterLab 4.6 sends comm messages to a kernel subshell where the kernel has them (ipykernel 7):
their handlers then run on a thread of the kernel's own, whose sends the stand-in would drop
too, and which answers even while a cell runs. Colab's kernel has no subshells; JupyterLab is
told not to use them here (its "commsOverSubshells" setting), so that every comm message is
handled on the main thread between cells, as there.
"""

import json
import re
import time

import pytest

from jax_nbmem.simgpu import GIB, SimState
from tests.jupyterlab import open_notebook, screenshot, wait_cells_executed, write_notebook
from tests.notebook.test_panel_browser import PANEL, PLOT, plot_state
from tests.notebook.test_panel_kernel import OTHER_PID
from tests.notebook.test_panel_main_thread import DROP_THREAD_SENDS

pytest_plugins = ("tests.jupyterlab",)

NO_SUBSHELLS = "@jupyterlab/apputils-extension/kernels-settings.jupyterlab-settings"
FRESHNESS = f"{PANEL} .jax-nbmem-freshness"
LIVE_LINE = f"{PANEL} .jax-nbmem-live"
# A cell that takes 4 GiB of the simulated GPU, then keeps the kernel busy for 12 s.
LONG_CELL = """\
import os, time
from jax_nbmem.simgpu import GIB, SimState
SimState(os.environ["JAX_NBMEM_SIMGPU_STATE"]).gpu(0, total=80 * GIB).process(
    0, {other}, 20 * GIB).process(0, os.getpid(), 4 * GIB).write()
time.sleep(12)
"""


def shown(page, selector: str) -> bool:
    return page.evaluate(
        "s => { const e = document.querySelector(s);"
        " return Boolean(e && e.offsetParent !== null && e.innerText.trim()); }",
        selector,
    )


def others_last(page) -> float | None:
    state = plot_state(page)
    if not state or "other processes" not in state["names"]:
        return None
    return state["last"][state["names"].index("other processes")][1]


@pytest.mark.browser
@pytest.mark.timeout(240)
def test_a_view_that_hears_nothing_stops_saying_live_and_pings_when_idle(
    start_lab_server, lab_page, sim_state, simgpu_env
):
    sim_state.gpu(0, total=80 * GIB).process(0, OTHER_PID, 20 * GIB).write()
    server = start_lab_server(env={**simgpu_env, "JAX_PLATFORMS": "cpu"})
    # No subshells: comm messages are handled on the kernel's main thread (see the module).
    settings = server.log_path.parent / "user-settings" / NO_SUBSHELLS
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"commsOverSubshells": "disabled"}))
    cells = [
        DROP_THREAD_SENDS,
        "import sys\nassert 'google.colab' not in sys.modules\n%load_ext jax_nbmem\n%jaxmem",
        LONG_CELL.format(other=OTHER_PID),
    ]
    write_notebook(server.root_dir / "dropping.ipynb", cells)
    open_notebook(lab_page, server, "dropping.ipynb")
    lab_page.locator(".jp-NotebookPanel:visible .jp-Notebook").first.click(
        position={"x": 5, "y": 5}
    )
    lab_page.get_by_role("menuitem", name="Run", exact=True).click()
    lab_page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
    lab_page.locator(PLOT).wait_for(timeout=90_000)
    started = time.monotonic()

    # The long cell runs: the panel's thread sends, the frontend drops. The view's clock says so.
    lab_page.wait_for_function(
        "s => { const e = document.querySelector(s); return e && e.offsetParent !== null; }",
        arg=FRESHNESS,
        timeout=30_000,
    )
    noticed_after_s = time.monotonic() - started
    said = lab_page.locator(FRESHNESS).inner_text()
    assert said.startswith("Not live: nothing has arrived from the kernel for "), said
    assert re.search(r"this picture is from \d{1,2}:\d\d:\d\d", said), said
    assert "run a cell to refresh it" in said and "%jaxmem panel cells" in said
    assert not shown(lab_page, LIVE_LINE), "the kernel's 'Live' line still shows"
    assert "Live: sampling" not in lab_page.locator(PANEL).inner_text()
    lab_page.locator(PANEL).scroll_into_view_if_needed()
    stale_shot = screenshot(lab_page, "panel-not-live-while-dropped")

    # The cell ends: the main thread sends what changed, and the view is live again.
    wait_cells_executed(lab_page, timeout=60)
    lab_page.wait_for_function(
        "s => { const e = document.querySelector(s); return !e || e.offsetParent === null; }",
        arg=FRESHNESS,
        timeout=30_000,
    )
    assert shown(lab_page, LIVE_LINE) and "Live: sampling" in lab_page.locator(PANEL).inner_text()
    assert others_last(lab_page) == pytest.approx(20.0, abs=0.1)  # GiB: the neighbour

    # Idle: the neighbour ends. No cell runs, the thread's sends are dropped; the view pings.
    SimState(sim_state.path).gpu(0, total=80 * GIB).write()
    gone_at = time.monotonic()
    deadline = gone_at + 30
    while others_last(lab_page) not in (0, 0.0) and time.monotonic() < deadline:
        time.sleep(0.25)
    counts = lab_page.evaluate("() => globalThis.__jaxNbmemClock || null")
    assert others_last(lab_page) in (0, 0.0), (plot_state(lab_page), counts)
    assert counts["pings"] >= 1 and counts["pongs"] >= 1, counts  # how it got there
    reached_after_s = time.monotonic() - gone_at
    # Idle and answered, it stays live: sitting for a while changes nothing.
    time.sleep(6)
    assert not shown(lab_page, FRESHNESS), lab_page.locator(FRESHNESS).inner_text()
    assert shown(lab_page, LIVE_LINE)
    fresh_shot = screenshot(lab_page, "panel-live-again-by-ping")
    print(json.dumps({
        "not_live_noticed_after_s": round(noticed_after_s, 1),
        "neighbour_gone_reached_view_after_s": round(reached_after_s, 1),
        "pings_pongs": counts,
        "screenshots": [str(stale_shot), str(fresh_shot)],
    }))  # fmt: skip
