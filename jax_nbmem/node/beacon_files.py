"""Beacon files: one read safely, and a kernel's fallback name when another took its own.

:func:`read_small_file` reads a file anyone may have put in a shared directory (a regular
file, of at most so many bytes, never through a symlink, never blocking on a FIFO).

A beacon is ``jax_nbmem-beacon-<key>.json`` (:mod:`.beacons`), and in a shared, sticky
directory anyone may create any name first: a file of another user at a kernel's name cannot
be replaced (a rename over another's file in a sticky folder is refused), so a squatter would
leave the kernel without a beacon, and every reader without what only a beacon says (idle
time, mode, kernel id). A kernel whose name is taken writes
``jax_nbmem-beacon-<key>.<16 random hex digits>.json`` instead (:func:`fallback_name`):
unpredictable, so nobody can take it first. A reader that finds the name of a PID it looks at
taken by a file it cannot trust looks, with one listing of that directory, for the fallbacks of
that key (:func:`fallbacks`, at most :data:`MAX_FALLBACKS` each) and trusts one as it trusts a
beacon: alive, the same start, owned by the process's owner. The agent's clean-up removes a
fallback with its key's (:mod:`jax_nbmem.agent.publish`).
"""

from __future__ import annotations

import os
import re
import secrets
import stat

import psutil

__all__ = [
    "BEACON_PREFIX",
    "BEACON_SUFFIX",
    "FALLBACK",
    "MAX_FALLBACKS",
    "fallback_name",
    "fallback_path",
    "fallbacks",
    "names_by_key",
    "owned_by",
    "owner_of",
    "read_file_head",
    "read_small_file",
    "taken_by_another",
]

BEACON_PREFIX, BEACON_SUFFIX = "jax_nbmem-beacon-", ".json"
# <key>.<suffix>: a key as a writer spells it (<pid> or <ns inode>-<pid>).
FALLBACK = re.compile(
    r"jax_nbmem-beacon-([1-9][0-9]{0,19}(?:-[1-9][0-9]{0,9})?)\.([0-9a-f]{16})\.json"
)
MAX_FALLBACKS = 8  # per key: a squatter may make any number of look-alikes
_MAX_NAMES = 100_000
_MAX_BYTES = 64 * 1024


def fallback_name(key: str) -> str:
    """A new, unpredictable beacon name for ``key``."""
    return f"{BEACON_PREFIX}{key}.{secrets.token_hex(8)}{BEACON_SUFFIX}"


def fallback_path(path: str, key: str) -> str:
    """A fallback path beside ``path`` for ``key``."""
    return os.path.join(os.path.dirname(path), fallback_name(key))


def taken_by_another(path: str) -> bool:
    """Whether something that is not this user's regular file holds the name ``path``."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid()


def fallbacks(directory: str, owners: dict[str, int | None]) -> dict[str, list[str]]:
    """The paths of fallback beacons in ``directory`` by key, for the keys of ``owners`` only.

    Only regular files of the key's process's owner (``owners[key]``); one listing.
    """
    found: dict[str, list[str]] = {}
    for key, names in names_by_key(directory, FALLBACK).items():
        if owners.get(key) is not None:
            found[key] = owned_by(directory, names, owners[key])
    return found


def names_by_key(directory: str, pattern: re.Pattern[str]) -> dict[str, list[str]]:
    """The names in ``directory`` that ``pattern`` matches whole, by its first group (a key).

    One listing, of at most so many names; {} when the directory cannot be listed.
    """
    found: dict[str, list[str]] = {}
    try:
        names = os.listdir(directory)[:_MAX_NAMES]
    except (OSError, ValueError):
        return found
    for name in names:
        match = pattern.fullmatch(name)
        if match:
            found.setdefault(match.group(1), []).append(name)
    return found


def owned_by(directory: str, names: list[str], owner: int | None) -> list[str]:
    """The paths of ``names`` that are regular files of ``owner``: at most MAX_FALLBACKS.

    A squatter's look-alikes are hers: never the owner's, so they never crowd out the owner's.
    """
    paths = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_uid == owner:
            paths.append(path)
            if len(paths) >= MAX_FALLBACKS:
                break
    return paths


def owner_of(pid: int) -> int | None:
    """The real UID of the process ``pid``, or None (gone, or not readable)."""
    try:
        return psutil.Process(pid).uids().real
    except (psutil.Error, OverflowError, ValueError):
        return None


def read_small_file(path: str, max_bytes: int = _MAX_BYTES) -> tuple[bytes, os.stat_result] | None:
    """The bytes of the regular file at ``path`` and its ``fstat``, or None; never blocks.

    For files anyone may have put there: a symlink, a FIFO (opened without blocking, never
    read), a directory, a device, a socket or a file over ``max_bytes`` gives None.
    """
    return _read_regular(path, max_bytes, refuse_larger=True)


def read_file_head(path: str, max_bytes: int) -> tuple[bytes, os.stat_result] | None:
    """The head of the regular file at ``path`` (``max_bytes`` + 1 bytes at most), its ``fstat``.

    Read as :func:`read_small_file` reads, or None. More than ``max_bytes`` back says that the
    file goes on: a reader that can use a file's head need not open it twice.
    """
    return _read_regular(path, max_bytes, refuse_larger=False)


def _read_regular(path: str, max_bytes: int, *, refuse_larger: bool):
    try:
        fd = os.open(
            path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | os.O_CLOEXEC
        )
    except (OSError, ValueError):  # a symlink (ELOOP), gone, not ours to read, a NUL in it
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (refuse_larger and info.st_size > max_bytes):
            return None
        chunks, size = [], 0
        while size <= max_bytes:
            wanted = max_bytes + 1 - size
            chunk = os.read(fd, wanted)
            chunks.append(chunk)
            size += len(chunk)
            if len(chunk) < wanted:  # the end of a regular file
                break
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if refuse_larger and len(data) > max_bytes:
        return None  # it grew while read
    return data, info
