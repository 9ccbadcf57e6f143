"""``%jaxnbmem ARGS``: the ``jax-nbmem`` command from a cell, without IPython's fork.

Once JAX's backend has started, JAX warns on every ``os.fork()`` (an ``os.register_at_fork``
hook: a forked copy of a process with JAX's threads may deadlock before it execs). IPython's
``!cmd`` forks so for any command (``pexpect`` → ``pty.fork`` → ``os.forkpty``), and runs
Python code in the child before its ``exec``: ``!echo hi`` prints the warning as
``!jax-nbmem status`` does. ``subprocess`` does not: CPython's ``_posixsubprocess`` spawns
(``vfork`` or ``fork``, then ``exec`` in C, no Python code between) and runs no at-fork hooks
unless a ``preexec_fn`` is given. So this magic runs the command the kernel's own Python
installed (``python -m jax_nbmem.cli``) through ``subprocess``, streams what it prints into
the cell, and leaves its exit status in ``_exit_code``, as ``!`` does.

While the extension is loaded, a line ``!jax-nbmem ARGS`` whose arguments are plain words
(no pipes, quotes, ``$``, ``{}``: nothing a shell or IPython would expand) runs the same
way, through a token transformer that matches that line alone, and never inside a string, a
comment or a ``%%`` cell. Any other ``!`` line, and the user's own forks, are left to IPython
and to JAX's warning.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import tokenize

from IPython.core.error import UsageError
from IPython.core.inputtransformer2 import EscapedCommand
from IPython.core.magic import Magics, line_magic, magics_class

from jax_nbmem.text import printable

__all__ = ["CliMagics", "JAXNBMEM_HELP", "OwnCommandLine", "register", "unregister"]

# `!jax-nbmem` and arguments a shell would pass through as they are.
_PLAIN_LINE = re.compile(r"!jax-nbmem(?:[ \t]+[\w./:=,@+-]+)*[ \t]*\r?\n?")

JAXNBMEM_HELP = """\
%jaxnbmem [ARGS]: run `jax-nbmem ARGS` (status, shutdown, kernel ...) from a cell.

The jax-nbmem command of this kernel's Python, in a process of its own, run without
IPython's fork: JAX's "os.fork() was called" warning, which `!cmd` prints for any command
once JAX has started, does not appear. What it prints shows in the cell; its exit status
is left in `_exit_code`; interrupting the kernel stops it. While the extension is loaded,
`!jax-nbmem ARGS` runs this way too when ARGS are plain words (no pipes, quotes, $ or {}).
"""


@magics_class
class CliMagics(Magics):
    """``%jaxnbmem``: the CLI in a subprocess (see the module)."""

    @line_magic
    def jaxnbmem(self, line: str = "") -> None:
        """%jaxnbmem [ARGS]: see ``JAXNBMEM_HELP`` (set as the help when the extension loads)."""
        try:
            words = shlex.split(line)
        except ValueError as exc:  # "No closing quotation", "No escaped character"
            raise UsageError(f"%jaxnbmem: cannot read the arguments ({printable(exc)})") from None
        self.shell.user_ns["_exit_code"] = run_cli(words)


def run_cli(words: list[str]) -> int:
    """Run ``jax-nbmem WORDS`` and copy what it prints to this process's stdout; its status.

    Interrupted (the kernel's Interrupt), the command is stopped and the status is that of
    its end (-2: it ended on the SIGINT sent to it).
    """
    command = [sys.executable, "-m", "jax_nbmem.cli", *words]
    with subprocess.Popen(  # no preexec_fn: nothing but C runs between fork and exec
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", bufsize=1,
    ) as child:  # fmt: skip
        try:
            assert child.stdout is not None
            for line in child.stdout:
                sys.stdout.write(line)
            return child.wait()
        except KeyboardInterrupt:
            child.send_signal(signal.SIGINT)
            try:
                status = child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                status = child.wait()
            print("jax-nbmem: interrupted", file=sys.stderr)
            return status


class OwnCommandLine(EscapedCommand):
    """A ``!jax-nbmem ARGS`` line of plain words, run as ``%jaxnbmem ARGS`` (see the module)."""

    priority = 1  # before IPython's own `!` at the same place

    @classmethod
    def find(cls, tokens_by_line):
        """The first line that starts with ``!jax-nbmem`` and holds only plain words."""
        for line in tokens_by_line:
            tokens = [t for t in line if t.type not in (tokenize.INDENT, tokenize.DEDENT)]
            if not tokens or tokens[0].string != "!":
                continue
            text = tokens[0].line[tokens[0].start[1] :]
            if _PLAIN_LINE.fullmatch(text):
                return cls(tokens[0].start)
        return None

    def transform(self, lines):
        """Replace the line with a call of the magic, its indentation kept."""
        text = lines[self.start_line]
        indent, rest = text[: self.start_col], text[self.start_col :].strip()
        arguments = rest.removeprefix("!jax-nbmem").strip()
        call = f"get_ipython().run_line_magic('jaxnbmem', {arguments!r})"
        return [*lines[: self.start_line], f"{indent}{call}\n", *lines[self.start_line + 1 :]]


def register(shell) -> CliMagics:
    """Add the magic and the ``!jax-nbmem`` line's transformer to *shell*."""
    magics = CliMagics(shell)
    CliMagics.jaxnbmem.__doc__ = JAXNBMEM_HELP
    shell.register_magics(magics)
    manager = getattr(shell, "input_transformer_manager", None)
    transformers = getattr(manager, "token_transformers", None)
    if isinstance(transformers, list) and OwnCommandLine not in transformers:
        transformers.insert(0, OwnCommandLine)
    return magics


def unregister(shell, magics: CliMagics) -> None:
    """Take the magic and the transformer away again."""
    manager = getattr(shell, "input_transformer_manager", None)
    transformers = getattr(manager, "token_transformers", None)
    if isinstance(transformers, list) and OwnCommandLine in transformers:
        transformers.remove(OwnCommandLine)
    for name in magics.magics.get("line", {}):
        shell.magics_manager.magics["line"].pop(name, None)
    shell.magics_manager.registry.pop(type(magics).__name__, None)
