"""What a process can say about who it is, in terms that survive PID namespaces (containers).

A kernel in a container knows its PID only inside its own PID namespace; NVML, the node agent
and everyone on the host know it by its host PID. :func:`own_identity` is what this process
*claims* about itself (its beacon's ``identity``): its PID namespace (device and inode of
``/proc/self/ns/pid``), its PID there, its start as clock ticks since boot (the same from any
PID namespace, though not under a time namespace) with the boot's id, and its host name. They
are claims, not proofs: only the node agent, which sees this process's socket peer from the
host, can prove them (see :mod:`jax_nbmem.node.resolution`).

Read once per process and cached: none of them changes while it runs (a fork starts anew).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

from jax_nbmem.gpu.own_process import INIT_PID_NS_INO

__all__ = [
    "INIT_PID_NS_INO",
    "beacon_key",
    "in_initial_namespace",
    "own_identity",
    "same_namespace",
    "start_ticks",
]

_lock = threading.Lock()
_cached: tuple[int, dict[str, Any]] | None = None


def start_ticks(stat_path: str = "/proc/self/stat") -> int | None:
    """Field 22 of ``/proc/PID/stat``: the start in clock ticks since boot; None if unreadable.

    The command name (field 2) may hold spaces and parentheses: fields are counted after its
    last closing parenthesis.
    """
    try:
        with open(stat_path, "rb") as f:
            text = f.read(4096)
        fields = text[text.rindex(b")") + 2 :].split()
        return int(fields[19])  # field 22, counted from field 3
    except (OSError, ValueError, IndexError):
        return None


def _pid_namespace() -> list[int] | None:
    try:
        info = os.stat("/proc/self/ns/pid")
    except OSError:  # no /proc in this namespace, or not Linux
        return None
    return [info.st_dev, info.st_ino]


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read(64).strip() or None
    except (OSError, ValueError):
        return None


def own_identity() -> dict[str, Any]:
    """This process's claims (the beacon's ``identity``), read once per process; a new dict.

    ``pid_ns`` ([device, inode]), ``start_ticks`` and ``boot_id`` are None when unreadable
    (``/proc`` not mounted); ``pid_in_ns`` is ``os.getpid()``.
    """
    global _cached
    pid = os.getpid()
    with _lock:
        if _cached is None or _cached[0] != pid:  # a forked child is another process
            try:
                hostname = socket.gethostname()
            except OSError:
                hostname = None
            _cached = (
                pid,
                {
                    "pid_ns": _pid_namespace(),
                    "pid_in_ns": pid,
                    "start_ticks": start_ticks(),
                    "boot_id": _boot_id(),
                    "hostname": hostname,
                },
            )
        identity = _cached[1]
    return {**identity, "pid_ns": list(identity["pid_ns"]) if identity["pid_ns"] else None}


def in_initial_namespace(identity: Mapping[str, Any] | None = None) -> bool | None:
    """Whether ``identity`` (default: this process's) is in the host's PID namespace.

    None when its namespace is unknown.
    """
    identity = own_identity() if identity is None else identity
    ns = identity.get("pid_ns")
    if not _is_ns(ns):
        return None
    return ns[1] == INIT_PID_NS_INO


def same_namespace(a: Any, b: Any) -> bool:
    """Whether two ``pid_ns`` values ([device, inode]) are known and the same namespace."""
    return _is_ns(a) and _is_ns(b) and list(a) == list(b)


def beacon_key(identity: Mapping[str, Any] | None = None) -> str:
    """The key of a beacon's and its alive lock's file names (see the contract).

    ``<pid>`` in the host's PID namespace (or where the namespace cannot be read: there is
    nothing else to go by), ``<ns inode>-<pid in ns>`` in any other, so that containers whose
    kernels share a PID never share a file.
    """
    identity = own_identity() if identity is None else identity
    pid = identity["pid_in_ns"]
    ns = identity.get("pid_ns")
    if _is_ns(ns) and ns[1] != INIT_PID_NS_INO:
        return f"{ns[1]}-{pid}"
    return str(pid)


def _is_ns(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64 for v in value)
    )
