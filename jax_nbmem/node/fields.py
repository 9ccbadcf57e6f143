"""The one strict reader of a field another process wrote: a beacon, a claim, a notice, the agent's.

Everything in the share directory was written by someone else — another user's kernel, a
container, the node agent — and is read as the JSON it parsed to: any type, any size. Each
reader here takes a field's value and returns it in its type, or None when it is not one, so
that a malformed field is "unknown", never a crash and never a guessed value. Numbers are
strict: a bool is no number, and NaN or an infinity (which Python's JSON reader accepts) is
none either.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["strict_count", "strict_number", "strict_text"]


def strict_text(value: Any, limit: int = 4096) -> str | None:
    """``value`` if it is text of at most ``limit`` characters that can be printed as UTF-8.

    A lone surrogate (a JSON escape such as D800 hex) parses, but printing it raises: not text.
    """
    if not isinstance(value, str) or len(value) > limit:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def strict_number(value: Any) -> float | None:
    """A finite number as a float (not a bool, not NaN or infinite, not beyond a float)."""
    if not isinstance(value, float | int) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return number if math.isfinite(number) else None


def strict_count(value: Any) -> int | None:
    """A byte count: a non-negative integer that fits in 63 bits (what gauges and JAX hold)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    return None
