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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_without_errors(path):
    executed = execute_notebook(path)
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
