"""Human-readable bytes, durations and clock times, shared by every view.

A missing value is shown as :data:`MISSING` ("—"), never as ``0``: an unknown number and a
zero are different facts, and a reader must be able to tell them apart.
"""

from __future__ import annotations

import math
import re
import time

__all__ = [
    "MISSING",
    "format_bytes",
    "format_bytes_delta",
    "format_duration",
    "format_gib",
    "format_time_of_day",
    "parse_bytes",
]

MISSING = "—"

# Binary units, because GPU memory sizes, XLA's limits and NVML all count in powers of two.
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_PARSE_FACTORS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_PARSE_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def format_bytes(n: int | float | None, *, missing: str = MISSING) -> str:
    """Format a byte count with a binary unit and three significant digits.

    ``None`` (unknown) gives *missing*. Examples: ``0 B``, ``512 B``, ``1.50 KiB``,
    ``12.3 MiB``, ``123 GiB``. Negative counts keep their sign.
    """
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return missing
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    unit_index = 0
    while value >= 1024 and unit_index < len(_BYTE_UNITS) - 1:
        value /= 1024
        unit_index += 1
    if unit_index == 0:
        return f"{sign}{int(round(value))} B"
    # Rounding can carry into the next unit ("1024 KiB"); step up instead of printing that.
    if round(value) >= 1024 and unit_index < len(_BYTE_UNITS) - 1:
        value /= 1024
        unit_index += 1
    return f"{sign}{_three_digits(value)} {_BYTE_UNITS[unit_index]}"


def format_gib(n: int | None, *, missing: str = MISSING) -> str:
    """Free memory as the panel's header and the lab extension's status bar both say it.

    GiB with one decimal from 1 GiB up, else whole MiB, halves rounded up: the rule of
    ``gib()`` in ``labextension/src/format.ts`` (JavaScript's ``toFixed``), so that the two
    faces show one figure for one reading ("138.5 GiB", not "139 GiB" here and "138.5 GiB"
    there). Integer arithmetic: no float rounding decides a tie. ``None`` gives *missing*.
    """
    if n is None:
        return missing
    sign, n = ("-" if n < 0 else ""), abs(int(n))
    if n >= 1 << 30:
        tenths = (n * 10 + (1 << 29)) >> 30
        return f"{sign}{tenths // 10}.{tenths % 10} GiB"
    return f"{sign}{(n + (1 << 19)) >> 20} MiB"


def format_bytes_delta(n: int | float | None, *, missing: str = MISSING) -> str:
    """Format a change in bytes with an explicit sign (``+1.00 GiB``, ``-12.0 MiB``, ``0 B``).

    ``None`` (unknown) gives *missing*.
    """
    if n is None:
        return missing
    text = format_bytes(n, missing=missing)
    return f"+{text}" if n > 0 else text


def format_duration(seconds: float | None, *, missing: str = MISSING) -> str:
    """Format a duration: ``850 ms``, ``1.25 s``, ``42.0 s``, ``2 min 05 s``, ``1 h 02 min``.

    ``None`` (unknown) gives *missing*. Negative durations (a clock that jumped) are shown
    with their sign rather than hidden.
    """
    if seconds is None or math.isnan(seconds):
        return missing
    if seconds < 0:
        return "-" + format_duration(-seconds, missing=missing)
    if seconds < 1:
        milliseconds = seconds * 1000
        if milliseconds < 1:
            return f"{milliseconds:.2f} ms"
        return f"{int(round(milliseconds))} ms" if round(milliseconds) < 1000 else "1.00 s"
    if seconds < 59.95:  # above this, "60.0 s" would print; say "1 min 00 s" instead
        return f"{_three_digits(seconds)} s"
    whole = int(round(seconds))
    if whole < 3600:
        minutes, secs = divmod(whole, 60)
        return f"{minutes} min {secs:02d} s"
    hours, rest = divmod(whole, 3600)
    return f"{hours} h {rest // 60:02d} min"


def format_time_of_day(timestamp: float | None, *, missing: str = MISSING) -> str:
    """Format a wall-clock timestamp (``time.time()``) as local ``HH:MM:SS``."""
    if timestamp is None:
        return missing
    return time.strftime("%H:%M:%S", time.localtime(timestamp))


def parse_bytes(text: str | int) -> int:
    """Parse a size such as ``"4GiB"``, ``"512 MB"``, ``"2g"`` or ``1024`` into bytes.

    Bare ``k``/``m``/``g``/``t`` are binary (as in ``ulimit`` and XLA flags); ``KB``/``MB``/
    ``GB``/``TB`` are decimal; ``KiB``/``MiB``/``GiB``/``TiB`` are binary.

    Raises:
        ValueError: when *text* is not a non-negative size.
    """
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {text}")
        return text
    match = _PARSE_PATTERN.match(str(text))
    if match is None:
        raise ValueError(f"not a size: {text!r} (try e.g. '4GiB' or '512MB')")
    number, unit = match.groups()
    factor = _PARSE_FACTORS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}")
    return int(round(float(number) * factor))


def _three_digits(value: float) -> str:
    """Render a positive number with three significant digits (``1.50``, ``12.3``, ``123``)."""
    if round(value, 2) < 10:
        return f"{value:.2f}"
    if round(value, 1) < 100:
        return f"{value:.1f}"
    return f"{value:.0f}"
