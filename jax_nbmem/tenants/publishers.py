"""Which processes a Jupyter server publishes itself, so the node exporter leaves them out.

One source per fact: when Prometheus scrapes both a node's exporter and the Jupyter servers on
it, a kernel's bytes must come from one of them only. A server extension that publishes its
own kernels (``c.JaxNbMemServer.metrics_scope = "kernels"``) says so in a small file beside the
beacons, ``jax_nbmem-publisher-<pid>.json`` (its PID and start time, URL, its kernels' PIDs,
when it was written and how often it is), rewritten after every snapshot and removed when the
server stops. ``jax-nbmem exporter --defer-to-servers`` then leaves those PIDs to that server.

A reader trusts a claim as it trusts a beacon (:mod:`.beacons`): the server's PID is alive with
the start time it states and belongs to the file's owner; a claim not rewritten for a few of
its own intervals (the server hung or gone) is ignored, so its kernels come back to the
exporter; the server holds a shared ``flock`` on its file while it stands (``/proc/locks``
shows it: no other process can make it hold one, so a file another process wrote or put in its
place, same uid or not, is not its word); and only processes that server started (its
descendants), of that same owner, can be claimed: nobody hides another's, not even a
container's of the same uid (every DockerSpawner container runs as uid 1000).

A server in a container (another PID namespace) knows its own PID only there, and its kernels'
host PIDs only when the node agent told it; it also lists their PIDs in the container
(``pids_in_container``). Its PID is never looked up as a host PID: the host's reader (the
exporter, in the host's PID namespace) finds the process the file's ``identity`` names (PID
namespace, PID there and start ticks, all three as the host sees them) and defers only that
process's own descendants of the file's owner that the file lists, by host PID or by PID in the
container (:mod:`.publishers_host`). A file from another namespace is nothing to a reader that
is not on the host.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterable

import psutil

from jax_nbmem.node.beacons import START_SLACK_S
from jax_nbmem.node.identity import INIT_PID_NS_INO, beacon_key, own_identity, same_namespace

__all__ = ["SCHEMA", "published_pids", "remove_claim", "write_claim"]

SCHEMA = 1
_PREFIX = "jax_nbmem-publisher-"
_SUFFIX = ".json"
_LEN = len(_SUFFIX)
_MAX_BYTES = 256 * 1024
# A claim is good for this many of its own intervals, and never less than _MIN_FRESH_S.
_FRESH_INTERVALS = 3
_MIN_FRESH_S = 5.0
# The claim files this process wrote, each with a shared flock held on its newest two
# generations (see _write_held).
_held: dict[str, tuple[int, ...]] = {}
_held_lock = threading.Lock()


def _path(directory: str, key: int | str) -> str:
    # Named as the beacons are (PID, or namespace inode and PID in a container), so that two
    # containers' servers of the same PID never share a file.
    return os.path.join(directory, f"{_PREFIX}{key}{_SUFFIX}")


def write_claim(
    directories: Iterable[str],
    *,
    url: str,
    pids: Iterable[int],
    interval_s: float,
    pids_in_container: Iterable[int] = (),
):
    """Say, in each directory, that this process publishes ``pids``; never raises.

    ``pids`` are host PIDs; in a container, ``pids_in_container`` its kernels' PIDs there.
    """
    me = psutil.Process()
    content = {
        "schema": SCHEMA,
        "pid": me.pid,
        "started_at": me.create_time(),
        "url": url,
        "pids": sorted({int(p) for p in pids}),
        "interval_s": float(interval_s),
        "written_at": time.time(),
        "identity": own_identity(),  # its PID namespace: its PID is the host's only outside one
        "pids_in_container": sorted({int(p) for p in pids_in_container}),
    }
    for directory in directories:
        try:
            os.makedirs(directory, exist_ok=True)
            _write_held(_path(directory, beacon_key()), json.dumps(content))
        except OSError:
            pass  # a directory we may not write: the exporter keeps these kernels


def _write_held(path: str, text: str) -> None:
    """Write ``path`` atomically, and hold a shared flock on the new file while it stands.

    The lock is the file's proof of its writer: a reader defers only for a server that holds
    a lock on the very file (``/proc/locks``), which no other process can make it hold. The
    file it replaces stays locked until the next write: a reader that opened it just before
    the replacement looks for its lock just after, and would otherwise find none and take
    this server's kernels back for one of its snapshots (each counted twice meanwhile).
    """
    fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.")
    try:
        os.fchmod(fd, 0o644)
        with open(fd, "w", encoding="utf-8", closefd=False) as out:
            out.write(text)
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.replace(partial, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    with _held_lock:
        kept = _held.get(path, ())
        _held[path] = (fd, *kept[:1])
    for old in kept[1:]:
        os.close(old)


def remove_claim(directories: Iterable[str]) -> None:
    """Take this process's claims away; never raises."""
    for directory in directories:
        path = _path(directory, beacon_key())
        try:
            os.unlink(path)
        except OSError:
            pass
        with _held_lock:
            fds = _held.pop(path, ())
        for fd in fds:
            os.close(fd)


def _lock_holders() -> set[tuple[int, int]]:
    """(PID, inode) of every flock on this host, as ``/proc/locks`` shows them.

    PIDs as this reader's namespace sees them; the device is left out (btrfs and overlay show
    another than ``stat`` does).
    """
    held = set()
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            lines = locks.read(8 << 20).splitlines()
    except OSError:
        return held
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4].isdigit():
            inode = fields[5].rpartition(":")[2]
            if inode.isdigit():
                held.add((int(fields[4]), int(inode)))
    return held


def published_pids(directories: Iterable[str], now: float | None = None) -> dict[int, str]:
    """PID → URL of the server that publishes it, from the claims that can be trusted."""
    now = time.time() if now is None else now
    found: dict[int, str] = {}
    holders = functools.cache(_lock_holders)  # read once per call, and only if a claim is found
    for directory in directories:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(_PREFIX) and entry.name.endswith(_SUFFIX):
                key = entry.name[len(_PREFIX) : -_LEN]
                claimed = _read_claim(entry.path, now, key, holders)
                if not claimed and _replaced(entry):
                    # Rewritten since it was listed: the file read may have lost its lock, or
                    # the lock list be older than it. Once more, with a fresh list.
                    holders = functools.cache(_lock_holders)
                    claimed = _read_claim(entry.path, now, key, holders)
                found.update(claimed)
    return found


def _replaced(entry: os.DirEntry) -> bool:
    """Whether *entry*'s name holds another file now than when its folder was listed."""
    try:
        return os.stat(entry.path, follow_symlinks=False).st_ino != entry.inode()
    except OSError:
        return False


def _read_claim(path: str, now: float, key: str, holders) -> dict[int, str]:
    """The PIDs a claim file defers: none if it cannot be trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_BYTES:
            return {}
        content = json.loads(os.read(fd, _MAX_BYTES + 1))
        if not isinstance(content, dict) or content.get("schema") != SCHEMA:
            return {}
        interval = float(content["interval_s"])
        if now - float(content["written_at"]) > max(_FRESH_INTERVALS * interval, _MIN_FRESH_S):
            return {}  # not rewritten lately: the server hung or is gone
        identity = content.get("identity") or {}
        ns = identity.get("pid_ns")
        if not same_namespace(ns, own_identity()["pid_ns"]) and ns is not None:
            if not same_namespace(ns, ns) or ns[1] == INIT_PID_NS_INO:
                return {}  # malformed, or the host's seen from a container: not checkable
            from jax_nbmem.tenants.publishers_host import from_namespace

            held = lambda pid: (pid, info.st_ino) in holders()  # noqa: E731
            return from_namespace(content, identity, key, info.st_uid, held)
        if key != beacon_key({"pid_in_ns": int(content["pid"]), "pid_ns": ns}):
            return {}  # its name says another server than its content
        server = psutil.Process(int(content["pid"]))
        if abs(server.create_time() - float(content["started_at"])) > START_SLACK_S:
            return {}
        owner = info.st_uid
        if server.uids().real != owner or (server.pid, info.st_ino) not in holders():
            return {}  # another's, or a file its server does not hold: not the server's word
        url = str(content.get("url") or "")
        # Only what that server started: every container writes as the same uid, so a file
        # naming another's kernel (or that kernel as its "server") defers nothing of it.
        from jax_nbmem.tenants.publishers_host import descendants

        started = set(descendants(server.pid))
        return {pid: url for pid in content["pids"] if pid in started and _owned_by(pid, owner)}
    except (OSError, ValueError, TypeError, KeyError, psutil.Error, OverflowError):
        return {}
    finally:
        os.close(fd)


def _owned_by(pid: object, uid: int) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool):
        return False
    try:
        return psutil.Process(pid).uids().real == uid
    except (psutil.Error, OverflowError, ValueError):
        return False
