"""docs/security.md's list of what root opens, and where, is true of the code (issue 52 item 2).

Every call that opens, creates, changes the mode of, renames, removes, links or lists a file in
the modules root runs (the exporter and node agent, ``status``, ``shutdown``, the culler, the
simulated GPU's ``shared-setup`` and registrar) is found in their source, by function, and must
be a row of the list; every row must still be in the code. A new file operation on root's paths
fails here until the list says where it acts and who can write that folder.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jax_nbmem"
SECURITY = ROOT / "docs" / "security.md"

# The modules root runs (folders: every module in them), and where only some of a module is
# root's, which functions: the simulator's demo kernels are a user's, its build is root's.
ROOT_RUNS: dict[str, frozenset[str] | None] = {
    "rootfiles.py": None,
    "agent": None,
    "tenants": None,
    "node": None,
    "metrics": None,
    "gpu": None,
    **{f"cli/{name}.py": None for name in (
        "exporter", "exporter_http", "exporter_settings", "webconfig", "command", "stop",
        "stop_target", "culler", "hubapi")},
    **{f"simgpu/{name}.py": None for name in (
        "shared", "registrar", "registration", "state", "state_parse", "liveness")},
    "simgpu/simulator.py": frozenset({"build"}),
}  # fmt: skip
_OS = {"open", "mkdir", "makedirs", "chmod", "fchmod", "chown", "fchown", "lchown", "replace",
       "rename", "unlink", "remove", "symlink", "link", "mkfifo", "mknod", "rmdir", "truncate",
       "readlink", "listdir", "scandir"}  # fmt: skip
_SHUTIL = {"rmtree", "copy", "copy2", "copyfile", "copytree", "copymode", "move", "chown"}
_METHODS = {"chmod", "touch", "mkdir", "write_text", "write_bytes", "unlink", "read_text",
            "read_bytes", "rename", "symlink_to", "hardlink_to", "bind", "rmdir"}  # fmt: skip


def _operation(call: ast.Call) -> str | None:
    function = call.func
    if isinstance(function, ast.Name):
        return "open" if function.id == "open" else None
    if not isinstance(function, ast.Attribute):
        return None
    base = function.value.id if isinstance(function.value, ast.Name) else None
    if base == "os":
        return f"os.{function.attr}" if function.attr in _OS else None
    if base == "tempfile" and function.attr in ("mkstemp", "mkdtemp", "NamedTemporaryFile"):
        return f"tempfile.{function.attr}"
    if base == "shutil" and function.attr in _SHUTIL:
        return f"shutil.{function.attr}"
    return f".{function.attr}" if function.attr in _METHODS else None


def _found_in(path: Path, only: frozenset[str] | None) -> set[tuple[str, str]]:
    where = path.relative_to(PACKAGE).as_posix()
    found = set()

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            name = (
                child.name
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
                else function
            )
            if isinstance(child, ast.Call) and (operation := _operation(child)):
                if only is None or function in only:
                    found.add((f"{where}: {function or '<module>'}", operation))
            visit(child, name)

    visit(ast.parse(path.read_text(encoding="utf-8")), None)
    return found


def operations_in_code() -> set[tuple[str, str]]:
    """(``module: function``, operation) for every file operation in the modules root runs."""
    found = set()
    for part, only in ROOT_RUNS.items():
        path = PACKAGE / part
        for module in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            found |= _found_in(module, only)
    return found


def operations_listed() -> set[tuple[str, str]]:
    """The same, as docs/security.md's "What root opens, and where" lists them."""
    text = SECURITY.read_text(encoding="utf-8")
    section = text.split("## What root opens, and where", 1)[1].split("\n## ", 1)[0]
    listed = set()
    for row in re.finditer(r"^\| `([^`]+: [^`]+)` \| ([^|]+) \|", section, re.MULTILINE):
        for operation in re.findall(r"`([^`]+)`", row.group(2)):
            listed.add((row.group(1), operation))
    return listed


def test_every_file_operation_root_runs_is_listed_with_its_folder():
    unlisted = operations_in_code() - operations_listed()
    assert not unlisted, (
        "file operations on root's paths missing from docs/security.md's 'What root opens, "
        f"and where' (add each, with its folder and who can write it): {sorted(unlisted)}"
    )


def test_every_listed_operation_is_still_in_the_code():
    gone = operations_listed() - operations_in_code()
    assert not gone, f"docs/security.md lists operations the code no longer has: {sorted(gone)}"


def test_the_scan_finds_what_it_must(tmp_path):
    # The scan itself: a new chmod by name in a root module would be found.
    module = tmp_path / "jax_nbmem" / "agent" / "new.py"
    module.parent.mkdir(parents=True)
    module.write_text("import os\ndef grant(path):\n    os.chmod(path, 0o666)\n    open(path)\n")
    global PACKAGE
    kept, PACKAGE = PACKAGE, tmp_path / "jax_nbmem"
    try:
        assert _found_in(module, None) == {("agent/new.py: grant", "os.chmod"),
                                           ("agent/new.py: grant", "open")}  # fmt: skip
    finally:
        PACKAGE = kept
