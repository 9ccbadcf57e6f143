"""`jupyter nbconvert --execute` on the quickstart: a small notebook whose export shows the panel.

The executed notebook stores the widget's state (nbconvert always does), which once carried
plotly.js (4.6 MB): the notebook and its export stay under 300 KB. The exported page cannot run
the widget without the network (its widget manager comes from a CDN), so the panel's snapshot
must carry the picture: opened in chromium, which reaches no host, the page shows the panel's
SVG as of the end of the run. Exported with nbconvert's HTML sanitiser (which drops SVG and
escapes HTML), the same page shows the picture's PNG, drawn from that same SVG.
"""

import base64
import json
import re
import shutil
import subprocess
import sys

import nbformat
import pytest

from jax_nbmem.notebook.snapshot_png import svg_to_png
from jax_nbmem.simgpu import GIB
from tests.ipython_session import clean_environ
from tests.jupyterlab import chromium_page, console_messages, screenshot
from tests.notebook.test_panel_browser import QUICKSTART
from tests.notebook.test_panel_kernel import OTHER_PID

pytestmark = [pytest.mark.kernel, pytest.mark.browser]


@pytest.mark.timeout(300)
def test_exported_quickstart_shows_the_panel_offline(tmp_path, sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).process(0, OTHER_PID, 20 * GIB).write()
    notebook = tmp_path / "quickstart.ipynb"
    shutil.copyfile(QUICKSTART, notebook)
    env = {**clean_environ(), **simgpu_env, "JAX_PLATFORMS": "cpu"}
    executed = tmp_path / "executed.ipynb"
    for args in (  # executed once, then exported as `--to html --execute` would export it
        ["--to", "notebook", "--execute", str(notebook), "--output", executed.name],
        ["--to", "html", str(executed), "--output", "quickstart"],
        ["--to", "html", *SANITISED, str(executed), "--output", "sanitised"],
    ):
        subprocess.run(
            [sys.executable, "-m", "jupyter", "nbconvert", *args],
            env=env,
            cwd=tmp_path,
            check=True,
            capture_output=True,
            timeout=240,
        )
    saved = json.loads(executed.read_text())
    esm = _esm_of(saved)  # the plot's model is in the stored widget state, its module too...
    assert "KERNEL_REQUEST" in esm and "plotly.min.js" in esm
    assert len(esm) < 20_000  # ...but not plotly.js (4.6 MB)
    page_path = tmp_path / "quickstart.html"
    sizes = {
        "notebook": executed.stat().st_size,
        "html": page_path.stat().st_size,
        "html of an empty notebook": _empty_export_size(tmp_path, env),  # nbconvert's CSS
    }
    print(json.dumps(sizes))
    assert sizes["notebook"] < 300_000, sizes
    assert sizes["html"] - sizes["html of an empty notebook"] < 300_000, sizes
    text = page_path.read_text()
    code_cells = len(re.findall(r"jp-CodeCell ", text))
    assert code_cells >= 5
    with chromium_page(tmp_path / "profile") as page:
        page.goto(page_path.as_uri(), wait_until="load")
        snapshot = page.locator(".jax-nbmem-snapshot").first
        snapshot.wait_for(timeout=30_000)
        assert snapshot.is_visible()
        assert "GPU 0: NVIDIA H200 (simulated)" in snapshot.inner_text()
        # The picture is the output right after the snapshot's words: an image (nbconvert
        # shows SVG as an <img>), drawn from the SVG the notebook keeps.
        picture = page.locator(f"{PICTURE} img[src^='data:image/svg+xml']").first
        assert picture.is_visible() and picture.bounding_box()["width"] > 500
        source = page.evaluate("img => img.src.split(',', 2)[1]", picture.element_handle())
        svg = base64.b64decode(source).decode()
        # The memory lines are drawn, and the bars reach the quickstart's last cell.
        assert 'stroke="#d62728"' in svg  # other processes
        labels = re.findall(r">([^<>]*)</text>", svg)
        assert "other processes" in labels and "this kernel" in labels
        last_cell = max(int(n) for n in re.findall(r"In\W{1,6}\[(\d+)\]:", text))
        # The picture as of the end of the run: the last cell has its bars, and says so.
        bars = [label for label in labels if label.startswith("[")]
        assert f"[{last_cell}]" in bars, (last_cell, bars)
        assert f"after cell [{last_cell}]" in snapshot.inner_text()
        assert "[4]" in labels  # the cell that allocated
        snapshot.scroll_into_view_if_needed()
        shot = screenshot(page, "panel-nbconvert-export")
        assert shot.stat().st_size > 10_000
        errors = [m for m in console_messages(page) if m.startswith("pageerror")]
        assert not errors, errors
    _sanitised_export_shows_the_png(tmp_path, saved, last_cell)


PICTURE = ".jp-OutputArea-child:has(.jax-nbmem-snapshot) + .jp-OutputArea-child"
# nbconvert's sanitiser of outputs: it keeps PNG and plain text, escapes HTML, drops SVG.
SANITISED = [
    "--HTMLExporter.preprocessors=['nbconvert.preprocessors.sanitize.SanitizeHTML']",
    "--SanitizeHTML.enabled=True",
]


def _sanitised_export_shows_the_png(folder, saved: dict, last_cell: int) -> None:
    """The sanitised page: no SVG and no live markup, the PNG of the last picture instead."""
    pictures = [
        output["data"]
        for cell in saved["cells"]
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    ]
    assert pictures, "no output of the executed notebook has a PNG"
    # The panel's one picture, as its last refresh left it (nbformat may split text in lines).
    last = {mime: "".join(value) for mime, value in pictures[-1].items()}
    assert f">[{last_cell}]</text>" in last["image/svg+xml"]  # the run's last cell is in it
    png = base64.b64decode(last["image/png"])
    assert png == svg_to_png(last["image/svg+xml"])  # the same drawing
    page_path = folder / "sanitised.html"
    text = page_path.read_text()
    assert "image/svg+xml" not in text.split("jax-nbmem-snapshot", 1)[-1]  # dropped
    with chromium_page(folder / "profile-sanitised") as page:
        page.goto(page_path.as_uri(), wait_until="load")
        image = page.locator("img[src^='data:image/png']").last
        image.wait_for(timeout=30_000)
        assert image.is_visible() and image.bounding_box()["width"] > 500
        shown = page.evaluate("img => img.src.split(',', 2)[1]", image.element_handle())
        assert base64.b64decode(shown) == png
        image.scroll_into_view_if_needed()
        screenshot(page, "panel-nbconvert-sanitised-export")


def _esm_of(notebook: dict) -> str:
    """The ES modules of the anywidget models stored in an executed notebook's widget state."""
    models = notebook["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]
    return "".join(m["state"].get("_esm", "") for m in models["state"].values())


def _empty_export_size(folder, env) -> int:
    """The size of nbconvert's HTML page for a notebook of one empty cell (its styles)."""
    empty = folder / "empty.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("")]), empty)
    subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(empty)],
        env=env, cwd=folder, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return (folder / "empty.html").stat().st_size
