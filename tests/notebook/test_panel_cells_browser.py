"""Panels that follow cells, in JupyterLab and Notebook 7 (Debian chromium, simulated GPU).

The static picture is replaced through its display id after each cell; the ``cells`` widget
gets each cell from the kernel's main thread. Both redraw: JupyterLab's plotly renderer, by
contrast, keeps the first drawing of a plotly figure whose output is updated in place.
"""

import pytest

from jax_nbmem.simgpu import GIB
from tests.jupyterlab import open_notebook, run_all_cells, screenshot, write_notebook
from tests.notebook.test_panel_browser import PANEL, PLOT, run_all_in_notebook_7
from tests.notebook.test_panel_kernel import OTHER_PID

pytest_plugins = ("tests.jupyterlab",)


def output_says(page, cell: int, text: str, timeout_s: float = 60) -> None:
    """Wait until the visible notebook's *cell*-th code cell's output shows *text*."""
    page.wait_for_function(
        """([index, text]) => {
            const cells = document.querySelectorAll(".jp-Notebook .jp-CodeCell");
            const cell = [...cells].filter(c => c.offsetParent !== null)[index];
            return cell !== undefined && cell.querySelector(".jp-OutputArea") !== null
                && cell.querySelector(".jp-OutputArea").innerText.includes(text);
        }""",
        arg=[cell, text],
        timeout=timeout_s * 1000,
    )


def plot_holds(page, text: str, timeout_s: float = 60) -> None:
    """Wait until a drawn plot's data (its cells' hover texts among them) holds *text*."""
    page.wait_for_function(
        """([selector, text]) => [...document.querySelectorAll(selector)].some(
            p => p.data && JSON.stringify(p.data).includes(text))""",
        arg=[PLOT, text],
        timeout=timeout_s * 1000,
    )


# Two panels that follow cells only: the static picture and the widget without its thread.
AFTER_CELLS = [
    "%load_ext jax_nbmem\n%jaxmem panel static",
    "%jaxmem panel cells",
    "first_mark = 1",
    "second_mark = 2",
]


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_panels_that_follow_cells_redraw_in_jupyterlab_and_notebook_7(
    start_lab_server, lab_page, sim_state, simgpu_env
):
    """Each cell replaces the static picture, and reaches the widget from the main thread.

    JupyterLab's plotly renderer keeps the first drawing of a plotly figure whose output is
    updated; the static panel is a picture in HTML, which every renderer draws anew.
    """
    sim_state.gpu(0, total=80 * GIB).process(0, OTHER_PID, 20 * GIB).write()
    server = start_lab_server(env={**simgpu_env, "JAX_PLATFORMS": "cpu"})
    write_notebook(server.root_dir / "cells.ipynb", AFTER_CELLS)
    open_notebook(lab_page, server, "cells.ipynb")
    run_all_cells(lab_page, timeout=120)
    output_says(lab_page, 0, "after cell [4]")  # replaced by cells 2, 3 and 4
    output_says(lab_page, 0, "Redrawn after each cell, not live.")
    assert "Live" not in lab_page.locator(".jax-nbmem-snapshot").first.inner_text()
    plot_holds(lab_page, "second_mark = 2")  # shown in cell 2, it got cell 4
    notes = lab_page.locator(f"{PANEL} .jax-nbmem-notes").first.inner_text()
    assert "Updated after each cell, not live" in notes and "Live" not in notes
    lab_page.locator(".jp-NotebookPanel:visible .jp-Cell").first.scroll_into_view_if_needed()
    screenshot(lab_page, "panel-after-cells-jupyterlab")

    # Notebook 7, the same notebook run again in the same kernel (cells 5 to 8).
    run_all_in_notebook_7(lab_page, server, "cells.ipynb")
    output_says(lab_page, 0, "after cell [8]", timeout_s=120)
    plot_holds(lab_page, "cell [8] second_mark = 2")  # shown again in cell 6, it got cell 8
    screenshot(lab_page, "panel-after-cells-notebook7")
