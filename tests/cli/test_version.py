"""Issue 49: ``jax-nbmem --version`` and ``-V`` print the installed package's version.

Before, the command answered "the following arguments are required: command": a user asking
which version they run (to read the right docs, to file an issue) got an error.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import jax_nbmem
from jax_nbmem.cli.command import main


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_the_command_prints_its_version_and_exits_0(flag):
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", flag], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"jax-nbmem {jax_nbmem.__version__}\n"
    assert done.stderr == ""


def test_the_version_is_the_one_the_build_stamps(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    printed = capsys.readouterr().out.split()
    assert printed == ["jax-nbmem", jax_nbmem.__version__]
    assert printed[1].count(".") >= 2  # a release number, not a placeholder


def test_help_lists_the_flag(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "-V, --version" in capsys.readouterr().out
