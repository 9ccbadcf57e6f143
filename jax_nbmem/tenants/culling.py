"""GPU-aware idle culling: which kernels an administrator's policy would stop, and the notice.

A kernel is a candidate when it has been idle longer than the policy's limit, holds a
preallocated pool (or more than the policy's share of a GPU), and sits on a GPU where others
are short of memory: less free than a default JAX start needs (75% of the GPU). A busy kernel
never is, nor one of a user the policy exempts. A candidate is first warned — a notice file
in the shared beacon directory, ``jax_nbmem-cull-<pid>.json``, that the kernel itself shows
("will be shut down at HH:MM unless it runs a cell") — and only stopped once the notice's time
has passed and it has run no cell since. The stopping is the culler's (``jax-nbmem cull``).

A kernel in a container is keyed as its beacon is (the contract): ``jax_nbmem-cull-<key>.json``
with key ``<ns_ino>-<pid_in_ns>`` (its PID namespace's inode, its PID there), so that the
kernel finds its own notice by what it knows of itself; the notice's ``pid`` is its host PID
and ``key`` its key. A kernel in the host's PID namespace keeps ``<pid>``.

A kernel believes a notice only from root or the shared directory's owner (a hub runs its
services as one of them), never from another user.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from jax_nbmem.allocator.jaxlib import DEFAULT_FRACTION
from jax_nbmem.gpu.mig import report_label
from jax_nbmem.units import format_bytes, format_duration

__all__ = [
    "Candidate",
    "CullPolicy",
    "Notice",
    "candidates",
    "notice_warning",
    "read_notice",
    "remove_notice",
    "write_notice",
]

_PREFIX = "jax_nbmem-cull-"
_MAX_BYTES = 16 * 1024


@dataclass(frozen=True)
class CullPolicy:
    """An administrator's culling policy (see the module); ``share`` None: pools only."""

    idle_s: float
    warn_s: float = 600.0
    share: float | None = None
    exempt: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Candidate:
    """A kernel the policy would stop, and why (``reason``: a short label for the metric)."""

    pid: int
    gpu: int
    started_at: float | None
    kernel_id: str | None
    user: str | None
    hub_user: str | None
    notebook: str | None
    idle_s: float
    used_bytes: int | None
    reason: str  # "idle-preallocated" or "idle-over-share"
    why: str  # one sentence

    def label(self) -> str:
        """``kernel PID 123 (notebook x.ipynb, hub user alice)``."""
        whose = self.hub_user or self.user
        parts = [p for p in (self.notebook and f"notebook {self.notebook}",
                             whose and f"user {whose}") if p]  # fmt: skip
        return f"kernel PID {self.pid}" + (f" ({', '.join(parts)})" if parts else "")


def candidates(report: Mapping[str, Any], policy: CullPolicy) -> list[Candidate]:
    """The kernels of a status report (``jax-nbmem status --json``) that the policy would stop."""
    gpus = {g["index"]: g for g in report.get("gpus", [])}
    found: dict[int, Candidate] = {}
    for process in report.get("processes", []):
        gpu = gpus.get(process.get("gpu"))
        if process.get("kind") != "kernel" or gpu is None:
            continue
        if process.get("user") in policy.exempt or process.get("hub_user") in policy.exempt:
            continue
        idle = process.get("idle_s")
        if idle is None or idle < policy.idle_s or idle == 0:
            continue  # busy, or idle for less than the limit, or never known
        total, free, used = gpu.get("total_bytes"), gpu.get("free_bytes"), process.get("used_bytes")
        if total is None or free is None:
            continue  # cannot tell whether anyone is short of memory
        needed = DEFAULT_FRACTION * total
        if free >= needed:
            continue  # nobody waits: a default JAX start still fits
        if process.get("preallocated"):
            reason, holds = "idle-preallocated", "a preallocated pool"
        elif policy.share is not None and used is not None and used > policy.share * total:
            reason, holds = "idle-over-share", f"more than {policy.share:.0%} of the GPU"
        else:
            continue
        where = report_label(gpu)  # a MIG instance: its label
        why = (
            f"idle for {format_duration(idle)} (limit {format_duration(policy.idle_s)}), it "
            f"holds {holds} ({format_bytes(used)}) of {where}, where only "
            f"{format_bytes(free)} is free, less than the {format_bytes(needed)} a default "
            "JAX start needs"
        )
        if process["pid"] not in found:
            found[process["pid"]] = Candidate(
                pid=process["pid"], gpu=gpu["index"], started_at=process.get("started_at"),
                kernel_id=process.get("kernel_id"), user=process.get("user"),
                hub_user=process.get("hub_user"),
                notebook=process.get("notebook_shown") or process.get("notebook"),
                idle_s=idle, used_bytes=used, reason=reason, why=why,
            )  # fmt: skip
    return list(found.values())


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


def _path(directory: str, key: int | str) -> str:
    return os.path.join(directory, f"{_PREFIX}{key}.json")


def write_notice(directory: str, notice: Notice) -> str:
    """Write the notice for its kernel (named by its key), world-readable, atomically."""
    path = _path(directory, notice.key or notice.pid)
    fd, partial = tempfile.mkstemp(dir=directory, prefix=".cull-")
    try:
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o644)
            json.dump(asdict(notice), out)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.unlink(partial)
        raise
    return path


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
        path = _path(directory, key or pid)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            owners = {0, os.stat(directory).st_uid}
            if not stat.S_ISREG(info.st_mode) or info.st_uid not in owners:
                continue
            if info.st_size > _MAX_BYTES:
                continue
            with os.fdopen(fd, "r", encoding="utf-8") as file:
                fd = -1
                content = json.load(file)
            notice = Notice(
                pid=int(content["pid"]), started_at=content.get("started_at"),
                warned_at=float(content["warned_at"]), deadline=float(content["deadline"]),
                reason=str(content["reason"]), why=str(content["why"]),
                key=content.get("key") if isinstance(content.get("key"), str) else None,
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            continue
        finally:
            if fd >= 0:
                os.close(fd)
        if not _meant_for(notice, pid, key):
            continue
        if started_at is not None and notice.started_at is not None:
            if abs(notice.started_at - started_at) > 1.0:
                continue  # meant for an earlier process of that PID
        return notice
    return None


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
