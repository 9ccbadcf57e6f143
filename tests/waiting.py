"""Waiting for something another process does, with a deadline and a said reason."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["wait_for"]


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, every: float = 0.1) -> Any:
    """Call ``check`` until it returns something true, and return that; else fail saying *what*.

    The last value seen is in the failure, so a wait that gives up says how far it got.
    """
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:g} s (last: {last!r})")
