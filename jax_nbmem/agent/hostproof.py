"""What the host knows for sure about NVML's PIDs: the agent's proofs and the host's own view.

On the host (the node agent itself; root's ``jax-nbmem status``, the culler and
``jax-nbmem shutdown``), NVML's PIDs are the host's own: :class:`HostProof` gives, per host
PID, the container and in-container PID the host sees, and the kernel the node agent proved
(from its registry in the agent's own process, else from ``S/agent/resolution.json`` when
that is trusted and fresh, each entry checked again against the PID's start ticks).

Beacons: a beacon *file* is never proof for a process in another PID namespace (every
container writes as the same user; anyone could name another container's host PID), so
:meth:`HostProof.beacons` drops those and puts the proven ones in their place. Proven rows
say ``source: agent``.

Only where NVML's PIDs are ours: :func:`host_proof` gives None unless this process is in the
initial PID namespace (the host, or a pod with the host's PID namespace). Inside a container
the same numbers would name other processes.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import socket
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from jax_nbmem.agent.hostview import INIT_PID_NS_INO, HostView, HostViewer, beacon_key
from jax_nbmem.agent.publish import FULL_RESOLUTION_NAME, RESOLUTION_NAME, RESOLUTION_SCHEMA
from jax_nbmem.agent.server import AGENT_DIR, Registration, beacon_from_content
from jax_nbmem.node.beacons import Beacon
from jax_nbmem.node.resolution import SHOWN_KEYS
from jax_nbmem.node.sharedir import find_share_dir

__all__ = [
    "ENV_AGENT_USER",
    "HostProof",
    "ProvenKernel",
    "host_proof",
    "in_initial_pid_namespace",
    "public_container",
    "read_resolution",
]

ENV_AGENT_USER = "JAX_NBMEM_AGENT_USER"
_MAX_RESOLUTION_BYTES = 32 << 20
# What a reader takes from the agent's resolution for a container it cannot name itself.
_AGENTS_NAMES = ("name", "pod_uid", "pod", "namespace", "hub_user")
_viewer: HostViewer | None = None
# The last resolution parsed: [its file's key, its content, the beacons made of its entries].
_parsed: list = [None, None, {}]


@dataclass(frozen=True)
class ProvenKernel:
    """A kernel the node agent proved for host PID ``pid`` (started at ``start_ticks``)."""

    pid: int
    start_ticks: int
    beacon: Beacon
    content: Mapping[str, Any]


def public_container(view: HostView | None) -> dict | None:
    """A process entry's ``container`` (:data:`~jax_nbmem.node.resolution.SHOWN_KEYS`) or None."""
    if view is None or view.container is None:
        return None
    return {key: getattr(view.container, key) for key in SHOWN_KEYS}


def in_initial_pid_namespace() -> bool:
    """Whether this process lives in the host's PID namespace (where NVML's PIDs are ours)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino == INIT_PID_NS_INO
    except OSError:
        return False


class HostProof:
    """Per host PID: the host's view and the proven kernel (see the module).

    Views are read once per proof (one refresh) through ``viewer``'s cache.
    ``resolution_reason`` says why no resolution was read (None: read, or not needed).
    """

    def __init__(
        self,
        viewer: HostViewer,
        proven: Mapping[int, ProvenKernel],
        resolution_reason: str | None = None,
        views: Mapping[int, HostView | None] | None = None,
        resolved: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> None:
        self.viewer = viewer
        self.proven = dict(proven)
        self.resolution_reason = resolution_reason
        self._views: dict[int, HostView | None] = dict(views or {})
        # The resolution's entries by host PID (still the same processes), for the names this
        # reader cannot read itself; the PIDs named from them.
        self._resolved = dict(resolved or {})
        self.named_by_agent: set[int] = set()

    @classmethod
    def from_registry(
        cls,
        registrations: Mapping[int, Registration],
        viewer: HostViewer,
        views: Mapping[int, HostView | None] | None = None,
    ) -> HostProof:
        """The agent's own proof: its live registrations (``views``: already read this pass)."""
        proven = {
            pid: ProvenKernel(pid, r.view.start_ticks, r.beacon, r.content)
            for pid, r in registrations.items()
        }
        return cls(viewer, proven, views=views)

    def view(self, pid: int) -> HostView | None:
        """The host's view of ``pid`` (read once per proof).

        With the agent's names where this reader could not read them (:meth:`_agents_names`).
        """
        if pid not in self._views:
            self._views[pid] = self._agents_names(self.viewer.view(pid))
        return self._views[pid]

    def _agents_names(self, seen: HostView | None) -> HostView | None:
        """``seen`` with its container's name and its user's from the agent's resolution.

        Only where this reader could not read them (a user other than root: Podman's store and
        another user's ``/proc/PID/root`` are root's), for the same container of the same
        process. Names only, shown as the agent's: what is proven or acted on is read from the host
        (:mod:`.facts`), never from here.
        """
        entry = self._resolved.get(seen.pid) if seen is not None else None
        if entry is None or seen.container is None:
            return seen
        changes: dict[str, Any] = {}
        theirs = entry.get("container")
        ours = seen.container
        if not ours.name and isinstance(theirs, dict) and theirs.get("id") == ours.id:
            named = {k: theirs[k] for k in _AGENTS_NAMES if isinstance(theirs.get(k), str)}
            if named.get("name"):
                changes["container"] = replace(ours, name_reason=None, **named)
        user = entry.get("user")
        if not seen.user_in_container and entry.get("user_source") == "container":
            if isinstance(user, str) and user:
                changes["user_in_container"] = user
        if not changes:
            return seen
        self.named_by_agent.add(seen.pid)
        return replace(seen, **changes)

    def shown_user(self, pid: int) -> tuple[str | None, str] | None:
        """(user, ``user_source``) of a process in a container (:meth:`HostView.shown_user`).

        None for one on the host, or unreadable: its host account is its name there.
        """
        seen = self.view(pid)
        if seen is None or seen.container is None:
            return None
        return seen.shown_user()

    def is_proven(self, pid: int) -> bool:
        """Whether the agent proved the kernel of host PID ``pid`` (still the same process)."""
        kernel = self.proven.get(pid)
        seen = self.view(pid) if kernel is not None else None
        return seen is not None and seen.start_ticks == kernel.start_ticks

    def namespaced(self, pid: int) -> bool:
        """Whether ``pid`` runs in a PID namespace of its own (a container), as the host sees."""
        seen = self.view(pid)
        return seen is not None and seen.namespaced

    def key(self, pid: int) -> str:
        """The key of its beacon, alive lock and cull notice: ``<pid>`` or ``<ino>-<pid_in_ns>``."""
        seen = self.view(pid)
        if seen is None or not seen.namespaced:
            return str(pid)
        return beacon_key(seen.pid_ns, seen.pid_in_ns)

    def beacons(self, found: Mapping[int, Beacon], pids: Iterable[int]) -> dict[int, Beacon]:
        """``found`` (file beacons by host PID) less namespaced PIDs', plus the proven ones."""
        chosen = {pid: b for pid, b in found.items() if not self.namespaced(pid)}
        for pid in pids:
            if self.is_proven(pid):
                chosen[pid] = self.proven[pid].beacon
        return chosen

    def annotate(self, processes: list[dict]) -> None:
        """Give each process entry ``pid_in_container`` and ``container``; proven: ``agent``.

        A process in a pod gets its pod's hub user (the API's; ``hub_user_source: pod``); a
        different one it claimed stays beside it as ``hub_user_claimed`` (shown, never used to
        act). A process in a container is shown as its container's user (``user_source``:
        ``container``, the container's claim, or ``uid``, the bare uid).
        """
        for process in processes:
            pid = process.get("pid")
            seen = self.view(pid) if isinstance(pid, int) else None
            process["pid_in_container"] = seen.pid_in_container if seen else None
            process["container"] = public_container(seen)
            pod_user = seen.container.hub_user if seen and seen.container else None
            if pod_user:
                # KubeSpawner's annotation, read from the Kubernetes API (no user writes it):
                # in z2jh every container is `notebook`, and this is who the pod serves. It
                # beats whatever the kernel says of itself.
                if process.get("hub_user") not in (None, pod_user):
                    process["hub_user_claimed"] = process["hub_user"]
                process["hub_user"] = pod_user
                process["hub_user_source"] = "pod"
            if seen is not None and seen.container is not None:
                # Never the host's account name for a container's uid (someone else's).
                process["user"], process["user_source"] = seen.shown_user()
            if isinstance(pid, int) and pid in self.named_by_agent:
                process["names_source"] = "agent"  # names this reader could not read itself
            if isinstance(pid, int) and self.is_proven(pid) and process.get("source") == "beacon":
                process["source"] = "agent"
            claimed = self._claimed_hostname(pid, seen)
            if claimed:
                process["container_hostname_claimed"] = claimed

    def _claimed_hostname(self, pid: Any, seen: HostView | None) -> str | None:
        """The host name a proven kernel's beacon gives, for a container no runtime records.

        A plain PID and UTS namespace has no runtime's cgroup to name it, and the agent may not
        enter another UTS namespace to read its host name (that takes ``setns``, which its unit
        forbids): the kernel's own word is all there is, shown as the container's claim and never
        used to decide. None where a runtime names the container, or the name is the host's own
        (a PID namespace that shares the host's UTS namespace).
        """
        if seen is None or not seen.namespaced or seen.container is not None:
            return None
        if not self.is_proven(pid):
            return None
        hostname = (self.proven[pid].beacon.identity or {}).get("hostname")
        if not isinstance(hostname, str) or not hostname or hostname == socket.gethostname():
            return None
        return hostname


def _agent_uids() -> set[int]:
    uids = {0}
    named = os.environ.get(ENV_AGENT_USER, "").strip()
    if named.isdigit():
        uids.add(int(named))
    elif named:
        try:
            uids.add(pwd.getpwnam(named).pw_uid)
        except KeyError:
            pass
    if os.geteuid() != 0:
        uids.discard(os.geteuid())  # never trust a directory one could have made oneself
    return uids


def read_resolution(share_dir: str, now: float | None = None) -> tuple[dict | None, str | None]:
    """The agent's resolution in ``share_dir`` if trusted and fresh, else (None, why)."""
    directory = os.path.join(share_dir, AGENT_DIR)
    uids = _agent_uids()
    try:
        info = os.lstat(directory)
    except OSError:
        return None, f"no node agent ({directory} is missing)"
    if not stat.S_ISDIR(info.st_mode) or info.st_mode & 0o022 or info.st_uid not in uids:
        return None, f"{directory} is not the node agent's (owner, mode or a symlink): ignored"
    path = os.path.join(directory, RESOLUTION_NAME)
    try:  # every name where this reader may read them (root, the agent's user)
        fd = os.open(os.path.join(directory, FULL_RESOLUTION_NAME),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # fmt: skip
        path = os.path.join(directory, FULL_RESOLUTION_NAME)
    except OSError:
        fd = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK) if fd is None else fd
    except OSError as error:
        if error.errno == errno.ELOOP:
            return None, f"{path} is a symlink: ignored"
        return None, f"no resolution in {directory}"
    try:
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode) or held.st_uid != info.st_uid or held.st_mode & 0o022:
            return None, f"{path} is not the node agent's: ignored"
        if held.st_size > _MAX_RESOLUTION_BYTES:
            return None, f"{path} is over {_MAX_RESOLUTION_BYTES >> 20} MiB: ignored"
        key = (path, held.st_dev, held.st_ino, held.st_size, held.st_mtime_ns, held.st_uid)
        if _parsed[0] == key:
            content = _parsed[1]  # rewritten means renamed over: the same inode is the same file
        else:
            with os.fdopen(os.dup(fd), "rb") as file:
                content = json.loads(file.read(_MAX_RESOLUTION_BYTES + 1))
            _parsed[:] = [key, content, {}]
    except (OSError, ValueError, RecursionError):
        return None, f"{path} is unreadable or malformed"
    finally:
        os.close(fd)
    if not isinstance(content, dict) or content.get("schema") != RESOLUTION_SCHEMA:
        return None, f"{path} is not a schema-{RESOLUTION_SCHEMA} resolution"
    written, interval = content.get("written_at"), content.get("interval_s")
    if not isinstance(written, int | float) or not isinstance(interval, int | float):
        return None, f"{path} says neither when it was written nor its interval"
    age = (time.time() if now is None else now) - written
    if age > max(3 * interval, 10):
        return None, f"the node agent's resolution is stale ({age:.0f} s old)"
    return content, None


def _proven_from(content: Mapping[str, Any], viewer: HostViewer) -> dict[int, ProvenKernel]:
    proven = {}
    entries = content.get("processes")
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("kernel"), dict):
            continue
        pid, ticks = entry.get("pid"), entry.get("start_ticks")
        if not isinstance(pid, int) or not isinstance(ticks, int):
            continue
        if viewer.start_ticks(pid) != ticks:
            continue  # that process ended since: its PID names another now
        made = _parsed[2] if _parsed[1] is content else {}
        beacon = made.get(pid)
        if beacon is None:
            beacon = made[pid] = beacon_from_content(entry["kernel"], pid)
        if beacon is not None:
            proven[pid] = ProvenKernel(pid, ticks, beacon, entry["kernel"])
    return proven


def host_proof(share_dir: str | None, viewer: HostViewer | None = None) -> HostProof | None:
    """The host's proof for a status on the host, or None where NVML's PIDs are not ours.

    The resolution comes from ``share_dir`` (else ``$JAX_NBMEM_SHARE_DIR``) when trusted and
    fresh; without one the host's own view still names containers.
    """
    global _viewer
    if not in_initial_pid_namespace():
        return None
    if viewer is None:
        _viewer = _viewer or HostViewer()
        viewer = _viewer
    share_dir = find_share_dir(share_dir, default=None).path
    if share_dir is None:
        return HostProof(viewer, {}, "no share directory: no node agent")
    content, reason = read_resolution(share_dir)
    if not content:
        return HostProof(viewer, {}, reason)
    return HostProof(viewer, _proven_from(content, viewer), reason,
                     resolved=_same_processes(content, viewer))  # fmt: skip


def _same_processes(content: Mapping[str, Any], viewer: HostViewer) -> dict[int, Mapping]:
    """The resolution's entries by host PID, of processes still running (same start)."""
    found = {}
    entries = content.get("processes")
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("container"), dict):
            pid, ticks = entry.get("pid"), entry.get("start_ticks")
            if isinstance(pid, int) and isinstance(ticks, int) and viewer.start_ticks(pid) == ticks:
                found[pid] = entry
    return found
