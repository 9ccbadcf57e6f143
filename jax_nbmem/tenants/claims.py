"""Claims: what kernels deciding their mode at the same moment will take, until NVML shows it.

Two kernels started together with ``%jaxalloc auto`` would each see the GPU free and both
take 75% of it. So a kernel that has chosen a pool writes a *claim* (``jax_nbmem-claim-PID.json``
in the beacon directories: its GPUs' UUIDs and the bytes it will take, for at most
``CLAIM_TTL_S`` seconds), and decides while holding an advisory lock
(``jax_nbmem-claims.lock``, ``flock``) that every kernel takes around "read the claims, read
NVML, choose, write my claim". The next kernel then subtracts what others claimed.

A claim counts only while its process runs (its PID and start time match), when its file
belongs to that process's owner (no user claims for another's process), and until it
expires, and not once NVML lists that process holding about that much: then the bytes are in
NVML's free memory already. A FIFO, a symlink or malformed content of any shape in a claim's
name is no claim. Never raises: without a directory or a lock, a kernel decides
from NVML alone, and says nothing more than it knows.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import psutil

from jax_nbmem.tenants.beacons import read_small_file

__all__ = ["CLAIM_TTL_S", "Claim", "ClaimBook", "claim_book"]

log = logging.getLogger("jax_nbmem")

CLAIM_TTL_S = 30.0
_LOCK_NAME = "jax_nbmem-claims.lock"
_PREFIX = "jax_nbmem-claim-"
_LOCK_WAIT_S = 5.0
_MAX_BYTES = 16 * 1024  # a claim names a few GPUs


@dataclass(frozen=True)
class Claim:
    """What process ``pid`` (started at ``started_at``) will take on each GPU, by UUID.

    ``key`` names the claim: the kernel's PID, or, for a kernel not started yet (a
    provisioner deciding at launch), its kernel id, with the launcher's PID standing for it.
    """

    pid: int
    started_at: float
    bytes_by_gpu: Mapping[str, int]
    expires_at: float
    key: str = ""

    def alive(self, now: float) -> bool:
        """Not expired, and its process still the one that wrote it."""
        if now >= self.expires_at:
            return False
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started_at) < 1.0
        except psutil.Error:
            return False


class ClaimBook:
    """The claims of one directory, read and written under its lock (see :func:`claim_book`)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def others(self, own_pid: int | None = None, own_key: str | None = None) -> list[Claim]:
        """Every live claim but this process's (by PID) or this launch's (by key)."""
        own_key = own_key if own_key is not None else str(own_pid)
        now = time.time()
        found = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        for name in names:
            if not (name.startswith(_PREFIX) and name.endswith(".json")):
                continue
            claim = _read(os.path.join(self.directory, name))
            if claim is not None and claim.key != own_key and claim.alive(now):
                found.append(claim)
        return found

    def claim(
        self,
        pid: int,
        bytes_by_gpu: Mapping[str, int],
        ttl_s: float = CLAIM_TTL_S,
        key: str | None = None,
    ) -> None:
        """Write this claim (replacing an earlier one of its key); nothing when it claims 0."""
        key = _safe_key(key if key is not None else str(pid))
        if not any(bytes_by_gpu.values()):
            self.release(key=key)
            return
        content = {
            "key": key,
            "pid": pid,
            "started_at": psutil.Process(pid).create_time(),
            "bytes_by_gpu": {uuid: int(n) for uuid, n in bytes_by_gpu.items()},
            "expires_at": time.time() + ttl_s,
        }
        _write_atomically(os.path.join(self.directory, f"{_PREFIX}{key}.json"), content)

    def release(self, pid: int | None = None, key: str | None = None) -> None:
        """Remove a claim (by its key, or the PID that is its key), if any."""
        key = _safe_key(key if key is not None else str(pid))
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.directory, f"{_PREFIX}{key}.json"))


def _safe_key(key: str) -> str:
    """A key usable in a file name: letters, digits, '-' and '_' only."""
    cleaned = "".join(c for c in key if c.isalnum() or c in "-_")
    if not cleaned:
        raise ValueError(f"a claim needs a key, not {key!r}")
    return cleaned


def _read(path: str) -> Claim | None:
    # Anyone can write into a shared directory: a FIFO of a claim's name must not hang the
    # decision (nor a 5,000-deep array crash it), nor a claim speak for another's process.
    found = read_small_file(path, _MAX_BYTES)
    if found is None:
        return None
    data, info = found
    try:
        content = json.loads(data)
        claim = Claim(
            pid=int(content["pid"]),
            started_at=float(content["started_at"]),
            bytes_by_gpu={str(k): int(v) for k, v in dict(content["bytes_by_gpu"]).items()},
            expires_at=float(content["expires_at"]),
            key=str(content.get("key") or content["pid"]),
        )
        owner = psutil.Process(claim.pid).uids().real
    except Exception:  # half-written, malformed whatever its shape, or its process gone
        return None
    return claim if owner == info.st_uid else None


def _write_atomically(path: str, content: dict) -> None:
    directory = os.path.dirname(path)
    fd, partial = tempfile.mkstemp(dir=directory, prefix=".jax_nbmem-claim.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o644)  # every user's kernels read it
            json.dump(content, out)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


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
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
        except OSError:
            fd = os.open(path, os.O_RDONLY)
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
