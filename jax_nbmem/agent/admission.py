"""Who may open a connection to the node agent: limits at accept, before the first line.

A caller's *group* is what a limit counts, read from the host's side at accept (nothing the
caller says yet):

- Unix socket: its PID namespace, the outermost one below the host's (a container's, or a
  pod's; namespaces a caller nests inside it count as that one), read through
  ``/proc/PID/ns/pid`` and the kernel's ``NS_GET_PARENT``, when root made it (rootful Docker,
  Podman, Kubernetes: its owning user namespace is the host's, or one whose outermost
  ancestor below the host's root owns): every container runs as the same ``jovyan`` (uid
  1000), so a per-user limit there would make one container's quota every container's. A PID
  namespace that a non-root user made (``unshare --user --pid``: any user can make thousands)
  counts as that user: its owning user namespace is walked up (``NS_GET_USERNS``,
  ``NS_GET_PARENT``) to the one just below the host's, whose owner (``NS_GET_OWNER_UID``) is
  the user who made it (nested ones are owned by her subordinate UIDs; the outermost by her).
  A process in the host's own PID namespace is grouped by its UID: on a plain host users are
  distinct. So one user's minted namespaces and her host processes are one group, and the
  reserve stays for callers whose owner has none open.
- TCP: the network namespace that owns the source address (the peer finder's map, as it
  stands: no ``/proc`` walk at accept), else the address itself.

:class:`Admission` counts open connections by group and admits a new one unless the agent is
full, its group has ``per_group`` already, or only the reserved share of the slots is left
and its group already has one open (the reserve is kept for callers with none). Refusals
name the caller's own group only.
"""

from __future__ import annotations

import fcntl
import os
import resource
import struct
from collections import Counter
from dataclasses import dataclass

__all__ = ["Admission", "ServingLimits", "enough_descriptors", "namespace_maker", "unix_group"]


@dataclass(frozen=True)
class ServingLimits:
    """How much the agent serves at once, and how long it waits (see :mod:`.server`).

    ``reserved`` slots of ``max_connections`` (a quarter unless given) are kept for groups
    with none open; ``peer_pidfd=False`` binds a connection by start ticks alone.
    """

    max_connections: int = 1024
    max_per_pid: int = 4
    max_per_group: int = 64
    reserved: int | None = None
    first_line_s: float = 30.0
    line_s: float = 10.0
    write_s: float = 10.0
    lookup_workers: int = 4
    lookup_budget_s: float = 1.0
    peer_pidfd: bool = True


_NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1), linux/nsfs.h
_NS_GET_PARENT = 0xB702  # _IO(0xb7, 0x2)
_NS_GET_OWNER_UID = 0xB704  # _IO(0xb7, 0x4): a uid_t, as the caller's user namespace maps it
_MAX_NESTING = 33  # the kernel's own bound on PID (32) and user (32) namespace nesting


def unix_group(proc: str, pid: int, uid: int) -> tuple:
    """The group of a Unix-socket caller (host PID ``pid``, socket UID ``uid``); see the module."""
    try:
        fd = os.open(f"{proc}/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ("uid", uid)  # unreadable (gone, or no ptrace access): counted as its user
    try:
        outer, host_pid_ns = os.fstat(fd).st_ino, os.stat(f"{proc}/{os.getpid()}/ns/pid").st_ino
        if outer == host_pid_ns:
            return ("uid", uid)
        fd, outer = _outermost(fd, outer, host_pid_ns)
        maker = namespace_maker(fd, os.stat(f"{proc}/{os.getpid()}/ns/user").st_ino)
        return ("uid", maker) if maker else ("pid_ns", outer)
    except OSError:
        return ("uid", uid)
    finally:
        os.close(fd)


def _outermost(fd: int, ino: int, top: int) -> tuple[int, int]:
    """(fd, inode) of the namespace of ``fd``'s ancestry whose parent is ``top``.

    ``fd`` is consumed: closed unless it is the one returned.
    """
    for _ in range(_MAX_NESTING):
        try:
            parent = fcntl.ioctl(fd, _NS_GET_PARENT)
        except OSError:
            break  # the parent is outside the agent's namespace, or no NS_GET_PARENT
        try:
            parent_ino = os.fstat(parent).st_ino
        except OSError:
            os.close(parent)
            break
        if parent_ino == top:
            os.close(parent)
            break
        os.close(fd)
        fd, ino = parent, parent_ino
    return fd, ino


def namespace_maker(fd: int, host_user_ns: int) -> int | None:
    """The host UID of the non-root user who made the namespace open at ``fd``; None: root did.

    Its owning user namespace (``NS_GET_USERNS``) walked up to the one just below
    ``host_user_ns`` (the agent's, by inode), and that one's owner (``NS_GET_OWNER_UID``).
    None as well where the kernel has none of these calls: the namespace keeps its own group.
    """
    try:
        user = fcntl.ioctl(fd, _NS_GET_USERNS)
    except OSError:
        return None
    try:
        ino = os.fstat(user).st_ino
        if ino == host_user_ns:
            return None  # made with the host's privileges: root (a rootful runtime, the kubelet)
        user, _ = _outermost(user, ino, host_user_ns)
        owner = bytearray(4)
        fcntl.ioctl(user, _NS_GET_OWNER_UID, owner, True)
        return struct.unpack("=I", owner)[0] or None
    except OSError:
        return None
    finally:
        os.close(user)


class Admission:
    """Open connections by group, and whether one more may open (see the module).

    ``reserve`` slots of ``limit`` are kept for groups with no connection open.
    """

    def __init__(self, limit: int, per_group: int, reserve: int) -> None:
        if not 0 <= reserve < limit or per_group < 1:
            raise ValueError("admission wants 0 <= reserve < limit and per_group >= 1")
        self.limit = limit
        self.per_group = per_group
        self.reserve = reserve
        self._open: Counter = Counter()
        self.total = 0

    def refusal(self, group: tuple) -> str | None:
        """Why a connection of ``group`` may not open now, or None (it may)."""
        mine = self._open[group]
        if self.total >= self.limit:
            return f"the agent has {self.limit} connections already"
        if mine >= self.per_group:
            return f"your {_said(group)} has {mine} connections to the agent already"
        if mine and self.total >= self.limit - self.reserve:
            return (
                f"the agent keeps its last {self.reserve} connections for callers with none "
                f"open, and your {_said(group)} has {mine}"
            )
        return None

    def opened(self, group: tuple) -> None:
        """Count a connection of ``group`` as open."""
        self._open[group] += 1
        self.total += 1

    def closed(self, group: tuple) -> None:
        """A connection of ``group`` closed."""
        self._open[group] -= 1
        if self._open[group] <= 0:
            del self._open[group]
        self.total -= 1

    def open_in(self, group: tuple) -> int:
        """How many connections ``group`` has open."""
        return self._open[group]


def _said(group: tuple) -> str:
    kind = group[0]
    if kind == "uid":
        return f"user (uid {group[1]})"
    if kind == "pid_ns":
        return "PID namespace"
    if kind == "net_ns":
        return "network namespace"
    return f"address {group[1]}"


def enough_descriptors(wanted: int) -> None:
    """Raise this process's soft limit on open files towards ``wanted`` (up to the hard one)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    except (OSError, ValueError):
        pass  # the limit stays; accept says EMFILE when it is reached
