"""What the node agent publishes, and what it clears away.

:func:`build_resolution` lists every PID NVML lists plus every proven kernel, each with the
host's view (in-container PID, PID namespace, start ticks, container) and the kernel's proven
beacon; :func:`write_resolution` writes it to ``S/agent/resolution.json`` atomically (a
temporary file renamed over it), mode 0644, at every refresh. The format is the contract's
(schema 1); a reader treats it as stale once ``now - written_at > max(3 * interval_s, 10)``.

Pod names are a user's to see only where :class:`PodVisibility` says (the command's
``--pod-names-visible``; by default a kernel sees those of its own Kubernetes namespace): a
pod of a namespace the reader may not see has its ``container`` object's names null, with a
``name_reason`` that says so. :meth:`ResolutionWriter.for_namespace` gives the text a pod's
kernel of that namespace reads (over the agent's TCP connection); the file is written for a
reader of no namespace (anyone who reads the share directory).

:func:`clean_dead` removes the beacons and alive locks that dead kernels left in the share
directory (a kernel's fallback beacon with its own: :mod:`~jax_nbmem.node.beacon_files`):
only names of our own patterns, only regular files (never through a symlink), and only when
the kernel is dead for sure: its alive lock (at its own name or a fallback's:
:mod:`~jax_nbmem.node.alive`), a file of the beacon's owner, is granted to us (its holder
is gone), or, for a kernel keyed by host PID without a lock, that PID is gone and the file is
old. And the claims of ``%jaxalloc auto`` (:mod:`.claims`) whose writer let go of them (its
lock granted to us) once they are well past their time.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jax_nbmem.agent.hostview import HostView, boot_id
from jax_nbmem.agent.server import Registration
from jax_nbmem.agent.visibility import (
    EVERY_NAME,
    HIDDEN_REASON,
    UNKNOWN_NAMESPACE,
    UNKNOWN_REASON,
    PodVisibility,
    hidden_container,
    hidden_kernel,
)
from jax_nbmem.node.alive import FALLBACK_LOCK
from jax_nbmem.node.beacon_files import FALLBACK
from jax_nbmem.node.beacons import write_atomically

__all__ = [
    "FULL_RESOLUTION_NAME",
    "HIDDEN_REASON",
    "MAX_KERNELS_CHARS",
    "PodVisibility",
    "RESOLUTION_NAME",
    "ResolutionWriter",
    "RESOLUTION_SCHEMA",
    "build_resolution",
    "clean_dead",
    "container_entry",
    "write_resolution",
]

RESOLUTION_NAME = "resolution.json"
FULL_RESOLUTION_NAME = "resolution-full.json"  # every name: root's and the agent's user's only
RESOLUTION_SCHEMA = 1
_KEY = r"([1-9][0-9]{0,9}|[1-9][0-9]{0,19}-[1-9][0-9]{0,9})"
_LOCK = re.compile(rf"jax_nbmem-alive-{_KEY}\.lock")
_BEACON = re.compile(rf"jax_nbmem-beacon-{_KEY}\.json")
_CLAIM = re.compile(r"jax_nbmem-claim-[A-Za-z0-9_-]{1,80}\.json")  # beacon keys, kernel ids
# A claim lasts at most 30 s (claims.CLAIM_TTL_S); one whose lock is free is cleared this late.
_CLAIM_GRACE_S = 120.0
_MAX_NAMES = 100_000
# The resolution's entries, all together (characters of JSON, ASCII: bytes): past it, an
# entry's kernel beacon is left out with a reason. Each beacon is at most 8 KiB
# (registry.MAX_KERNEL_BYTES), so this binds only when the agent serves more than ~1,000
# connections; it keeps the file far below the readers' 32 MiB whatever the limits.
MAX_KERNELS_CHARS = 12 << 20
# A kernel keyed by host PID with no lock is cleared only when its file is this old: one
# starting now may not have taken its lock yet.
_NO_LOCK_GRACE_S = 60.0


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("jax_nbmem")
    except Exception:
        return ""


def container_entry(view: HostView | None) -> dict | None:
    """The resolution's ``container`` object for a host view (None: no container)."""
    if view is None or view.container is None:
        return None
    c = view.container
    return {"id": c.id, "runtime": c.runtime, "name": c.name, "pod_uid": c.pod_uid, "pod": c.pod,
            "namespace": c.namespace, "name_reason": c.name_reason,
            "hub_user": c.hub_user, "rootless_uid": c.rootless_uid}  # fmt: skip


class ResolutionWriter:
    """Writes the resolution's text; each process's entry is encoded once and reused.

    An entry depends on the host's view of its PID (cached by PID and start), the GPUs NVML
    lists it on and its registration (a new one each time its kernel says something new): as
    long as these are the same objects, its JSON text is the same, so a steady refresh joins
    texts instead of encoding 1,600 beacons again (see benchmarks/agent_resolve.py).
    """

    def __init__(self, visibility: PodVisibility | None = None) -> None:
        self.visibility = PodVisibility() if visibility is None else visibility
        # pid -> (view, registration, gpus, (head, container, hidden container, tail))
        self._entries: dict[int, tuple[Any, Any, tuple, tuple]] = {}
        self._agent = ""
        self._frame: tuple[str, str] = ("", "")
        self.written_at: float | None = None  # the last pass's
        self._pieces: list[tuple] = []
        self._texts: dict[str | None, str] = {}
        self._lock = threading.Lock()
        self.extra_agent: dict = {}  # more of the agent's facts (its Kubernetes API's health)

    def text(
        self,
        report: Mapping[str, Any],
        registrations: Mapping[int, Registration],
        view: Callable[[int], HostView | None],
        *,
        interval_s: float,
        now: float | None = None,
    ) -> str:
        """The resolution (contract) from a status report and the proven kernels, as JSON.

        ``view(pid)`` gives the host's view of a PID (a :class:`~.hostview.HostViewer`'s).
        """
        uuids = {gpu.get("index"): gpu.get("uuid") for gpu in report.get("gpus", [])}
        on_gpus: dict[int, list[str]] = {}
        for process in report.get("processes", []):
            listed = on_gpus.setdefault(process.get("pid"), [])
            uuid = uuids.get(process.get("gpu"))
            if uuid and uuid not in listed:
                listed.append(uuid)
        pids = [pid for pid in on_gpus if isinstance(pid, int)]
        pids += [pid for pid in registrations if pid not in on_gpus]
        pieces, kept, size = [], {}, 0
        for pid in pids:
            seen = view(pid)
            registration = registrations.get(pid)
            if registration is not None and (
                seen is None or seen.start_ticks != registration.view.start_ticks
            ):
                registration = None  # it ended (or the PID is another process's now)
            gpus = tuple(on_gpus.get(pid, ()))
            cached = self._entries.get(pid)
            if cached and cached[0] is seen and cached[1] is registration and cached[2] == gpus:
                piece = cached[3]
            else:
                piece = _pieces(pid, seen, gpus, registration)
            kept[pid] = (seen, registration, gpus, piece)
            size += len(piece[0]) + max(len(piece[1]), len(piece[2]))
            size += max(len(piece[3]), len(piece[4]))
            if size > MAX_KERNELS_CHARS and registration is not None:  # over the total: no beacon
                piece = _pieces(pid, seen, gpus, None, "the resolution is full")
            pieces.append(piece)
        self._entries = kept  # only this pass's: bounded by what NVML and the registry hold
        if not self._agent:
            self._agent = _dumps({"pid": os.getpid(), "hostname": socket.gethostname(),
                                  "boot_id": boot_id(), "version": _version()})[:-1]  # fmt: skip
        agent = self._agent + "".join(f",{_dumps(k)}:{_dumps(v)}" for k, v in
                                      self.extra_agent.items()) + "}"  # fmt: skip
        written_at = time.time() if now is None else now
        head = (
            f'{{"schema":{RESOLUTION_SCHEMA},"agent":{agent},'
            f'"written_at":{_dumps(written_at)},"interval_s":{_dumps(interval_s)},"processes":['
        )
        with self._lock:
            self._frame, self._pieces, self._texts = (head, "]}"), pieces, {}
            self.written_at = written_at
        return self.for_namespace(None)

    def full_text(self) -> str | None:
        """The last pass's text with every name (root's file; None before the first pass)."""
        return self.for_namespace(EVERY_NAME)

    def for_namespace(self, reader: str | None) -> str | None:
        """The last pass's text as a reader of Kubernetes namespace ``reader`` may see it.

        None before the first pass. Made once per pass and reader namespace.
        """
        found = self.latest_for(reader)
        return None if found is None else found[1]

    def latest_for(self, reader: str | None) -> tuple[float, str] | None:
        """(when the last pass was written, :meth:`for_namespace`'s text), taken together."""
        with self._lock:
            if not self._frame[0]:
                return None
            found = self._texts.get(reader)
            if found is None:
                visible = self.visibility.visible
                entries = [
                    head + shown + tail
                    if namespace is None or visible(reader, namespace)
                    else head + hidden + hidden_tail
                    for head, shown, hidden, tail, hidden_tail, namespace in self._pieces
                ]
                found = self._texts[reader] = f"{self._frame[0]}{','.join(entries)}{self._frame[1]}"
            return self.written_at, found


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _pieces(
    pid: int,
    seen: HostView | None,
    gpus: tuple,
    registration: Registration | None,
    left_out: str | None = None,
):
    """An entry's JSON in pieces: (head, container, tail, both hidden, its namespace).

    The hidden pieces (:mod:`.visibility`) are made only for an entry in a namespace.
    ``left_out``: why its kernel's beacon is not published (``kernel_reason``).
    """
    head = _dumps({
        "pid": pid,
        "pid_in_container": seen.pid_in_container if seen else None,
        "pid_ns": list(seen.pid_ns) if seen and seen.pid_ns else None,
        "start_ticks": seen.start_ticks if seen else None,
        "gpus": list(gpus),
    })[:-1]  # fmt: skip
    user = ""
    if seen is not None and seen.container is not None:
        # Its container's own name for its uid (read here, as root, through its root), so a
        # reader who cannot read that never falls back on the host's name for the number. A
        # name, hidden where the container's names are (as the kernel's own `user` is).
        shown, source = seen.shown_user()
        user = f',"user":{_dumps(shown)},"user_source":{_dumps(source)}'
    container = container_entry(seen)
    namespace = container.get("namespace") if container else None
    reason = HIDDEN_REASON
    if namespace is None and container and container.get("pod_uid"):
        namespace, reason = UNKNOWN_NAMESPACE, UNKNOWN_REASON  # a pod's, not known: fail closed
    content = registration.content if registration else None
    said = f',"kernel_reason":{_dumps(left_out)}' if left_out else ""
    tail = f'{user},"kernel":{_dumps(content)}{said},"source":"agent"}}'
    hidden = hidden_tail = ""
    if namespace is not None:
        hidden = _dumps(hidden_container(container, reason))
        hidden_tail = f',"kernel":{_dumps(hidden_kernel(content, reason))}{said},"source":"agent"}}'
    return f'{head},"container":', _dumps(container), hidden, tail, hidden_tail, namespace


def build_resolution(
    report: Mapping[str, Any],
    registrations: Mapping[int, Registration],
    view: Callable[[int], HostView | None],
    *,
    interval_s: float,
    now: float | None = None,
) -> dict:
    """The resolution as a dict (see :meth:`ResolutionWriter.text`)."""
    text = ResolutionWriter().text(report, registrations, view, interval_s=interval_s, now=now)
    return json.loads(text)


def write_resolution(
    directory: str, content: Mapping[str, Any] | str, full: Mapping[str, Any] | str | None = None
) -> str:
    """Write ``content`` (or its JSON text) to ``directory/resolution.json``; its path.

    Atomically (a temporary file renamed over it), mode 0644: what a reader of no namespace
    may see. ``full``, the same with every name, goes to ``resolution-full.json``, mode 0600
    (its owner's, the agent's user, and root's to read); without it that file is removed, so
    none is left behind that says less than the world-readable one.
    """
    # Text from dumps with the C encoder's compact separators, as the entries are encoded.
    text = content if isinstance(content, str) else _dumps(content)
    full_path = os.path.join(directory, FULL_RESOLUTION_NAME)
    if full is None:
        try:
            os.unlink(full_path)
        except FileNotFoundError:
            pass
    else:
        write_atomically(full_path, full if isinstance(full, str) else _dumps(full), mode=0o600)
    return write_atomically(os.path.join(directory, RESOLUTION_NAME), text)


def clean_dead(
    share_dir: str,
    live_keys: Iterable[str] = (),
    *,
    pid_alive: Callable[[int], bool] | None = None,
    now: float | None = None,
) -> list[str]:
    """Remove what dead kernels left in ``share_dir`` (see the module); the paths removed.

    ``live_keys`` are the keys of proven kernels (never touched). ``pid_alive(pid)`` tells
    whether a host PID runs (default: ``/proc/PID`` exists). Never raises.
    """
    pid_alive = pid_alive or (lambda pid: os.path.exists(f"/proc/{pid}"))
    now = time.time() if now is None else now
    keep = set(live_keys)
    try:
        names = os.listdir(share_dir)[:_MAX_NAMES]
    except OSError:
        return []
    locks: dict[str, list[str]] = {}
    beacons: dict[str, list[str]] = {}
    claims = []
    for name in names:
        if _CLAIM.fullmatch(name):
            claims.append(name)
        elif match := _LOCK.fullmatch(name) or FALLBACK_LOCK.fullmatch(name):
            locks.setdefault(match.group(1), []).append(name)  # its own, and any fallback
        elif match := _BEACON.fullmatch(name) or FALLBACK.fullmatch(name):
            beacons.setdefault(match.group(1), []).append(name)  # its own, and any fallback
    removed = []
    locked: dict[str, set[int]] = {}  # key -> the UIDs with a lock of it
    for key, lock_names in locks.items():
        if key not in keep:
            locked[key] = _clear_dead_key(share_dir, lock_names, beacons.get(key, []), removed)
    for key, names in beacons.items():
        if key in keep or "-" in key:
            continue  # a namespaced kernel without a lock: nothing on the host says it died
        for name in names:
            path = os.path.join(share_dir, name)
            info = _regular(path)
            if (
                info is not None
                and info.st_uid not in locked.get(key, ())  # its owner's lock said, above
                and not pid_alive(int(key))
                and now - info.st_mtime > _NO_LOCK_GRACE_S
            ):
                _unlink(path, removed)
    for name in claims:
        _lock_granted_then_remove(share_dir, name, removed, older_than=now - _CLAIM_GRACE_S)
    return removed


def _clear_dead_key(directory: str, locks: list[str], beacons: list[str], removed: list[str]):
    """Remove a key's free locks and what of its beacons they free; the UIDs with a lock of it.

    Only a lock of the beacon's owner speaks for it (another user's at its name is a
    squatter's, issue 45): a beacon goes when a lock of its owner was granted to us and none of
    its owner's is held. The free locks are held exclusively until then: a kernel starting
    with this key meanwhile cannot take them.
    """
    held: set[int] = set()
    free: dict[str, tuple[int, os.stat_result]] = {}
    try:
        for name in locks:
            found = _free_lock(os.path.join(directory, name))
            if found is not None and found[0] is None:
                held.add(found[1].st_uid)
            elif found is not None:
                free[name] = (found[0], found[1])
        freed = {info.st_uid for _, info in free.values()} - held
        for beacon in beacons:
            info = _regular(os.path.join(directory, beacon))
            if info is not None and info.st_uid in freed:
                _unlink(os.path.join(directory, beacon), removed)
        for name in free:
            _unlink(os.path.join(directory, name), removed)
    finally:
        for fd, _ in free.values():
            os.close(fd)
    return held | {info.st_uid for _, info in free.values()}


def _regular(path: str) -> os.stat_result | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info if stat.S_ISREG(info.st_mode) else None


def _unlink(path: str, removed: list[str]) -> None:
    try:
        os.unlink(path)  # unlink removes the name itself: it never follows a link
        removed.append(path)
    except OSError:
        pass


def _free_lock(path: str, older_than: float | None = None):
    """Whether the lock file at ``path`` is free: taken exclusively, or refused, or no lock.

    (descriptor, fstat) when granted to us (held until the caller closes it); (None, fstat)
    when refused (its holder lives); None when it is no lock to judge (a link, no regular file,
    gone, replaced meanwhile, or changed since ``older_than``).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # a symlink (ELOOP), gone, unreadable
        return None
    try:
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode):
            return None
        if older_than is not None and held.st_mtime >= older_than:
            return None
        try:
            # Exclusive: while we hold it, a kernel starting with this key cannot take it.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None, held  # refused: its kernel is alive
        named = _regular(path)
        if named is None or (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            return None  # replaced meanwhile: a new kernel's
        fd, kept = -1, fd
        return kept, held
    finally:
        if fd >= 0:
            os.close(fd)


def _lock_granted_then_remove(
    directory: str, name: str, removed: list[str], older_than: float | None = None
) -> bool:
    """If the lock at ``name`` has no holder, remove it; whether it did.

    ``older_than``: only a file last changed before then.
    """
    path = os.path.join(directory, name)
    found = _free_lock(path, older_than)
    if found is None or found[0] is None:
        return False
    try:
        _unlink(path, removed)
    finally:
        os.close(found[0])
    return True
