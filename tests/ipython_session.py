"""Run cells in a fresh IPython shell in its own process, and collect what a user would see.

JAX's backend starts once per process and never stops, so every test that needs it *not* started
gets a process of its own. The shell is IPython's real one (``IPython.testing.globalipapp``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

__all__ = ["CellOutput", "clean_environ", "run_cells"]

_OURS = (
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "JAX_NBMEM_ALLOCATOR",
)


def clean_environ() -> dict[str, str]:
    """This process's environment without any allocator setting, and JAX kept on the CPU."""
    env = {k: v for k, v in os.environ.items() if k not in _OURS}
    env["JAX_PLATFORMS"] = "cpu"
    return env


_DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, sys, traceback
    from IPython.testing.globalipapp import start_ipython
    cells = json.loads(sys.stdin.read())
    shell = start_ipython()
    results = []
    for cell in cells:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result = shell.run_cell(cell, store_history=True)
        error = result.error_in_exec or result.error_before_exec
        results.append({
            "stdout": out.getvalue(),
            "stderr": err.getvalue(),
            "error": type(error).__name__ if error else None,
            "error_text": str(error) if error else None,
        })
        del result, error  # as a kernel does: the driver keeps no cell's error alive
    sys.__stdout__.write("\\n@@RESULTS@@" + json.dumps(results))
    """
)


@dataclass(frozen=True)
class CellOutput:
    """What one cell printed, and the name and text of its error, if any."""

    stdout: str
    stderr: str
    error: str | None
    error_text: str | None

    @property
    def text(self) -> str:
        """Everything the cell printed."""
        return self.stdout + self.stderr


def run_cells(cells: list[str], env: dict[str, str] | None = None, timeout: float = 120):
    """Run ``cells`` in order in a new IPython process; returns one CellOutput per cell."""
    full_env = clean_environ()
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps(cells),
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    marker = proc.stdout.rfind("@@RESULTS@@")
    if proc.returncode != 0 or marker < 0:
        raise AssertionError(
            f"IPython process failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return [CellOutput(**item) for item in json.loads(proc.stdout[marker + len("@@RESULTS@@") :])]
