"""The culler's notices and counts: what the culler leaves in the share directory for kernels.

A candidate of the culler (:mod:`jax_nbmem.tenants.culling`) is first warned — a notice file
in the shared beacon directory, ``jax_nbmem-cull-<pid>.json``, that the kernel itself shows
("will be shut down at HH:MM unless it runs a cell") — and only stopped once the notice's time
has passed and it has run no cell since.

A kernel in a container is keyed as its beacon is (the contract): ``jax_nbmem-cull-<key>.json``
with key ``<ns_ino>-<pid_in_ns>`` (its PID namespace's inode, its PID there), so that the
kernel finds its own notice by what it knows of itself; the notice's ``pid`` is its host PID
and ``key`` its key. A kernel in the host's PID namespace keeps ``<pid>``.

A kernel believes a notice only from root or the shared directory's owner (a hub runs its
services as one of them), never from another user. A kernel in a pod has no shared directory:
the node agent, which reads the notices there with the same trust, relays each kernel its own
over the connection the kernel opened (:mod:`jax_nbmem.agent.tcp`), and the kernel checks it again
(:func:`relayed_notice`).

The culler also keeps its count of kernels culled, by reason, in the shared directory
(``jax_nbmem-culled.json``, trusted as a notice is), where the node exporter, which Prometheus
scrapes already, serves it as ``jax_nbmem_culled_kernels_total{reason}``.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from jax_nbmem.node.beacons import write_atomically
from jax_nbmem.node.fields import strict_number

__all__ = [
    "CULL_REASONS",
    "CullCounts",
    "Notice",
    "notice_content",
    "notice_warning",
    "read_counts",
    "read_notice",
    "relayed_notice",
    "remove_notice",
    "write_counts",
    "write_notice",
]

_PREFIX = "jax_nbmem-cull-"
_COUNTS = "jax_nbmem-culled.json"
_MAX_BYTES = 16 * 1024
# jax_nbmem_culled_kernels_total's reasons (the culler's Candidate.reason), each served from
# the start.
CULL_REASONS = ("idle-preallocated", "idle-over-share")


@dataclass(frozen=True)
class Notice:
    """What the culler told a kernel: it will be shut down at ``deadline`` (epoch seconds)."""

    pid: int
    started_at: float | None
    warned_at: float
    deadline: float
    reason: str
    why: str
    key: str | None = None  # its file's key: None for "<pid>" (see the module)

    def message(self) -> str:
        """The sentence the kernel's panel and status show."""
        at = time.strftime("%H:%M", time.localtime(self.deadline))
        return (
            f"This kernel will be shut down at {at} unless it runs a cell: the GPU culler of "
            f"this node found it {self.why}. Run any cell to keep it, or free its memory "
            "(restart it with `%jaxalloc off` in its first cell)."
        )


@dataclass(frozen=True)
class CullCounts:
    """How many kernels the node's culler shut down, by reason, since ``since`` (Unix s)."""

    counts: dict[str, int]
    since: float


def _path(directory: str, key: int | str) -> str:
    return os.path.join(directory, f"{_PREFIX}{key}.json")


def write_notice(directory: str, notice: Notice) -> str:
    """Write the notice for its kernel (named by its key), world-readable, atomically."""
    return write_atomically(_path(directory, notice.key or notice.pid), asdict(notice))


def write_counts(directory: str, counts: CullCounts) -> str:
    """Write the culler's counts, world-readable, atomically; returns the path."""
    return write_atomically(os.path.join(directory, _COUNTS), asdict(counts))


def read_counts(directories: Iterable[str]) -> CullCounts | None:
    """The culler's counts (root's or the directory owner's file), or None: no culler's."""
    for directory in directories:
        content = _read_trusted(directory, _COUNTS)
        try:
            counts = {str(k): int(v) for k, v in dict(content["counts"]).items()}
            since = float(content["since"])
        except (KeyError, TypeError, ValueError):
            continue
        if all(v >= 0 for v in counts.values()) and len(counts) <= len(CULL_REASONS):
            return CullCounts(counts={r: counts.get(r, 0) for r in CULL_REASONS}, since=since)
    return None


def _read_trusted(directory: str, name: str) -> Any:
    """The JSON of ``directory/name`` if root or the directory's owner wrote it, else None."""
    try:
        # Non-blocking: a FIFO a user put at the name is never waited on (the exporter's refresh).
        fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC)  # fmt: skip
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        owners = {0, os.stat(directory).st_uid}
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in owners:
            return None
        if info.st_size > _MAX_BYTES:
            return None
        with os.fdopen(fd, "r", encoding="utf-8") as file:
            fd = -1
            return json.load(file)
    except (OSError, ValueError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def remove_notice(directory: str, key: int | str) -> None:
    """Take a kernel's notice (by PID or key) away; none there is fine."""
    try:
        os.unlink(_path(directory, key))
    except FileNotFoundError:
        pass


def read_notice(
    directories: Iterable[str],
    pid: int,
    started_at: float | None = None,
    key: str | None = None,
) -> Notice | None:
    """The notice for ``pid`` that it may believe (root's or the directory owner's), or None.

    ``key`` (a kernel in a container: ``<ns_ino>-<pid_in_ns>``) names the file and must be
    the notice's own; the notice's ``pid`` is then its host PID, not ``pid``.
    """
    for directory in directories:
        content = _read_trusted(directory, os.path.basename(_path(directory, key or pid)))
        notice = _checked(content, pid, started_at, key)
        if notice is not None:
            return notice
    return None


def relayed_notice(
    content: Any, pid: int, started_at: float | None = None, key: str | None = None
) -> Notice | None:
    """The notice the node agent relayed to this kernel (``content``: its dict), or None.

    A kernel in a pod has no share directory: the agent, which reads the culler's notices
    there as :func:`read_notice` does (root's or the directory owner's only), gives each
    proven caller its own over the connection the kernel opened (:mod:`jax_nbmem.agent.tcp`).
    Checked here as a file's would be: meant for ``pid`` / ``key``, of this process's start.
    """
    return _checked(content, pid, started_at, key)


def notice_content(notice: Notice) -> dict:
    """A notice as the agent relays it (the file's keys)."""
    return asdict(notice)


def _checked(content: Any, pid: int, started_at: float | None, key: str | None) -> Notice | None:
    """``content`` as a Notice when it is one meant for this kernel, else None."""
    if not isinstance(content, dict):
        return None
    try:
        notice = Notice(
            pid=int(content["pid"]), started_at=strict_number(content.get("started_at")),
            warned_at=float(content["warned_at"]), deadline=float(content["deadline"]),
            reason=str(content["reason"]), why=str(content["why"]),
            key=content.get("key") if isinstance(content.get("key"), str) else None,
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, OverflowError):
        return None
    if content.get("started_at") is not None and notice.started_at is None:
        return None  # a start no process has (NaN, infinite, not a number): no notice
    if not _meant_for(notice, pid, key):
        return None
    if started_at is not None and notice.started_at is not None:
        if abs(notice.started_at - started_at) > 1.0:
            return None  # meant for an earlier process of that PID
    return notice


def _meant_for(notice: Notice, pid: int, key: str | None) -> bool:
    """Whether ``notice`` speaks to the kernel of ``pid`` (or of ``key``, in a container)."""
    if key:
        return notice.key == key
    return notice.pid == pid and notice.key in (None, str(pid))


def notice_warning(notice: Notice | None, pid: int, gpu: int | None) -> dict | None:
    """The ``cull-pending`` warning a kernel shows about itself, or None without a notice."""
    if notice is None:
        return None
    return {"kind": "cull-pending", "gpu": gpu, "pid": pid, "message": notice.message()}
