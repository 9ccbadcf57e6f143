"""Where an IPython shell keeps its last error, and how it names a cell's code.

Python keeps the last exception in ``sys`` (``last_exc`` from 3.12, ``last_value``,
``last_type``, ``last_traceback``), and IPython's traceback formatter keeps the traceback it
showed (``InteractiveTB.tb``). The core (:mod:`jax_nbmem.tools.last_error`) is handed these.
"""

from __future__ import annotations

import re
import sys

__all__ = ["code_location", "drop_last_error", "last_error_holders"]

# IPython 8.0 names a cell's code "<ipython-input-5-0123abcd>" and has no format_code_name.
_OLD_CELL_NAME = re.compile(r"^<ipython-input-(\d+)-[0-9a-f]+>$")


def last_error_holders(shell) -> list:
    """What keeps the last error alive: ``sys.last_*`` and IPython's formatter's traceback."""
    holders = [getattr(sys, name, None) for name in ("last_exc", "last_value", "last_traceback")]
    holders.append(getattr(getattr(shell, "InteractiveTB", None), "tb", None))
    return holders


def drop_last_error(shell) -> None:
    """Forget the last error, as if none had happened (``%debug`` has nothing to show then)."""
    for name in ("last_exc", "last_value", "last_type", "last_traceback"):
        if hasattr(sys, name):
            setattr(sys, name, None)
    formatter = getattr(shell, "InteractiveTB", None)
    if formatter is not None and hasattr(formatter, "tb"):
        formatter.tb = None


def code_location(shell):
    """How IPython names a cell's code (``Cell In[5], line 3``), else ``file.py:3``."""
    from jax_nbmem.tools.last_error import where_in_file

    compiler = getattr(shell, "compile", None)
    name_code = getattr(compiler, "format_code_name", None)

    def where(filename: str, lineno: int | None) -> str:
        try:
            named = name_code(filename) if callable(name_code) else None
        except Exception:
            named = None
        if named:
            return f"{named[0]} {named[1]}, line {lineno}"
        old_style = _OLD_CELL_NAME.match(filename)  # IPython 8.0 names no "Cell In[5]" itself
        if old_style:
            return f"Cell In[{old_style.group(1)}], line {lineno}"
        return where_in_file(filename, lineno)

    return where
