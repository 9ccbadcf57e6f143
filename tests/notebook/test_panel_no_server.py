"""Without jax_nbmem's server extension (as in VS Code, Colab, Voilà): the plot draws during
Run All, while later cells still run, from the plotly.js its kernel sent with the panel.

The server's route is off here (``jpserver_extensions``), so JupyterLab and Notebook 7 stand
in for frontends that have no such route; the kernel is busy with a cell that waits for the
test's word, so a copy that waited for the kernel to be idle would never come in time.
"""

import json
import re

import pytest

from jax_nbmem.simgpu import GIB
from tests.jupyterlab import open_notebook, wait_kernel_connected, write_notebook
from tests.notebook.test_panel_browser import plot_state, plotly_source, wait_for_plots
from tests.notebook.test_panel_kernel import OTHER_PID

pytest_plugins = ("tests.jupyterlab",)

# A cell that holds the kernel until the test creates the file: the queue behind the panel.
HOLD_CELL = """\
import pathlib, time
release = pathlib.Path("release")
while not release.exists():
    time.sleep(0.05)
"""


def _server_without_extension(start_lab_server, simgpu_env, tmp_path):
    config = tmp_path / "jupyter-config"
    config.mkdir(exist_ok=True)
    off = {"ServerApp": {"jpserver_extensions": {"jax_nbmem.server": False}}}
    (config / "jupyter_server_config.json").write_text(json.dumps(off))
    env = {**simgpu_env, "JAX_PLATFORMS": "cpu", "JUPYTER_CONFIG_DIR": str(config)}
    return start_lab_server(env=env)


def _run_all(page, notebook_selector: str) -> None:
    page.locator(notebook_selector).first.click(position={"x": 5, "y": 5})
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()


def _last_prompt(page) -> str:
    return page.locator(".jp-CodeCell .jp-InputPrompt").last.inner_text().strip()


def _draws_while_later_cells_wait(page, server) -> None:
    wait_for_plots(page, 1, 90)
    assert _last_prompt(page) in ("[*]:", "[ ]:")  # the held cell has not finished
    assert plotly_source(page) == "kernel"
    # Where the plot draws, the snapshot's words and its picture (the output after them) hide.
    snapshot = ".jp-OutputArea-child:has(.jax-nbmem-snapshot)"
    assert page.locator(snapshot).count() == 1
    assert not page.locator(snapshot).first.is_visible()
    assert not page.locator(f"{snapshot} + .jp-OutputArea-child").first.is_visible()
    state = plot_state(page, 0)
    assert "other processes" in state["names"] and "this kernel" in state["names"]
    (server.root_dir / "release").touch()
    page.locator(".jp-CodeCell .jp-InputPrompt", has_text=re.compile(r"\[3\]")).wait_for(
        timeout=60_000
    )


@pytest.mark.browser
@pytest.mark.timeout(240)
def test_run_all_draws_in_jupyterlab_without_the_server_extension(
    start_lab_server, lab_page, sim_state, simgpu_env, tmp_path
):
    sim_state.gpu(0, total=80 * GIB).process(0, OTHER_PID, 20 * GIB).write()
    server = _server_without_extension(start_lab_server, simgpu_env, tmp_path)
    write_notebook(
        server.root_dir / "held.ipynb", ["%load_ext jax_nbmem\n%jaxmem", "x = 1", HOLD_CELL]
    )
    open_notebook(lab_page, server, "held.ipynb")
    _run_all(lab_page, ".jp-NotebookPanel:visible .jp-Notebook")
    _draws_while_later_cells_wait(lab_page, server)


@pytest.mark.browser
@pytest.mark.timeout(240)
def test_run_all_draws_in_notebook_7_without_the_server_extension(
    start_lab_server, lab_page, sim_state, simgpu_env, tmp_path
):
    pytest.importorskip("notebook", minversion="7")
    sim_state.gpu(0, total=80 * GIB).process(0, OTHER_PID, 20 * GIB).write()
    server = _server_without_extension(start_lab_server, simgpu_env, tmp_path)
    write_notebook(
        server.root_dir / "held7.ipynb", ["%load_ext jax_nbmem\n%jaxmem", "x = 1", HOLD_CELL]
    )
    lab_page.goto(
        f"{server.base_url}/notebooks/held7.ipynb?token={server.token}",
        wait_until="domcontentloaded",
    )
    lab_page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=90_000)
    wait_kernel_connected(server, 90, notebook="held7.ipynb")
    _run_all(lab_page, ".jp-Notebook")
    _draws_while_later_cells_wait(lab_page, server)
