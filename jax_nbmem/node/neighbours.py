"""Beacons from other PID namespaces (other containers, or the host seen from one): claims.

A kernel in another container writes ``jax_nbmem-beacon-<ns inode>-<pid>.json`` into the
shared directory. Its PID means nothing here and every container's user may be ``jovyan``, so
nothing in it can be checked: it is a *claim*. Whether its writer still runs is told by its
alive lock (:mod:`jax_nbmem.node.alive`), which works across namespaces. Claims may feed an
attribution marked ``inferred``; never a cull, a stop or a button.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from jax_nbmem.node.alive import fallback_locks, lock_alive
from jax_nbmem.node.beacon_files import BEACON_PREFIX, BEACON_SUFFIX
from jax_nbmem.node.beacons import (
    MAX_PIDS,
    Beacon,
    beacon_dirs,
    listed_keys,
    parse_beacon_file,
)
from jax_nbmem.node.identity import INIT_PID_NS_INO, beacon_key, own_identity

__all__ = ["alive_by_lock", "read_beacon_by_key", "read_claims"]


def read_beacon_by_key(dirs: Iterable[str], key: str) -> Beacon | None:
    """The newest well-formed beacon named by ``key`` in ``dirs`` (a claim: not checked)."""
    found = _newest_by_key(dirs, key)
    return None if found is None else found[0]


def _newest_by_key(dirs: Iterable[str], key: str) -> tuple[Beacon, int] | None:
    """The newest beacon named by ``key`` and its file's owner's UID."""
    best = None
    for directory in dirs:
        found = parse_beacon_file(os.path.join(directory, f"{BEACON_PREFIX}{key}{BEACON_SUFFIX}"))
        if found is not None and (best is None or found[0].written_at > best[0].written_at):
            best = (found[0], found[1].st_uid)
    return best


def alive_by_lock(
    dirs: Iterable[str],
    key: str,
    owner: int | None = None,
    listings: dict[str, dict[str, list[str]]] | None = None,
) -> bool | None:
    """Whether the kernel of ``key`` holds its alive lock in any of ``dirs`` (None: no lock).

    ``owner``: the UID of the beacon's owner: a lock file of anyone else is a squatter's and
    ignored (None: any owner's counts). Where the lock at the key's own name does not say
    alive, the kernel's fallback names are asked too, found by one listing of each directory,
    kept in ``listings`` for the next key (:mod:`jax_nbmem.node.alive`).
    """
    listings = {} if listings is None else listings
    answers = []
    for directory in dirs:
        answer = lock_alive(directory, key, owner)
        if answer is not True:
            if directory not in listings:
                listings[directory] = fallback_locks(directory)
            if listings[directory].get(key):
                answer = lock_alive(directory, key, owner, listings[directory][key])
        answers.append(answer)
    if True in answers:
        return True
    return False if False in answers else None


def read_claims(
    dirs: Iterable[str] | None = None, own: Mapping[str, Any] | None = None
) -> list[Beacon]:
    """The beacons of live kernels in PID namespaces other than ``own``'s (default: ours).

    Live means its alive lock, a file of the beacon's owner, is held; a beacon without a
    lock, or whose lock is free (its kernel was killed and left its files) or another user's
    (a squatter's), is left out. A beacon counts only when what it says of its namespace and
    PID agrees with its file's name. At most ``MAX_PIDS``, after at most twice as many locks
    asked (so junk left in a shared folder costs a bounded time);
    never raises.
    """
    own = own_identity() if own is None else own
    dirs = [d for d in (beacon_dirs() if dirs is None else dirs) if isinstance(d, str) and d]
    found: dict[str, Beacon] = {}
    listings: dict[str, dict[str, list[str]]] = {}  # fallback locks, one listing a directory
    tested = 0  # locks asked: whatever anyone leaves in a shared folder costs a bounded time
    for directory in dirs:
        for key, ino, pid in listed_keys(directory):
            if key == beacon_key({**own, "pid_in_ns": pid}) or key in found:
                continue  # ours (checked by PID instead), or seen in another directory
            if len(found) >= MAX_PIDS or tested >= 2 * MAX_PIDS:
                return list(found.values())
            tested += 1
            newest = _newest_by_key(dirs, key)
            if newest is None:
                continue
            beacon, owner = newest  # only its owner's lock says it lives: not a squatter's
            if alive_by_lock(dirs, key, owner, listings) is True and _agrees(beacon, ino, pid):
                found[key] = beacon
    return list(found.values())


def _agrees(beacon: Beacon, ino: int | None, pid: int) -> bool:
    identity = beacon.identity or {}
    if beacon.pid != pid or identity.get("pid_in_ns") not in (None, pid):
        return False
    ns = identity.get("pid_ns")
    if ino is None:  # a host kernel's name: it says the host's namespace, or nothing
        return ns is None or ns[1] == INIT_PID_NS_INO
    return ns is not None and ns[1] == ino
