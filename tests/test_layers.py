"""The layout's rules, checked on the source: which part of jax_nbmem may import which.

The core (allocator, gpu, record, node, agent, tenants, metrics, tools, and the shared `units`
and `text`) imports no IPython, widgets or plotly and no face; only `gpu/nvml.py` imports
pynvml; a face (notebook, cli, server) may import the core but not another face; `simgpu`
stands alone; no two parts import each other, and no module imports itself back through
others; no module is over 600 lines; no module takes another's private name (``_x``). ruff's
banned-api says some of this to whoever runs ruff (each face has a ruff.toml of its own); this
test makes CI say all of it, lazy imports included.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jax_nbmem"

UI = {"IPython", "ipywidgets", "plotly", "anywidget"}
# _version: jax_nbmem.__version__, a constant every part may read; guide: where the
# documentation's pages are, for any part's messages.
# rootfiles: how root opens what a user may reach, one set of rules for every part root runs.
SHARED = {"units", "text", "_version", "guide", "rootfiles"}
CORE = SHARED | {"gpu", "allocator", "record", "tenants", "agent", "node", "metrics", "tools"}
FACES = {"notebook", "cli", "server"}
# What each part may import of jax_nbmem, besides its own modules.
MAY_IMPORT = {
    "units": set(),
    "text": set(),
    "_version": set(),
    "guide": set(),
    "rootfiles": set(),
    "gpu": SHARED,
    "allocator": {"gpu"} | SHARED,
    "record": {"gpu"} | SHARED,
    # The report: who is on the GPU, the warnings, the status, auto mode, the culler's policy.
    "tenants": {"gpu", "allocator", "agent", "node"} | SHARED,
    # The node's shared language: what every process on a node leaves the others in the share
    # directory, read and written by the same code in a kernel, a server, the CLI and the agent.
    "node": {"gpu"} | SHARED,
    # The node agent, root's daemon: it speaks node/, never the report.
    "agent": {"gpu", "node"} | SHARED,
    "tools": {"gpu", "allocator", "record"} | SHARED,
    # The metric families, their labels and the exposition: built from a report a face hands in.
    "metrics": {"gpu", "node"} | SHARED,
    # The simulated GPU stands alone, but for the rules by which root opens files.
    "simgpu": {"rootfiles"},
    **{face: set(CORE) for face in FACES},
    # The package's public functions: the status report, track() and fit(), and the notebook
    # face on demand.
    "package": {"tenants", "tools", "record", "notebook", "_version"},
}
MAY_USE_UI = {"notebook", "package"}
# A web framework only in the server face (the exporter's HTTP server is the standard library's).
WEB = {"tornado", "jupyter_server"}
MAY_USE_WEB = {"server"}


# Modules of 50 to 400 lines are the aim; one over this is two modules.
MAX_LINES = 600


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(name: str) -> str:
    """``jax_nbmem.gpu.nvml`` → ``gpu``; the top-level package itself → ``package``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "package"


def imports_of(path: Path, name: str, known: set[str]) -> tuple[set[str], set[str]]:
    """(third-party top-level names, jax_nbmem modules) imported anywhere in the file."""
    outside, inside = set(), set()
    is_package = path.name == "__init__.py"

    def add(target: str) -> None:
        if target.split(".")[0] != "jax_nbmem":
            outside.add(target.split(".")[0])
            return
        while target not in known and "." in target:  # `from a.b import c` where c is a name
            target = target.rsplit(".", 1)[0]
        inside.add(target)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                add(f"{base}.{alias.name}")
    return outside, inside


def import_graph(package: Path) -> dict[str, tuple[Path, set[str], set[str]]]:
    paths = sorted(package.rglob("*.py"))
    known = {module_name(p, package) for p in paths}
    graph = {}
    for path in paths:
        name = module_name(path, package)
        outside, inside = imports_of(path, name, known)
        graph[name] = (path, outside, inside - {name})
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the list of modules around it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def private_names_taken(path: Path, known: set[str]) -> list[str]:
    """Each private name (``_x``) the file at ``path`` takes from another jax_nbmem module.

    ``from jax_nbmem.a import _x``, and ``m._x`` where ``m`` names a jax_nbmem module imported
    there (``from jax_nbmem.p import a as m``, ``import jax_nbmem.a as m``). A private module
    itself (``_version``) is no private name.
    """

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    tree = ast.parse(path.read_text(), filename=str(path))
    taken, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jax_nbmem"):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if target in known:
                    modules[alias.asname or alias.name] = target
                elif private(alias.name):
                    taken.append(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("jax_nbmem.") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and private(node.attr)
        ):
            taken.append(f"{modules[node.value.id]}.{node.attr}")
    return sorted(set(taken))


def mutual_pairs(rules: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Each pair of parts that may import each other."""
    return sorted((a, b) for a in rules for b in rules[a] if a < b and a in rules.get(b, ()))


def violations(package: Path) -> list[str]:
    """Every break of the layer rules in the package at ``package``, one line each."""
    graph = import_graph(package)
    known = set(graph)
    found = []
    for name, (path, outside, inside) in graph.items():
        part = part_of(name)
        where = path.relative_to(package.parent)
        if part not in MAY_IMPORT:
            found.append(f"{where}: part {part!r} is not in the layout (add it to MAY_IMPORT)")
            continue
        if "pynvml" in outside and name != "jax_nbmem.gpu.nvml":
            found.append(f"{where}: only jax_nbmem/gpu/nvml.py may import pynvml")
        if outside & UI and part not in MAY_USE_UI:
            found.append(f"{where}: {part} imports {sorted(outside & UI)}")
        if outside & WEB and part not in MAY_USE_WEB:
            found.append(f"{where}: {part} imports {sorted(outside & WEB)}")
        for target in sorted(inside):
            other = part_of(target)
            if other != part and other not in MAY_IMPORT[part]:
                found.append(f"{where}: {part} may not import {target}")
        for name_taken in private_names_taken(path, known):
            found.append(f"{where}: takes the private name {name_taken} (make it public)")
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            found.append(f"{where}: {lines} lines, over {MAX_LINES} (split it)")
    cycle = cycle_in({name: inside for name, (_, _, inside) in graph.items()})
    if cycle:
        found.append("import cycle: " + " → ".join(cycle))
    return found


def test_the_package_keeps_its_layers():
    assert violations(PACKAGE) == []


def test_no_two_parts_may_import_each_other():
    assert mutual_pairs(MAY_IMPORT) == []
    assert mutual_pairs({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [("a", "b")]


def test_every_part_says_what_it_is_for():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()) >= 3, f"{init.parent.name}/__init__.py: no docstring"


def write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "jax_nbmem"
    for relative, text in {"__init__.py": "", **files}.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for folder in path.relative_to(package).parents:
            (package / folder / "__init__.py").touch()
    return package


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"record/sampler.py": "def f():\n    import IPython\n"}, "record imports ['IPython']"),
        ({"tenants/status.py": "import plotly.graph_objects as go\n"}, "imports ['plotly']"),
        (
            {"gpu/visible.py": "from jax_nbmem.notebook import magics\n", "notebook/magics.py": ""},
            "gpu may not import jax_nbmem.notebook.magics",
        ),
        (
            {"tools/arrays.py": "from ..cli.command import main\n", "cli/command.py": ""},
            "tools may not import jax_nbmem.cli.command",
        ),
        ({"tenants/advice.py": "import pynvml\n"}, "only jax_nbmem/gpu/nvml.py may import pynvml"),
        (
            {"cli/command.py": "from jax_nbmem.notebook.panel import x\n", "notebook/panel.py": ""},
            "cli may not import jax_nbmem.notebook.panel",
        ),
        ({"gpu/nvml.py": "from jax_nbmem.record import ledger\n"}, "gpu may not import"),
        (
            {"tools/a.py": "from jax_nbmem.tools.b import _helper\n", "tools/b.py": ""},
            "takes the private name jax_nbmem.tools.b._helper",
        ),
        (
            {"tools/a.py": "from jax_nbmem.tools import b as _b\n_b._LIMIT\n", "tools/b.py": ""},
            "takes the private name jax_nbmem.tools.b._LIMIT",
        ),
        ({"tools/big.py": "x = 1\n" * 601}, "601 lines, over 600"),
        ({"widgets/x.py": ""}, "part 'widgets' is not in the layout"),
        (
            {
                "tools/compare.py": "from jax_nbmem.tools import compare_report\n",
                "tools/compare_report.py": "if 0:\n    from jax_nbmem.tools.compare import R\n",
            },
            "import cycle: jax_nbmem.tools.compare → jax_nbmem.tools.compare_report → "
            "jax_nbmem.tools.compare",
        ),
    ],
)
def test_the_checker_catches_each_kind_of_break(tmp_path, files, expected):
    found = violations(write_package(tmp_path, files))
    assert any(expected in line for line in found), found


def test_the_checker_accepts_a_face_on_the_core(tmp_path):
    package = write_package(
        tmp_path,
        {
            "gpu/nvml.py": "import pynvml\nfrom jax_nbmem.units import x\n",
            "units.py": "",
            "notebook/magics.py": "import IPython\nfrom jax_nbmem.gpu import nvml\n",
        },
    )
    assert violations(package) == []


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is in the test extra")
def test_ruff_finds_nothing():
    # banned-api (per folder, through each face's ruff.toml), imports, docstrings, style.
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
