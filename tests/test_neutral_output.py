"""Text a user wrote reaches a terminal or a log only neutralised: the source is checked.

A notebook name with ``ESC]0;…BEL`` or ``ESC[2J``, a hub user, a process's command line are
their users' words. Where ``jax-nbmem`` prints or logs (``shutdown``, ``cull``, the exporter,
the node agent, the server extension, the administrators' log), every call is checked here on
the source, so that a new one that prints a label raw fails CI:

- ``print(...)``: each argument is a string literal, or one of the neutralising calls
  (``printable``, ``printable_lines``, ``json.dumps``, which escapes every control character);
- ``<log or out or stream>.write(...)``: the same (``json.dumps(...) + "\\n"`` too);
- ``log.info/warning/...(...)``: the message is a literal, and each argument of a ``%s`` or
  ``%r`` is a neutralising call (numbers, ``%d``, cannot carry an escape). The handlers the
  commands install format with :class:`jax_nbmem.text.NeutralFormatter` besides.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from jax_nbmem.text import NeutralFormatter, printable_lines

PACKAGE = Path(__file__).resolve().parents[1] / "jax_nbmem"
WHERE = ("cli", "agent", "server")
NEUTRAL_CALLS = {"printable", "printable_lines", "dumps"}
LOG_LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
WRITERS = {"log", "out", "stream", "stdout", "stderr"}
_CONVERSION = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?([a-zA-Z%])")


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _neutral(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(v, ast.Constant) for v in node.values)
    if isinstance(node, ast.Call):
        return _name(node.func) in NEUTRAL_CALLS
    if isinstance(node, ast.IfExp):
        return _neutral(node.body) and _neutral(node.orelse)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _neutral(node.left) and _neutral(node.right)
    return False


def _log_call_problem(call: ast.Call) -> str | None:
    if not call.args:
        return None
    message = call.args[0]
    if not (isinstance(message, ast.Constant) and isinstance(message.value, str)):
        return "a log message that is not a literal (user text would skip the formatting)"
    kinds = [k for k in _CONVERSION.findall(message.value) if k != "%"]
    for kind, arg in zip(kinds, call.args[1:], strict=False):
        if kind in "sr" and not _neutral(arg):
            return f"a %{kind} argument not neutralised ({ast.unparse(arg)})"
    return None


def problems(source: str, filename: str) -> list[str]:
    """Each print, write or log call of ``source`` that could carry raw user text."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        func, where = node.func, f"{filename}:{node.lineno}"
        if isinstance(func, ast.Name) and func.id == "print":
            raw = [a for a in node.args if not _neutral(a)]
            if raw:
                found.append(f"{where}: print of {ast.unparse(raw[0])}")
        elif isinstance(func, ast.Attribute) and func.attr == "write":
            if _name(func.value) in WRITERS and node.args and not _neutral(node.args[0]):
                found.append(f"{where}: write of {ast.unparse(node.args[0])}")
        elif isinstance(func, ast.Attribute) and func.attr in LOG_LEVELS:
            if _name(func.value) in {"log", "logger", "logging"}:
                problem = _log_call_problem(node)
                if problem:
                    found.append(f"{where}: {problem}")
    return found


def test_every_print_write_and_log_of_the_commands_is_neutralised():
    found = []
    for part in WHERE:
        for path in sorted((PACKAGE / part).rglob("*.py")):
            found += problems(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not found, "raw text on its way to a terminal or a log:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ('print(f"would stop {kernel.label()}")', True),
        ('print(printable_lines(f"would stop {kernel.label()}"))', False),
        ("print(stopped.message)", True),
        ('print("plain words")', False),
        ('log.write(json.dumps(entry) + "\\n")', False),
        ("out.write(event['message'])", True),
        ('log.info("refused %s", reason)', True),
        ('log.info("refused %s", printable(reason))', False),
        ('log.info("PID %d refused", pid)', False),
        ('log.info(f"refused {reason}")', True),
        ("handler.wfile.write(body)", False),  # an HTTP body, not a terminal or a log
    ],
)
def test_the_scan_catches_raw_text_and_passes_neutralised_text(source, caught):
    assert bool(problems(source, "x.py")) is caught


def test_the_neutral_formatter_escapes_what_a_record_carries():
    import logging

    record = logging.LogRecord("jax_nbmem", logging.INFO, "x", 1, "refused %s", ("\x1b[2Jx",), None)
    shown = NeutralFormatter("%(message)s").format(record)
    assert shown == "refused \\x1b[2Jx" == printable_lines("refused \x1b[2Jx")
