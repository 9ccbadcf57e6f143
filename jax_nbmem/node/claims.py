"""Claims: what kernels deciding their mode at the same moment will take, until NVML shows it.

Two kernels started together with ``%jaxalloc auto`` would each see the GPU free and both
take 75% of it. So a kernel that has chosen a pool writes a *claim* (``jax_nbmem-claim-KEY.json``
in the beacon directories: its GPUs' UUIDs and the bytes it will take, for at most
``CLAIM_TTL_S`` seconds), and decides while holding an advisory lock
(``jax_nbmem-claims.lock``, ``flock``) that every kernel takes around "read the claims, read
NVML, choose, write my claim". The next kernel then subtracts what others claimed.

``KEY`` is the beacon's (:func:`~jax_nbmem.node.identity.beacon_key`: ``<pid>`` on the host,
``<ns inode>-<pid in ns>`` in a container, so that containers whose kernels share a PID never
share a claim), or a launch's kernel id (a provisioner deciding before its kernel runs). The
writer holds an exclusive ``flock`` on its claim file while the claim lasts (as a kernel holds
its alive lock, :mod:`.alive`); its end, even by SIGKILL, lets go of it.

A claim counts until it expires, and not once NVML lists its process holding about that much
(then the bytes are in NVML's free memory already), and only while its process runs:

* written in this reader's PID namespace: its PID runs with the start time it states, and
  its file belongs to that process's owner (no user claims for another's process);
* written in another (another container, or the host seen from one): its PID means nothing
  here, and a local process of that number is never taken for it. It counts while its
  writer holds the file's lock, for at most ``CLAIM_TTL_S`` from now, and when its name
  agrees with the namespace and PID it states. It stays a claim: it can only make ``auto``
  take less, names nobody, and is matched to NVML's PIDs only through the node agent's proof.

A FIFO, a symlink or malformed content of any shape in a claim's name is no claim. Never
raises: without a directory or a lock, a kernel decides from NVML alone, and says nothing more
than it knows.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil

from jax_nbmem.node.alive import held_elsewhere
from jax_nbmem.node.identity import INIT_PID_NS_INO, beacon_key, own_identity, same_namespace
from jax_nbmem.node.neighbours import read_beacon_by_key
from jax_nbmem.node.resolution import Resolution, load_resolution
from jax_nbmem.rootfiles import lock_file

__all__ = ["CLAIM_TTL_S", "Claim", "ClaimBook", "claim_book"]

log = logging.getLogger("jax_nbmem")

CLAIM_TTL_S = 30.0
_LOCK_NAME = "jax_nbmem-claims.lock"
_PREFIX = "jax_nbmem-claim-"
_SUFFIX = ".json"
_LOCK_WAIT_S = 5.0
_MAX_BYTES = 16 * 1024  # a claim names a few GPUs
_NAMESPACED = re.compile(r"([0-9]{1,20})-([0-9]{1,10})")
_SAME = -1  # Claim.nvml_pid's default: NVML lists it by its own PID


@dataclass(frozen=True)
class Claim:
    """What process ``pid`` (started at ``started_at``) will take on each GPU, by UUID.

    ``key`` names the claim: the kernel's beacon key, or, for a kernel not started yet (a
    provisioner deciding at launch), its kernel id, with the launcher's PID standing for it.
    ``nvml_pid`` is the PID NVML lists it by (its host PID; by default ``pid``), None when
    unknown (written in a container and not resolved by the node agent); ``landed`` the GPUs
    where its kernel's beacon says its pool is in place already (so NVML shows it).
    """

    pid: int
    started_at: float
    bytes_by_gpu: Mapping[str, int]
    expires_at: float
    key: str = ""
    nvml_pid: int | None = _SAME
    landed: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.nvml_pid == _SAME:
            object.__setattr__(self, "nvml_pid", self.pid)

    def alive(self, now: float) -> bool:
        """Not expired, and its process (in this PID namespace) still the one that wrote it."""
        if now >= self.expires_at:
            return False
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started_at) < 1.0
        except psutil.Error:
            return False

    def in_nvml(self, uuid: str, held: Mapping[int, int]) -> bool:
        """Whether NVML's view of GPU ``uuid`` (``held``: bytes by host PID) has it already."""
        if uuid in self.landed:
            return True
        wanted = self.bytes_by_gpu.get(uuid, 0)
        return self.nvml_pid is not None and held.get(self.nvml_pid, 0) >= 0.5 * wanted


class ClaimBook:
    """The claims of one directory, read and written under its lock (see :func:`claim_book`)."""

    def __init__(self, directory: str, identity: Mapping[str, Any] | None = None) -> None:
        self.directory = directory
        self.identity = own_identity() if identity is None else identity

    def others(self, own_pid: int | None = None, own_key: str | None = None) -> list[Claim]:
        """Every live claim but this process's (by PID) or this launch's (by key)."""
        own_key = own_key if own_key is not None else self._key(own_pid)
        now = time.time()
        found, foreign = [], []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        for name in names:
            if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
                continue
            read = _read(os.path.join(self.directory, name), name[len(_PREFIX) : -len(_SUFFIX)])
            if read is None or read.claim.key == own_key:
                continue
            if self._local(read.claim.key, read.ns):
                if read.claim.alive(now) and _owner_ran(read):
                    # In a container, even a neighbour's PID here is not the one NVML lists.
                    (found if self._on_host() else foreign).append(read)
            elif read.locked and now < read.claim.expires_at <= now + CLAIM_TTL_S:
                foreign.append(read)
        return [read.claim for read in found] + self._placed(foreign)

    def claim(
        self,
        pid: int,
        bytes_by_gpu: Mapping[str, int],
        ttl_s: float = CLAIM_TTL_S,
        key: str | None = None,
    ) -> None:
        """Write this claim (replacing an earlier one of its key); nothing when it claims 0.

        This process holds the claim file's lock until the claim is released, replaced, or
        has expired (let go at the next claim it writes).
        """
        key = _safe_key(key if key is not None else self._key(pid))
        if not any(bytes_by_gpu.values()):
            self.release(key=key)
            return
        expires_at = time.time() + ttl_s
        content = {
            "key": key,
            "pid": pid,
            "started_at": psutil.Process(pid).create_time(),
            "bytes_by_gpu": {uuid: int(n) for uuid, n in bytes_by_gpu.items()},
            "expires_at": expires_at,
            "pid_ns": self.identity.get("pid_ns"),  # where `pid` means something
        }
        _HELD.write(os.path.join(self.directory, f"{_PREFIX}{key}{_SUFFIX}"), content, expires_at)

    def release(self, pid: int | None = None, key: str | None = None) -> None:
        """Remove a claim (by its key, or the PID whose key it is), if any."""
        key = _safe_key(key if key is not None else self._key(pid))
        _HELD.remove(os.path.join(self.directory, f"{_PREFIX}{key}{_SUFFIX}"))

    def _key(self, pid: int | None) -> str:
        """The beacon key of ``pid`` in this process's namespace."""
        return beacon_key({**self.identity, "pid_in_ns": pid})

    def _on_host(self) -> bool:
        """Whether this reader's PIDs are the host's (NVML's), or nothing says otherwise."""
        mine = self.identity.get("pid_ns")
        return mine is None or mine[1] == INIT_PID_NS_INO

    def _local(self, key: str, ns: list[int] | None) -> bool:
        """Whether a claim's PID can be checked here (written in this PID namespace)."""
        mine = self.identity.get("pid_ns")
        if same_namespace(ns, mine):
            return True
        # A claim that does not say its namespace (an earlier version, or no /proc): a plain
        # PID only, and only where plain PIDs are this reader's (the host, or no /proc here).
        return ns is None and _NAMESPACED.fullmatch(key) is None and self._on_host()

    def _placed(self, foreign: list[_Read]) -> list[Claim]:
        """Other namespaces' claims, with what says where NVML shows them (see `Claim`)."""
        if not foreign:
            return []
        resolution = load_resolution(self.directory)
        return [_placed(read, resolution, self.directory) for read in foreign]


def _safe_key(key: str) -> str:
    """A key usable in a file name: letters, digits, '-' and '_' only."""
    cleaned = "".join(c for c in key if c.isalnum() or c in "-_")
    if not cleaned:
        raise ValueError(f"a claim needs a key, not {key!r}")
    return cleaned


@dataclass(frozen=True)
class _Read:
    claim: Claim
    ns: list[int] | None  # the PID namespace it says it was written in
    uid: int  # its file's owner
    locked: bool  # whether a process holds its file's lock


def _read(path: str, name_key: str) -> _Read | None:
    """The claim at ``path``, or None when it is none.

    Anyone can write into a shared directory: a FIFO of a claim's name must not hang the
    decision (nor a 5,000-deep array crash it), nor a name say one kernel and the content
    another.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_BYTES:
            return None
        content = json.loads(os.read(fd, _MAX_BYTES + 1))
        ns = content.get("pid_ns")
        if ns is not None and not same_namespace(ns, ns):  # not two integers
            return None
        claim = Claim(
            pid=int(content["pid"]),
            started_at=float(content["started_at"]),
            bytes_by_gpu={str(k): int(v) for k, v in dict(content["bytes_by_gpu"]).items()},
            expires_at=float(content["expires_at"]),
            key=str(content.get("key") or content["pid"]),
        )
        if claim.key != name_key or not _name_agrees(claim, ns):
            return None
        running = held_elsewhere(fd) is True  # its writer holds the lock while the claim stands
        return _Read(claim, list(ns) if ns is not None else None, info.st_uid, running)
    except Exception:  # half-written, malformed whatever its shape
        return None
    finally:
        os.close(fd)


def _name_agrees(claim: Claim, ns: Any) -> bool:
    """A beacon-keyed claim states the namespace and PID its name says (a kernel id: any)."""
    if claim.key.isdigit():
        return int(claim.key) == claim.pid and (ns is None or ns[1] == INIT_PID_NS_INO)
    named = _NAMESPACED.fullmatch(claim.key)
    if named is None:
        return True
    return ns is not None and ns[1] == int(named.group(1)) and claim.pid == int(named.group(2))


def _owner_ran(read: _Read) -> bool:
    """Whether its (local) process belongs to its file's owner: nobody claims for another's."""
    try:
        return psutil.Process(read.claim.pid).uids().real == read.uid
    except psutil.Error:
        return False


def _placed(read: _Read, resolution: Resolution, directory: str) -> Claim:
    """``read``'s claim with the host PID the agent proved for it, and where it has landed.

    The agent's entry of the same namespace and PID there (its proof); else none, and the GPUs
    where its kernel's beacon (same key, a claim as much as this one) says its pool is.
    """
    claim, host_pid = read.claim, None
    for entry in resolution.processes.values() if resolution.fresh else ():
        if same_namespace(entry.pid_ns, read.ns) and entry.pid_in_container == claim.pid:
            host_pid = entry.pid
    landed: set[str] = set()
    if host_pid is None and not claim.key.isdigit():
        beacon = read_beacon_by_key([directory], claim.key)
        if beacon is not None and beacon.pid == claim.pid:
            pools = {uuid: (gpu or {}).get("pool_bytes") for uuid, gpu in beacon.gpus.items()}
            landed = {uuid for uuid in claim.bytes_by_gpu if pools.get(uuid)}
    if read.ns is not None and read.ns[1] == INIT_PID_NS_INO:
        host_pid = claim.pid  # written on the host: NVML's PIDs are its own
    return Claim(claim.pid, claim.started_at, claim.bytes_by_gpu, claim.expires_at, claim.key,
                 nvml_pid=host_pid, landed=frozenset(landed))  # fmt: skip


class _Holder:
    """The claim files this process wrote and holds the lock of, until released or expired."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, float]] = {}  # path -> (fd, expires_at)

    def write(self, path: str, content: dict, expires_at: float) -> None:
        """Write ``content`` at ``path`` atomically, its lock taken before it is seen there."""
        data = json.dumps(content).encode()
        fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".jax_nbmem-claim.")
        try:
            os.fchmod(fd, 0o644)  # every user's kernels read it
            os.write(fd, data)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else has it
            os.replace(partial, path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise
        with self._lock:
            earlier = self._held.pop(path, None)
            self._held[path] = (fd, expires_at)
            expired = [p for p, (_, until) in self._held.items() if until <= time.time()]
        if earlier is not None:
            os.close(earlier[0])
        for old in expired:
            self.remove(old)

    def remove(self, path: str) -> None:
        """Remove the claim at ``path`` (ours or not: a release by key) and let go of it."""
        with self._lock:
            held = self._held.pop(path, None)
        if held is not None:
            try:
                named = os.stat(path, follow_symlinks=False)
                ours = os.fstat(held[0])
                mine = (named.st_dev, named.st_ino) == (ours.st_dev, ours.st_ino)
            except OSError:
                mine = False
            if mine:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            os.close(held[0])
            return
        with contextlib.suppress(OSError):
            os.unlink(path)


_HELD = _Holder()


@contextlib.contextmanager
def claim_book(directory: str | None, wait_s: float = _LOCK_WAIT_S) -> Iterator[ClaimBook | None]:
    """Hold the directory's claims lock for a decision; yields None when it cannot.

    The lock file may belong to another user (a shared directory): it is opened read-only,
    which is enough for ``flock``. Waiting is bounded: a lock not had in *wait_s* seconds
    (a stuck neighbour) yields None, and the caller decides without claims.
    """
    if not directory:
        yield None
        return
    path = os.path.join(directory, _LOCK_NAME)
    fd = None
    try:
        fd = lock_file(path)  # never through a link, never a FIFO: UnsafeFile, said below
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} stayed locked for {wait_s:g} s") from None
                time.sleep(0.02)
    except (OSError, TimeoutError):
        log.debug("jax_nbmem: deciding without claims", exc_info=True)
        if fd is not None:
            os.close(fd)
        yield None
        return
    try:
        yield ClaimBook(directory)
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
