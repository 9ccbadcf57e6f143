"""This process on the GPU: the PID NVML lists it by, one notion for every feature.

NVML lists processes by their PID in the host's PID namespace. A process there is listed as
``os.getpid()``. A process in a container (another PID namespace) is listed by a host PID it
cannot read itself: only the node agent, which sees the process's socket peer from the host,
can prove it (:attr:`jax_nbmem.node.agent_client.AgentClient.proven_pid`). Whoever holds that proof
(the kernel's beacon writer) hands it here with :func:`set_proven_pid`; until then this
process's NVML PID is unknown (None), never its PID in the container and never 0.

Every figure about this process's own GPU bytes (the sampler's split, ``track()``, ``%jaxmem
free``, ``compare``, ``fit``, ``status``'s own row) finds it through :func:`nvml_pid` and
:func:`own_entries`; no other module compares ``os.getpid()`` with NVML's PIDs.

Its PID namespace is read once per process (a forked child reads it again); a proof belongs
to the process that received it, so a forked child starts unproven.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import Any

__all__ = [
    "INIT_PID_NS_INO",
    "in_host_namespace",
    "is_own",
    "nvml_pid",
    "own_entries",
    "proven_pid",
    "set_proven_pid",
    "unknown_reason",
]

# The initial (host's) PID namespace's inode: PROC_PID_INIT_INO, fixed in the kernel.
INIT_PID_NS_INO = 0xEFFFFFFC

_lock = threading.Lock()
# (the PID of the process that read or was told it, the value): a fork starts anew.
_namespace: tuple[int, bool | None] | None = None
_proven: tuple[int, int] | None = None


def _read_namespace(path: str = "/proc/self/ns/pid") -> bool | None:
    try:
        return os.stat(path).st_ino == INIT_PID_NS_INO
    except OSError:  # no /proc in this namespace: where it runs cannot be told
        return None


def in_host_namespace() -> bool | None:
    """Whether this process runs in the host's PID namespace; None when it cannot be read."""
    global _namespace
    pid = os.getpid()
    cached = _namespace
    if cached is None or cached[0] != pid:
        cached = (pid, _read_namespace())
        with _lock:
            _namespace = cached
    return cached[1]


def set_proven_pid(pid: int | None) -> None:
    """Keep the host PID the node agent proved for this process (None: no longer proven).

    Called by whoever holds the agent's answer (the kernel's beacon writer), from any thread.
    On the host a proof changes nothing: NVML's PID is ``os.getpid()`` there anyway.
    """
    valid = isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
    with _lock:
        global _proven
        _proven = (os.getpid(), pid) if valid else None


def proven_pid() -> int | None:
    """The host PID the node agent proved for this very process, or None."""
    proven = _proven
    return proven[1] if proven is not None and proven[0] == os.getpid() else None


def nvml_pid() -> int | None:
    """The PID NVML lists this process by; None while it is unknown.

    ``os.getpid()`` in the host's PID namespace; in a container (or where ``/proc`` cannot
    tell) the host PID the node agent proved, None until it has.
    """
    if in_host_namespace():
        return os.getpid()
    return proven_pid()


def is_own(pid: Any) -> bool:
    """Whether NVML's ``pid`` is this process (False while this process's PID is unknown)."""
    own = nvml_pid()
    return own is not None and pid == own


def own_entries(processes: Iterable[Any]) -> list[Any] | None:
    """This process's entries among NVML's process records; None while its PID is unknown."""
    own = nvml_pid()
    if own is None:
        return None
    return [process for process in processes if process.pid == own]


def unknown_reason() -> str:
    """Why this process's NVML PID is unknown, in words for a note (see :func:`nvml_pid`)."""
    if in_host_namespace() is None:
        return "this process cannot read its PID namespace (/proc), so NVML's PID for it is unknown"
    return (
        "this process runs in a container (its own PID namespace) and the node agent has not "
        "proved its host PID, which NVML lists it by"
    )
