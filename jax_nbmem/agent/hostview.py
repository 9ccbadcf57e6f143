"""The host's view of a host PID: its PID namespace, its PIDs there, its start, its container.

What a kernel says about itself is a claim; this is what the host sees of the same process,
read from ``/proc`` in the host's PID namespace (the node agent's, see :mod:`.agent`):

- ``nspids``: the ``NSpid`` line of ``/proc/PID/status``, from the reader's namespace down to
  the process's own; its last entry is the PID the process sees for itself (nested namespaces:
  the innermost). World-readable.
- ``pid_ns``: ``os.stat("/proc/PID/ns/pid")``'s (device, inode). For another user's process
  it needs CAP_SYS_PTRACE (ptrace's read access); without, ``pid_ns_reason`` says so.
- ``start_ticks``: field 22 of ``/proc/PID/stat``, clock ticks since boot (the same from any
  PID namespace). The command name before it may hold spaces and parentheses: fields are
  counted from the last ``)``.
- ``container``: from ``/proc/PID/cgroup`` (see :mod:`.cgroups`), named where the host can;
  a container not (fully) named yet is named again on a cached view (a pod just made may not
  be on the API's list yet).
- ``uid_in_container`` and ``user_in_container``: for a process in a container, its uid
  there and the container's own name for it (:mod:`.passwd`; the container's claim), since
  the host's account name for the same number is someone else's.

:class:`HostViewer` caches each view by (PID, start ticks), so a steady state costs one read
of ``/proc/PID/stat`` per PID; the cache is bounded. Nothing here raises for a process that
is gone or unreadable: :meth:`HostViewer.view` gives None or a view with its reasons.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from jax_nbmem.agent.cgroups import Container, ContainerNames, container_from_cgroup, named_fully
from jax_nbmem.agent.passwd import container_user

__all__ = [
    "INIT_PID_NS_INO",
    "HostView",
    "HostViewer",
    "beacon_key",
    "boot_id",
    "parse_nspids",
    "parse_start_ticks",
    "parse_uid",
    "read_proc",
]

# The initial PID namespace's inode (PROC_PID_INIT_INO, fixed since Linux 3.8).
INIT_PID_NS_INO = 0xEFFFFFFC
_CACHE_MAX = 16384
_MAX_PROC_BYTES = 64 * 1024


@dataclass(frozen=True)
class HostView:
    """What the host sees of one process (see the module); None fields were unreadable."""

    pid: int
    start_ticks: int
    nspids: tuple[int, ...]
    uid: int | None
    pid_ns: tuple[int, int] | None
    pid_ns_reason: str | None
    container: Container | None
    cgroup: str  # the raw cgroup path the container was read from ('' when unreadable)
    problems: tuple[str, ...] = field(default_factory=tuple)
    # In a container: its uid there, the container's name for it (a claim) or why none.
    uid_in_container: int | None = None
    user_in_container: str | None = None
    user_reason: str | None = None

    def shown_user(self) -> tuple[str | None, str]:
        """(the user to show, where it comes from: ``container``, ``uid`` or ``host_uid``).

        Only for a process in a container: the container's own name for its uid there (the
        container's claim, :mod:`.passwd`), else its bare uid there, else the host's uid (its
        user namespace's map unread), never the host's account name.
        """
        if self.user_in_container:
            return self.user_in_container, "container"
        if self.uid_in_container is not None:
            return str(self.uid_in_container), "uid"
        return (None if self.uid is None else str(self.uid)), "host_uid"

    @property
    def pid_in_ns(self) -> int:
        """The PID the process sees for itself (the innermost NSpid entry)."""
        return self.nspids[-1]

    @property
    def namespaced(self) -> bool:
        """Whether it lives in a PID namespace below the reader's (its PIDs differ)."""
        return len(self.nspids) > 1

    @property
    def pid_in_container(self) -> int | None:
        """Its in-namespace PID, or None when it shares the reader's PID namespace."""
        return self.nspids[-1] if self.namespaced else None


def beacon_key(pid_ns: tuple[int, int] | None, pid_in_ns: int) -> str:
    """The key of a kernel's beacon, alive lock and cull notice (contract).

    ``<pid>`` in the initial PID namespace, ``<ns_ino>-<pid_in_ns>`` in any other. An
    unreadable namespace (None) is keyed as the initial one.
    """
    if pid_ns is None or pid_ns[1] == INIT_PID_NS_INO:
        return str(pid_in_ns)
    return f"{pid_ns[1]}-{pid_in_ns}"


def boot_id(proc: str = "/proc") -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), or None when unreadable."""
    try:
        with open(os.path.join(proc, "sys/kernel/random/boot_id"), encoding="ascii") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None


def parse_start_ticks(stat_text: str) -> int | None:
    """Field 22 (starttime) of ``/proc/PID/stat``, or None when malformed."""
    _, paren, rest = stat_text.rpartition(")")
    fields = rest.split() if paren else []
    # After the command name come fields 3 (state) onwards: starttime is the 20th of them.
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return int(fields[19])


def parse_nspids(status_text: str, pid: int) -> tuple[int, ...]:
    """The ``NSpid`` entries of ``/proc/PID/status`` (``(pid,)`` on kernels without the line)."""
    for line in status_text.splitlines():
        if line.startswith("NSpid:"):
            entries = line[6:].split()
            if entries and all(e.isdigit() for e in entries):
                return tuple(int(e) for e in entries)
            break
    return (pid,)


def parse_uid(status_text: str) -> int | None:
    """The real UID on the ``Uid:`` line of ``/proc/PID/status``, or None."""
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            entries = line[4:].split()
            return int(entries[0]) if entries and entries[0].isdigit() else None
    return None


def read_proc(path: str, max_bytes: int = _MAX_PROC_BYTES) -> str:
    """The first ``max_bytes`` of a ``/proc`` file, in one read; OSError when unreadable.

    The one reader of ``/proc/PID/*`` for the agent's facts (stat, status, cgroup). os.open and
    one os.read: no file object to build (a steady refresh reads one stat file per PID); the
    kernel hands a file this small whole. ``O_NONBLOCK | O_NOFOLLOW``: a synthetic tree (or a
    container's ``/proc`` a user made) cannot hang the reader with a FIFO or point it
    elsewhere with a link.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        return os.read(fd, max_bytes).decode("utf-8", "replace")
    finally:
        os.close(fd)


class HostViewer:
    """Reads and caches :class:`HostView` records of host PIDs (see the module).

    ``proc`` is where ``/proc`` is (a synthetic tree in tests); ``names`` names containers
    (None: :class:`~.cgroups.ContainerNames` with the host's usual places). ``cache_max``
    bounds the cache (cleared when full: a new pass rebuilds it).
    """

    def __init__(
        self,
        proc: str = "/proc",
        names: ContainerNames | None = None,
        cache_max: int = _CACHE_MAX,
    ) -> None:
        self.proc = proc
        self.names = ContainerNames() if names is None else names
        self.cache_max = cache_max
        self._cache: dict[tuple[int, int], HostView] = {}
        # The agent's socket thread and the exporter's refresh share one viewer.
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def start_ticks(self, pid: int) -> int | None:
        """The process's start in clock ticks since boot, or None when gone or unreadable."""
        try:
            return parse_start_ticks(read_proc(f"{self.proc}/{pid}/stat"))
        except (OSError, ValueError):
            return None

    def view(self, pid: int) -> HostView | None:
        """The host's view of ``pid``, or None when no such process can be read now."""
        if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
            return None
        ticks = self.start_ticks(pid)
        if ticks is None:
            return None
        cached = self._cache.get((pid, ticks))
        if cached is not None:
            self.hits += 1
            if cached.container is not None and not named_fully(cached.container):
                cached = self._renamed(pid, ticks, cached)
            return cached
        self.misses += 1
        found = self._read_view(pid, ticks)
        if found is None:
            return None
        with self._lock:
            if len(self._cache) >= self.cache_max:
                self._cache.clear()
            self._cache[(pid, ticks)] = found
        return found

    def _renamed(self, pid: int, ticks: int, cached: HostView) -> HostView:
        """``cached`` with its container named again (the names' own cache says when to ask)."""
        named = self.names.name(cached.container)
        if named == cached.container:
            return cached
        renamed = replace(cached, container=named)
        with self._lock:
            self._cache[(pid, ticks)] = renamed
        return renamed

    def views(self, pids: Iterable[int]) -> dict[int, HostView]:
        """:meth:`view` of each PID that can be read, by PID."""
        found = {}
        for pid in pids:
            if pid not in found and (seen := self.view(pid)) is not None:
                found[pid] = seen
        return found

    def forget(self, alive: Iterable[int]) -> None:
        """Drop the cached views of PIDs not in ``alive`` (a pass's PIDs)."""
        keep = set(alive)
        with self._lock:
            for key in [key for key in self._cache if key[0] not in keep]:
                del self._cache[key]

    def _read_view(self, pid: int, ticks: int) -> HostView | None:
        base = f"{self.proc}/{pid}"
        problems = []
        try:
            status = read_proc(f"{base}/status")
        except (OSError, ValueError):
            return None  # gone between the two reads
        pid_ns, ns_reason = self._pid_ns(base)
        try:
            container, cgroup = container_from_cgroup(read_proc(f"{base}/cgroup"))
        except (OSError, ValueError) as error:
            container, cgroup = None, ""
            problems.append(f"cgroup unreadable: {getattr(error, 'strerror', None) or error}")
        uid = parse_uid(status)
        user: tuple = (None, None, None)
        if container is not None and uid is not None:
            user = container_user(self.proc, pid, uid)
        if self.start_ticks(pid) != ticks:
            return None  # the PID was reused while it was read: nothing of it is sure
        return HostView(
            pid=pid,
            start_ticks=ticks,
            nspids=parse_nspids(status, pid),
            uid=uid,
            pid_ns=pid_ns,
            pid_ns_reason=ns_reason,
            container=self.names.name(container),
            cgroup=cgroup,
            problems=tuple(problems),
            uid_in_container=user[0],
            user_in_container=user[1],
            user_reason=user[2] or None,
        )

    @staticmethod
    def _pid_ns(base: str) -> tuple[tuple[int, int] | None, str | None]:
        try:
            info = os.stat(f"{base}/ns/pid")
        except PermissionError:
            return None, (
                "its PID namespace is unreadable: reading another user's /proc/PID/ns/pid "
                "needs CAP_SYS_PTRACE"
            )
        except OSError as error:
            return None, f"its PID namespace is unreadable: {error.strerror or error}"
        return (info.st_dev, info.st_ino), None
