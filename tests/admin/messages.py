"""The messages a page quotes, and whether the package's source still writes each of them.

docs/troubleshooting.md quotes each message on a block-quote line of its own as a code span,
``…`` standing for what varies. The source's messages are read from its string literals as
Python joins them (``"a " "b"`` and f-strings are one literal each): a value formatted in is
``…``, unless it is a module-level text constant of the package (``SCOPES_TEXT``), whose text
is put in; ``%s``-style and ``{name}`` placeholders are ``…`` too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = ["missing", "quoted_messages", "source_messages"]

_GAP = "…"
_PLACEHOLDER = re.compile(r"%(?:\.\d+)?[sdrfg]|\{[A-Za-z_][A-Za-z_0-9]*\}")


def _constants(trees: Iterable[ast.Module]) -> dict[str, str]:
    """Module-level ``NAME = "text"`` of the package, where every module agrees on the text."""
    seen: dict[str, set[str]] = {}
    for tree in trees:
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
                if isinstance(value.value, str):
                    seen.setdefault(target.id, set()).add(value.value)
    return {name: next(iter(texts)) for name, texts in seen.items() if len(texts) == 1}


def _rendered(node: ast.JoinedStr, constants: dict[str, str]) -> str:
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value.value, ast.Name) and value.value.id in constants:
            parts.append(constants[value.value.id])
        else:
            parts.append(_GAP)
    return "".join(parts)


def source_messages(package: Path) -> list[str]:
    """Every text literal of the package's modules, placeholders as ``…``, spaces collapsed."""
    trees = [ast.parse(path.read_text(encoding="utf-8")) for path in sorted(package.rglob("*.py"))]
    constants = _constants(trees)
    found = []
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                found.append(_rendered(node, constants))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
                value = node.value
                text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
                found.append(_PLACEHOLDER.sub(_GAP, text))
    return [" ".join(text.split()) for text in found]


def quoted_messages(page: str) -> list[str]:
    """The code spans of the page's block-quote lines: the messages it quotes."""
    quoted = []
    for line in page.splitlines():
        if line.startswith(">"):
            quoted += re.findall(r"`([^`]+)`", line)
    return [" ".join(text.split()) for text in quoted]


def _pattern(message: str) -> re.Pattern:
    """``message`` with each ``…`` matching any stretch (a placeholder, or words left out)."""
    return re.compile(".*?".join(re.escape(part) for part in message.split(_GAP)), re.S)


def missing(messages: Iterable[str], sources: list[str]) -> list[str]:
    """The messages no one literal of the source writes."""
    return [m for m in messages if not any(_pattern(m).search(text) for text in sources)]
