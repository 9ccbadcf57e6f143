"""The host's check of a publisher file written in a container (see :mod:`.publishers`).

Such a file names its server by what the server says of itself (``identity``: its PID
namespace, its PID there, its start in clock ticks since boot). Those are claims: every
container writes as the same user. The host, and only the host, can see which process they
name: :func:`from_namespace` finds the host PID whose namespace (device and inode), innermost
NSpid entry and start ticks are those three (first among the ancestors of the host PIDs the
file lists, else by one pass over ``/proc``, remembered while that process lives), and
defers only what that process started: its descendants, of the file's owner, that the file
lists by host PID or by PID in the container. A file naming another container's server
defers nothing but that server's own kernels; one naming no live process, nothing (and is not
looked for again by a pass over ``/proc`` for a minute). Reading another user's
``/proc/PID/ns/pid`` needs CAP_SYS_PTRACE, as the node agent has: without it nothing matches,
and the exporter keeps those kernels (counted twice, never hidden).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from jax_nbmem.agent.hostview import HostView, HostViewer, boot_id, parse_nspids
from jax_nbmem.node.identity import beacon_key, in_initial_namespace, same_namespace

__all__ = ["descendants", "from_namespace"]

_MAX_ANCESTORS = 16
_MAX_SCAN = 1 << 17  # /proc entries looked at to find one server
_MAX_LISTED = 4096

_viewer = HostViewer()
_lock = threading.Lock()
_found: dict[tuple, int] = {}  # (ns, pid in ns, start ticks) -> host PID, while it matches
_missed: dict[tuple, float] = {}  # the same -> when a pass over /proc may look for it again
_MISSED_S = 60.0


def from_namespace(
    content: Mapping[str, Any],
    identity: Mapping[str, Any],
    key: str,
    owner: int,
    holds_file: Callable[[int], bool] | None = None,
) -> dict[int, str]:
    """Host PID → URL of the kernels this file's server started (see the module); or {}.

    ``holds_file(host_pid)``: whether that process holds its lock on the file (the writer's
    proof, :mod:`.publishers`); None: not asked.
    """
    if not in_initial_namespace():
        return {}  # another namespace's PIDs: only the host can tell what they are
    ns, in_ns = identity.get("pid_ns"), identity.get("pid_in_ns")
    ticks = identity.get("start_ticks")
    if not (_is_pid(in_ns) and (ticks == 0 or _is_pid(ticks)) and same_namespace(ns, ns)):
        return {}
    if key != beacon_key(identity) or in_ns != content.get("pid"):
        return {}  # its name says another server than its content
    if identity.get("boot_id") != boot_id():
        return {}  # another boot's ticks mean nothing now
    host_pids = _pids(content.get("pids"))
    in_container = _pids(content.get("pids_in_container"))
    server = _server((ns[0], ns[1]), in_ns, ticks, host_pids)
    if server is None or server.uid != owner:
        return {}
    if holds_file is not None and not holds_file(server.pid):
        return {}  # the server named holds no lock on this file: not its word
    url = str(content.get("url") or "")
    found = {}
    for pid in descendants(server.pid):
        view = _viewer.view(pid)
        if view is None or view.uid != owner:
            continue
        if pid in host_pids or (view.namespaced and view.pid_in_ns in in_container):
            found[pid] = url
    return found


def descendants(pid: int) -> list[int]:
    """The host PIDs ``pid`` started, and theirs: from each task's ``children`` list.

    That costs what the server's own tree holds, not a pass over every process; where the
    kernel has no such list (CONFIG_PROC_CHILDREN), psutil's pass over them.
    """
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < _MAX_LISTED:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
            listed = []
            for task in tasks:
                with open(f"/proc/{parent}/task/{task}/children", encoding="ascii") as f:
                    listed.extend(int(child) for child in f.read().split())
        except FileNotFoundError:
            if parent != pid or not os.path.exists(f"/proc/{pid}"):
                continue  # gone meanwhile
            try:  # no children lists in this kernel
                return [p.pid for p in psutil.Process(pid).children(recursive=True)]
            except psutil.Error:
                return []
        except (OSError, ValueError):
            continue
        found.extend(listed)
        todo.extend(listed)
    return found


def _server(ns: tuple[int, int], in_ns: int, ticks: int, hints: set[int]) -> HostView | None:
    """The host's view of the process of namespace ``ns``, PID ``in_ns`` there, ``ticks``."""
    wanted = (ns, in_ns, ticks)
    with _lock:
        known = _found.get(wanted)
    if known is not None:
        view = _viewer.view(known)
        if _is(view, wanted):
            return view
        with _lock:
            _found.pop(wanted, None)
    view = _among_ancestors(wanted, hints)
    if view is None:
        # A pass over /proc, at most once a minute for what named no process: anyone can
        # write files that name none, and they must not cost a pass at every refresh.
        with _lock:
            if time.monotonic() < _missed.get(wanted, 0.0):
                return None
        view = _by_scan(wanted)
    with _lock:
        if len(_found) > 1024 or len(_missed) > 1024:
            _found.clear()
            _missed.clear()
        if view is None:
            _missed[wanted] = time.monotonic() + _MISSED_S
        else:
            _found[wanted] = view.pid
    return view


def _is(view: HostView | None, wanted: tuple) -> bool:
    ns, in_ns, ticks = wanted
    return (
        view is not None
        and view.namespaced
        and view.pid_ns == ns
        and view.pid_in_ns == in_ns
        and view.start_ticks == ticks
    )


def _among_ancestors(wanted: tuple, hints: set[int]) -> HostView | None:
    for pid in sorted(hints)[:64]:
        try:
            process = psutil.Process(pid)
            for _ in range(_MAX_ANCESTORS):
                process = process.parent()
                if process is None:
                    break
                view = _viewer.view(process.pid)
                if _is(view, wanted):
                    return view
        except psutil.Error:
            continue
    return None


def _by_scan(wanted: tuple) -> HostView | None:
    """One pass over /proc: the cheap NSpid test first, the full view only where it agrees."""
    _, in_ns, _ = wanted
    try:
        names = os.listdir("/proc")[:_MAX_SCAN]
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read(8192).decode("utf-8", "replace")
        except OSError:
            continue
        nspids = parse_nspids(status, int(name))
        if len(nspids) > 1 and nspids[-1] == in_ns:
            view = _viewer.view(int(name))
            if _is(view, wanted):
                return view
    return None


def _pids(value: Any) -> set[int]:
    if not isinstance(value, list):
        return set()
    return {p for p in value[:_MAX_LISTED] if _is_pid(p)}


def _is_pid(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63
