"""Throwaway Unix users for tests that run as root, and a Python they can run.

A throwaway user cannot read /root (0700), where this Python may live: ``python_for`` then
gives them a hard-linked copy of it (and a copy of our package) under a folder of the test's.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.jupyterlab import REPO_ROOT

__all__ = ["User", "add_user", "library_for_others", "python_for", "remove_user"]


@dataclass
class User:
    """A throwaway Unix user (for the hub tests, also a hub user of the same name)."""

    name: str
    uid: int
    gid: int
    home: Path

    def runtime_dir(self) -> Path:
        return self.home / ".local" / "share" / "jupyter" / "runtime"


def add_user(prefix: str, uid: int | None = None) -> User:
    """A new user with a home, named ``prefix`` and six hex digits; only as root.

    ``uid``: that very uid (``useradd`` refuses one that is taken).
    """
    name = f"{prefix}{secrets.token_hex(3)}"
    wanted = ["--uid", str(uid)] if uid is not None else []
    subprocess.run(
        ["useradd", "--create-home", "--shell", "/bin/bash", *wanted, name],
        check=True, capture_output=True,
    )  # fmt: skip
    entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


def remove_user(user: User) -> None:
    """Kill what the user still runs (each by its PID) and remove the user and its home."""
    for process in psutil.process_iter(["uids"]):
        try:
            if process.info["uids"] and process.info["uids"].real == user.uid:
                process.kill()
        except psutil.Error:
            continue
    subprocess.run(["userdel", "--remove", user.name], capture_output=True)


def _runs_as(user: User, python: str, env: dict, imports: str) -> str | None:
    """None when ``user`` can run ``python`` and import ``imports``; else why not."""
    code = f"import {imports}; print(jax_nbmem.__file__)"
    try:
        done = subprocess.run(
            [python, "-c", code], user=user.uid, group=user.gid, extra_groups=[],
            env=env, cwd=user.home, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    except OSError as error:
        return str(error)
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    return None


def python_for(
    user: User, folder: Path, env: dict, imports: str = "jax_nbmem", *, copy: bool = False
) -> tuple[str, dict]:
    """A Python (and its environment) that ``user`` can run: ours, or a hard-linked copy.

    ``imports`` (a comma-separated list, with ``jax_nbmem`` in it) must import for ``user``.
    The copy lies under ``folder`` (``folder/python``, the package in ``folder/src``; in a
    virtual environment, the environment too, as ``folder/venv`` over that copy); ``copy``
    asks for one even where ``user`` could run ours (a test that writes into the Python's own
    folders, such as its IPython startup folder).
    """
    env = {**env, "PYTHONPATH": str(REPO_ROOT)}
    if not copy and _runs_as(user, sys.executable, env, imports) is None:
        return sys.executable, env
    package = folder / "src"
    shutil.copytree(
        REPO_ROOT / "jax_nbmem", package / "jax_nbmem",
        ignore=shutil.ignore_patterns("__pycache__"),
    )  # fmt: skip
    base = folder / "python"
    _hard_link_copy(Path(sys.base_prefix), base)
    python = base / "bin" / Path(os.path.realpath(sys.executable)).name
    if sys.prefix != sys.base_prefix:  # a venv (the README's install): its packages too
        python = _venv_over(Path(sys.prefix), folder / "venv", python)
    library = env.get("LD_LIBRARY_PATH", "")
    env = {
        **env,
        "PYTHONPATH": str(package),
        "LD_LIBRARY_PATH": f"{base / 'lib'}:{library}" if library else str(base / "lib"),
    }
    why = _runs_as(user, str(python), env, imports)
    if why is not None:
        pytest.fail(f"{user.name} cannot run the copy of Python at {python}: {why}")
    return str(python), env


def _hard_link_copy(source: Path, copy: Path) -> None:
    """``copy`` as ``source`` with every file hard-linked (no bytes copied; same file system)."""
    done = subprocess.run(["cp", "-al", str(source), str(copy)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"no hard-linked copy of {source} at {copy}: {done.stderr}")


def _venv_over(venv: Path, copy: Path, base_python: Path) -> Path:
    """A copy of the virtual environment ``venv`` whose interpreter is ``base_python``.

    The environment's files are hard-linked; its ``pyvenv.cfg`` and its ``bin/python*`` links,
    which name the original interpreter's folder, are written anew (unlinked first: a write
    through a hard link would change the original).
    """
    _hard_link_copy(venv, copy)
    config = copy / "pyvenv.cfg"
    lines = [
        f"home = {base_python.parent}" if line.split("=")[0].strip() == "home" else line
        for line in config.read_text().splitlines()
    ]
    config.unlink()
    config.write_text("\n".join(lines) + "\n")
    for link in (copy / "bin").glob("python*"):
        if link.is_symlink():
            link.unlink()
            link.symlink_to(base_python)
    return copy / "bin" / "python"


@contextmanager
def library_for_others(simgpu_lib: Path, prefix: str) -> Iterator[Path]:
    """A folder every user can read, holding a copy of the simulated GPU's library in ``lib/``.

    The suite's own build lives where another user cannot read it; the folder (also the place
    for a state file and a HOME) is removed afterwards.
    """
    from jax_nbmem import simgpu

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        folder.chmod(0o755)
        lib = folder / "lib" / simgpu.LIBRARY_NAME
        lib.parent.mkdir(mode=0o755)
        shutil.copy(simgpu_lib, lib)
        lib.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
