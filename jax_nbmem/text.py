"""Text that comes from elsewhere, made safe to show; numbers that users type, read strictly.

Process names, command lines, user names, notebook paths and GPU names come from other people
and other programs. Everything of ours that reaches a terminal or a log goes through
:func:`printable_lines` (or :func:`printable` for one field, or :class:`NeutralFormatter` for a
log handler, or JSON, which escapes every control character); ``tests/test_neutral_output.py``
finds any print, write or log call that does not. :func:`printable` neutralises what a
terminal or a browser would act on (control and escape sequences, bidirectional overrides)
before any of it is shown, and
:func:`mask_secrets` blots out what looks like a token or a password in a command line, so
that no output of ours carries one. :func:`parse_number` and :func:`parse_count` accept plain
ASCII numbers only: ``float("０.５")`` (fullwidth digits), ``nan`` and ``inf`` are all valid
Python, and none of them is what a user means by a memory fraction or a timeout.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence

__all__ = [
    "NeutralFormatter",
    "mask_secrets",
    "parse_count",
    "parse_number",
    "printable",
    "printable_lines",
]

# C0 and C1 controls, DEL, and the Unicode controls that reorder or hide text (bidi overrides
# and isolates, zero-width joiners and marks, the BOM): a terminal or a browser acts on these.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
# Option names that carry a secret: --IdentityProvider.token, --ServerApp.password, the
# kernel's --Session.key (the HMAC key that signs its messages), --api-key, ...
_SECRET_WORDS = re.compile(
    r"token|passw|secret|api[_-]?key|credential|auth|(?:^|[.\-_])key$", re.IGNORECASE
)
_MASK = "***"
_ASCII_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_ASCII_COUNT = re.compile(r"[0-9]+")


def printable(text: object) -> str:
    r"""``text`` with every control character shown as an escape (``\\x1b``, ``\\u202e``).

    Ordinary Unicode (accents, CJK, "—") passes unchanged; newlines and tabs are escaped
    too, since what this is given is one field of one line.
    """
    value = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_escape, value)


def printable_lines(text: str) -> str:
    """:func:`printable` on each line of ``text``, keeping its line breaks."""
    return "\n".join(printable(line) for line in text.split("\n"))


class NeutralFormatter(logging.Formatter):
    """A log formatter whose every line is :func:`printable_lines`.

    What a log record carries (a notebook name, a hub user, an exception's message) reaches
    the terminal or the journal neutralised, whatever the call site passed.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as :class:`logging.Formatter` writes it, each line made printable."""
        return printable_lines(super().format(record))


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def mask_secrets(args: Sequence[str]) -> list[str]:
    """A command line with the values of token-like options replaced by ``***``.

    Masks ``--anything-token=VALUE`` and ``token=VALUE`` (any key naming a token, password,
    secret, API key, credential or auth, or ending in ``key`` like ``--Session.key``), the
    value after such an option given on its own (``--token VALUE``), and such keys in a URL's
    query string.
    """
    masked: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            masked.append(_MASK)
            hide_next = False
            continue
        key, equals, _ = arg.partition("=")
        if equals and _SECRET_WORDS.search(key) and "://" not in key:
            masked.append(f"{key}={_MASK}")
        elif arg.startswith("-") and not equals and _SECRET_WORDS.search(arg):
            masked.append(arg)
            hide_next = True
        else:
            masked.append(_mask_query(arg))
    return masked


def _mask_query(arg: str) -> str:
    if "?" not in arg and "&" not in arg:
        return arg
    return re.sub(
        r"([?&;][^=&#\s]*(?:token|passw|secret|api_?key|auth)[^=&#\s]*=)[^&#\s]*",
        lambda m: m.group(1) + _MASK,
        arg,
        flags=re.IGNORECASE,
    )


def parse_number(text: str, what: str, *, low: float, high: float, low_open: bool = True) -> float:
    """A plain ASCII decimal in ``(low, high]`` (``[low, high]`` with ``low_open=False``).

    Raises ValueError, naming ``what``, for anything else: other scripts' digits, NaN,
    infinities, and numbers out of range.
    """
    word = text.strip()
    if not _ASCII_NUMBER.fullmatch(word):
        raise ValueError(f"{what} must be a plain number like 0.5, got {printable(text)!r}")
    value = float(word)
    below = value <= low if low_open else value < low
    if not math.isfinite(value) or below or value > high:
        bracket = "(" if low_open else "["
        raise ValueError(f"{what} must be in {bracket}{low:g}, {high:g}], got {word}")
    return value


def parse_count(text: str, what: str, *, low: int = 1, high: int) -> int:
    """A whole number of ASCII digits in ``[low, high]``; ValueError naming ``what`` otherwise."""
    word = text.strip()
    if not _ASCII_COUNT.fullmatch(word) or len(word) > 19:
        raise ValueError(f"{what} must be a whole number like 10, got {printable(text)!r}")
    value = int(word)
    if not low <= value <= high:
        raise ValueError(f"{what} must be between {low} and {high}, got {value}")
    return value
