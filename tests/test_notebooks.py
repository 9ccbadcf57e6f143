"""Every notebook in notebooks/ runs top to bottom in a real kernel (nbclient), without errors."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.ipython_session import clean_environ

pytestmark = pytest.mark.kernel

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def execute_notebook(path: Path, env: dict[str, str] | None = None, timeout: int = 180):
    """Run the notebook in a fresh python3 kernel; returns the executed notebook."""
    notebook = nbformat.read(path, as_version=4)
    full_env = clean_environ()
    full_env.pop("JAX_PLATFORMS", None)
    full_env.update(env or {})
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": path.parent}},
    )
    client.execute(env=full_env)
    return notebook


def text_of(notebook) -> str:
    """All text the notebook's cells printed or displayed as plain text."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def test_there_are_notebooks():
    assert any(p.name == "quickstart.ipynb" for p in NOTEBOOKS)


def test_the_notebooks_name_jaxs_memory_as_the_panel_does():
    """JAX's bytes in use and its pool: XLA's "bytes reserved" is always 0 on a GPU."""
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        prose = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
        assert "reserved" not in prose.lower(), path.name
    quickstart = nbformat.read(NOTEBOOKS[[p.name for p in NOTEBOOKS].index("quickstart.ipynb")], 4)
    assert any("JAX's bytes in use and its pool" in c.source for c in quickstart.cells)


def errors_of(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path):
    """Errors only where a cell is tagged `raises-exception` (a demo of one), and there for sure."""
    executed = execute_notebook(path)
    for cell in executed.cells:
        if cell.cell_type != "code":
            continue
        if "raises-exception" in cell.metadata.get("tags", []):
            assert errors_of(cell), f"this cell should fail and did not: {cell.source}"
        else:
            assert not errors_of(cell), errors_of(cell)


def test_before_the_oom_shows_fit_the_last_error_and_track():
    text = text_of(execute_notebook(NOTEBOOKS[0].parent / "before_the_oom.ipynb"))
    assert "Starting JAX's backend to compile the call, with allocator mode off" in text
    assert "fits with " in text and "compiled for cpu:0" in text
    assert "only the last error's frames: activations in build() (Cell In[" in text
    assert "1 array(s), 64.0 MiB, held only there are gone" in text
    assert "track: " in text and "host" in text
    assert "cell record(s) to " in text
