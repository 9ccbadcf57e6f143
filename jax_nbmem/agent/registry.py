"""The node agent's registry: which kernels it proved, by host PID, and its directory.

A kernel's beacon line (see :mod:`.server`) carries its ``identity`` claims; :class:`Registry`
checks them against the host's view of the socket peer's host PID (:mod:`.hostview`): PID
namespace (device, inode), innermost NSpid, start ticks, boot id, and the beacon's own PID.
All equal, and the process the one its connection is bound to (:mod:`.binding`), with the
socket's UID as its owner: the content is proven for that host PID until its connection
closes or its process ends (a reused PID starts from nothing). Nothing a caller claims is
trusted beyond that; a beacon *file* never is.

:func:`prepare_agent_dir` makes ``S/agent`` (0755) or accepts it only if it is safely ours.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from jax_nbmem.agent.binding import PROCESS_ENDED
from jax_nbmem.agent.hostview import HostView, HostViewer, beacon_key, boot_id
from jax_nbmem.node.beacons import Beacon, beacon_from

__all__ = [
    "AGENT_DIR",
    "KERNEL_KEYS",
    "MAX_KERNEL_BYTES",
    "PROCESS_ENDED",
    "AgentDirError",
    "Registration",
    "Registry",
    "beacon_from_content",
    "prepare_agent_dir",
]

AGENT_DIR = "agent"
# What the agent keeps and publishes of a kernel's beacon: the contract's keys only (a key
# of any other name is dropped), and at most MAX_KERNEL_BYTES of them as JSON (else the line
# is refused). With one registration per connection and at most max_connections of them,
# that bounds the resolution (1,024 x 8 KiB: 8 MiB at worst; an honest beacon is 1-2 KiB)
# far below the readers' 32 MiB.
KERNEL_KEYS = frozenset({
    "schema", "pid", "started_at", "user", "hub_user", "kernel_id", "notebook",
    "mode_requested", "mode_in_effect", "mode_reason", "pool_fraction", "gpus",
    "cell_running", "last_cell_finished_at", "written_at", "jax", "jaxlib", "jax_nbmem",
    "variables", "identity", "memory_caps", "pool_gpus",
})  # fmt: skip
MAX_KERNEL_BYTES = 8 * 1024


class AgentDirError(RuntimeError):
    """The agent directory is not safe to use; the message says why and what to do."""


def prepare_agent_dir(share_dir: str) -> str:
    """``S/agent``, made (0755) if missing; AgentDirError unless it is safely ours.

    Safe: a real directory (no symlink), owned by this process's user, not writable by group
    or others (what readers check before they trust it, see the contract).
    """
    try:
        shared = os.lstat(share_dir)
    except OSError as error:
        raise AgentDirError(f"the share directory {share_dir} is unreadable: {error}") from None
    if not stat.S_ISDIR(shared.st_mode):
        raise AgentDirError(f"the share directory {share_dir} is no directory (or a symlink)")
    # S/agent must stay where it is made: S is root's (or this user's), and sticky wherever
    # others may write it, so no user can rename S/agent away and put a folder of hers there.
    if shared.st_uid not in (0, os.geteuid()) or (
        shared.st_mode & 0o022 and not shared.st_mode & stat.S_ISVTX
    ):
        raise AgentDirError(
            f"the share directory {share_dir} is not root's, or others may write it and it is "
            "not sticky (mode 1777, as deploy/jax-nbmem-exporter.tmpfiles makes it)"
        )
    path = os.path.join(share_dir, AGENT_DIR)
    try:
        os.mkdir(path, 0o755)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, 0o755)  # whatever the umask; never through a link
        finally:
            os.close(fd)
    except FileExistsError:
        pass
    except OSError as error:
        raise AgentDirError(f"cannot create {path}: {error.strerror or error}") from None
    info = os.lstat(path)
    owner = os.geteuid()
    fix = (
        f"remove it (it must be made by the agent or by systemd-tmpfiles, owned by uid {owner}, "
        "mode 0755)"
    )
    if not stat.S_ISDIR(info.st_mode):
        raise AgentDirError(f"{path} is no directory (or a symlink): {fix}")
    if info.st_uid != owner:
        raise AgentDirError(f"{path} belongs to uid {info.st_uid}, not this agent's: {fix}")
    if info.st_mode & 0o022:
        raise AgentDirError(f"{path} is writable by others (mode {info.st_mode & 0o777:o}): {fix}")
    return path


def beacon_from_content(content: Mapping[str, Any], host_pid: int) -> Beacon | None:
    """The :class:`Beacon` a kernel's beacon content makes, with its host PID; None if malformed.

    The content is parsed as a beacon file is (same keys, same bounds); its ``pid`` (the
    kernel's own, in its namespace) is replaced by the host PID it was proven for.
    """
    try:
        beacon = beacon_from(dict(content), "a kernel's registration")
    except Exception:  # any shape a caller sends: no beacon, never a crash
        return None
    return None if beacon is None else replace(beacon, pid=host_pid, path=None)


@dataclass(frozen=True)
class Registration:
    """A kernel proven for ``pid`` (host) through connection ``connection``."""

    pid: int
    uid: int
    view: HostView
    content: dict
    beacon: Beacon
    proven_at: float
    connection: int

    @property
    def key(self) -> str:
        """Its beacon's key (``<pid>`` or ``<ns_ino>-<pid_in_ns>``)."""
        return beacon_key(self.view.pid_ns, self.view.pid_in_ns)


def kept_content(content: Mapping[str, Any]) -> dict:
    """What the agent keeps of a beacon's content: the keys of :data:`KERNEL_KEYS` only."""
    return {key: value for key, value in content.items() if key in KERNEL_KEYS}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Registry:
    """The proven kernels, by host PID; thread-safe. ``viewer`` reads the host's view."""

    def __init__(self, viewer: HostViewer | None = None, host_boot_id: str | None = None):
        self.viewer = HostViewer() if viewer is None else viewer
        self.boot_id = boot_id(self.viewer.proc) if host_boot_id is None else host_boot_id
        self._by_pid: dict[int, Registration] = {}
        self._lock = threading.Lock()

    def check(self, pid: int, content: Any) -> tuple[HostView | None, Beacon | None, str | None]:
        """The host's view and beacon that prove ``content`` for host PID ``pid``, or why not."""
        if not isinstance(content, dict):
            return None, None, "not a JSON object"
        claims = content.get("identity")
        if not isinstance(claims, dict):
            return None, None, "no identity claims (the beacon's 'identity' object)"
        view = self.viewer.view(pid)
        if view is None:
            return None, None, "your process cannot be read on the host (gone?)"
        if view.pid_ns is None:
            return view, None, f"your process: {view.pid_ns_reason}"
        # A refusal names the claim that failed and what was claimed, never what the host
        # sees: that would tell the caller what to claim (of another process, if the PID was
        # reused).
        ns = claims.get("pid_ns")
        if not (isinstance(ns, list) and len(ns) == 2 and all(map(_is_int, ns))):
            return view, None, "pid_ns is not [device, inode]"
        if tuple(ns) != view.pid_ns:
            return view, None, f"pid_ns {ns} is not the namespace the host sees for your process"
        in_ns = claims.get("pid_in_ns")
        if in_ns != view.pid_in_ns or not _is_int(in_ns):
            return view, None, f"pid_in_ns {in_ns!r} is not your process's PID in its namespace"
        if content.get("pid") is not None and content.get("pid") != view.pid_in_ns:
            return view, None, f"the beacon's pid {content.get('pid')!r} is not its PID"
        if claims.get("start_ticks") != view.start_ticks or not _is_int(claims["start_ticks"]):
            said = claims.get("start_ticks")
            return view, None, f"start_ticks {said!r} is not your process's start"
        if self.boot_id is None or claims.get("boot_id") != self.boot_id:
            return view, None, f"boot_id {claims.get('boot_id')!r} is not this boot's"
        beacon = beacon_from_content(content, pid)
        if beacon is None:
            return view, None, "not a beacon (schema, pid and started_at are needed)"
        size = len(json.dumps(kept_content(content), separators=(",", ":")))
        if size > MAX_KERNEL_BYTES:
            return (
                view,
                None,
                (
                    f"the beacon's keys take {size} bytes, over the {MAX_KERNEL_BYTES} the agent "
                    "keeps of a kernel"
                ),
            )
        return view, beacon, None

    def register(
        self,
        pid: int,
        uid: int,
        content: Any,
        connection: int,
        *,
        start_ticks: int | None = None,
        socket_uid: int | None = None,
    ) -> str | None:
        """Prove and register ``content`` for host PID ``pid``; None, or the reason refused.

        ``start_ticks``: the start of the process the connection is bound to (see
        :mod:`.binding`); another start is another process, refused with
        :data:`PROCESS_ENDED`. ``socket_uid``: the UID the kernel gave the socket (Unix), which
        must be the process's owner.
        """
        view, beacon, reason = self.check(pid, content)
        if view is not None and start_ticks is not None and view.start_ticks != start_ticks:
            return PROCESS_ENDED
        if reason is not None:
            return reason
        if socket_uid is not None and view.uid != socket_uid:
            return "this connection's user (its socket's UID) is not its process's owner"
        kept = kept_content(content)
        registration = Registration(pid, uid, view, kept, beacon, time.time(), connection)
        with self._lock:
            self._by_pid[pid] = registration  # a reused PID's old registration is replaced
        return None

    def drop(self, connection: int) -> list[Registration]:
        """Forget what ``connection`` proved (it closed); returns what was dropped."""
        with self._lock:
            gone = [r for r in self._by_pid.values() if r.connection == connection]
            for registration in gone:
                del self._by_pid[registration.pid]
        return gone

    def of_connection(self, pid: int, connection: int) -> Registration | None:
        """What ``connection`` proved for host PID ``pid``, or None (nothing, or not it)."""
        with self._lock:
            found = self._by_pid.get(pid)
        return found if found is not None and found.connection == connection else None

    def proven(self, views: dict[int, HostView | None] | None = None) -> dict[int, Registration]:
        """The registrations whose process still runs (same start ticks), by host PID.

        ``views`` (a dict) gets the host's view of each PID read on the way (for a HostProof).
        """
        with self._lock:
            current = dict(self._by_pid)
        alive = {}
        for pid, registration in current.items():
            seen = self.viewer.view(pid)
            if views is not None:
                views[pid] = seen
            if seen is not None and seen.start_ticks == registration.view.start_ticks:
                alive[pid] = registration
            else:
                with self._lock:
                    if self._by_pid.get(pid) is registration:
                        del self._by_pid[pid]
        return alive
