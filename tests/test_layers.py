"""The layer rules of jax_nbmem, checked on its source: the core imports no UI, one module NVML.

ruff's banned-api says the same to whoever runs ruff; this test makes CI say it too.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jax_nbmem"
UI = ("IPython", "ipywidgets", "plotly")
# The glue and the view may use IPython and the widgets; nothing else may.
ALLOWED_UI = {"__init__.py", "magics.py", "panel.py", "panel_actions.py"}
MODULES = sorted(PACKAGE.glob("*.py"))


def imported_roots(path: Path) -> set[str]:
    """Top-level names of every module the file imports, at any depth (lazy imports too)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_module_respects_the_layers(path):
    roots = imported_roots(path)
    if path.name != "nvml.py":
        assert "pynvml" not in roots, f"{path.name}: only nvml.py may import pynvml"
    if path.name not in ALLOWED_UI:
        assert not roots & set(UI), f"{path.name} is core and imports {roots & set(UI)}"


def test_the_checker_sees_lazy_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import plotly.graph_objects as go\n    from pynvml import x\n")
    assert {"plotly", "pynvml"} <= imported_roots(sample)
