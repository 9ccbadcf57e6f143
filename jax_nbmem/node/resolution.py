"""The node agent's resolution, read by kernels (in containers or not) and the host's tools.

The node agent (``jax-nbmem exporter --share-dir S`` on the host) writes
``S/agent/resolution.json``: for every PID NVML lists and every kernel it registered through
its socket, the host PID, the PID inside its container, its PID namespace, its container and
the kernel's beacon *proven* by the host's view of the socket's peer. A kernel in a container
reads it to name its neighbours by their host PIDs and to find its own row.

Only the agent may write it, so a reader trusts it only when it can tell so: ``S/agent`` is a
real directory (no symlink), owned by root or by the agent's user (``$JAX_NBMEM_AGENT_USER``
or ``c.JaxNbMem.agent_user``: a name or a number) and writable by nobody else; the file is a
regular file of the same owner, writable by nobody else. A reader never trusts a directory of
its own uid unless it is root. Anything else is ignored with a said reason
(``Resolution.reason``). A file of the agent's that is over ``MAX_BYTES``, or whose JSON breaks
off, is read as far as it goes (its first ``MAX_BYTES``): its head and every whole entry before
the fault are used, the rest left out, and ``reason`` says so (the agent bounds what it
publishes far below; one bad entry never costs the others). A resolution older than
``max(3 x interval_s, 10)`` seconds is stale: its agent is dead or stuck.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from jax_nbmem.node.agent_client import AGENT_DIR
from jax_nbmem.node.agent_client_tcp import (
    network_absence,
    network_problem,
    parsed_network_resolution,
)
from jax_nbmem.node.beacon_files import read_file_head
from jax_nbmem.node.beacons import Beacon, beacon_from
from jax_nbmem.node.fields import strict_count, strict_number, strict_text
from jax_nbmem.node.identity import own_identity, same_namespace

__all__ = [
    "ENV_AGENT_USER",
    "MAX_BYTES",
    "SHOWN_KEYS",
    "Resolution",
    "ResolvedProcess",
    "agent_uid",
    "full_resolution_path",
    "load_resolution",
    "resolution_path",
]

log = logging.getLogger("jax_nbmem")

ENV_AGENT_USER = "JAX_NBMEM_AGENT_USER"
SCHEMA = 1
# 8 GPUs x 200 processes, each with a kernel's beacon (a few KiB): well under this.
MAX_BYTES = 32 * 1024 * 1024
# A process's container as public output shows it: the agent's container names, these keys.
SHOWN_KEYS = ("name", "id", "pod", "namespace", "name_reason", "rootless_uid")
_MIN_STALE_S = 10.0
_RUNTIMES = ("docker", "containerd", "crio", "podman", "kubepods", "unknown")
_USER_SOURCES = ("container", "uid", "host_uid")


def resolution_path(share_dir: str) -> str:
    """Where the agent writes its resolution, in the share directory ``share_dir``."""
    return os.path.join(share_dir, AGENT_DIR, "resolution.json")


def full_resolution_path(share_dir: str) -> str:
    """Where the agent writes its resolution with every name (mode 0600), when it hides some."""
    return os.path.join(share_dir, AGENT_DIR, "resolution-full.json")


@dataclass(frozen=True)
class ResolvedProcess:
    """One process as the agent resolved it from the host's side.

    ``pid`` is its host PID; ``pid_in_container`` its PID in its own (innermost) namespace,
    None when that is the host's; ``container`` ``{"id", "runtime", "name", "pod_uid", "pod",
    "namespace"}`` or None; ``kernel`` the beacon the kernel sent the agent, proven, or None.
    """

    pid: int
    pid_in_container: int | None
    pid_ns: tuple[int, int] | None
    start_ticks: int | None
    gpus: tuple[str, ...]
    container: dict | None
    kernel: Beacon | None
    names_reason: str | None = None  # why its kernel's names are null (not this reader's)
    # In a container, its user as the agent read it (``user_source``: ``container``, ``uid``
    # or ``host_uid``, see owners.unix_user_text); None from an agent that does not say.
    user: str | None = None
    user_source: str | None = None

    @property
    def shown_container(self) -> dict | None:
        """Its container as public output shows it (:data:`SHOWN_KEYS`).

        ``name_reason`` says why a name is missing; ``rootless_uid`` marks a rootless
        container, whose name is that user's claim.
        """
        if not self.container:
            return None
        return {key: self.container.get(key) for key in SHOWN_KEYS}


@dataclass(frozen=True)
class Resolution:
    """What a reader made of the agent's resolution.

    ``state``: ``fresh`` (use it), ``stale`` (too old: the agent stopped), ``absent`` (no
    agent here), ``untrusted`` (not the agent's: ignored) or ``malformed``; ``reason`` says
    why when it is not fresh. ``processes`` by host PID (empty unless fresh).
    """

    state: str
    reason: str | None = None
    path: str | None = None
    written_at: float | None = None
    interval_s: float | None = None
    agent: dict | None = None
    processes: Mapping[int, ResolvedProcess] = field(default_factory=dict)

    @property
    def fresh(self) -> bool:
        """Whether its processes can be used."""
        return self.state == "fresh"

    def get(self, host_pid: int) -> ResolvedProcess | None:
        """The agent's entry for ``host_pid`` (None: not fresh, or not listed)."""
        return self.processes.get(host_pid)

    def own_row(self, identity: Mapping[str, Any] | None = None) -> ResolvedProcess | None:
        """The entry of the process whose claims are ``identity`` (default: this one's).

        Matched on namespace, PID there and start ticks together (namespace inodes are
        reused), so a forged beacon in another container never matches.
        """
        identity = own_identity() if identity is None else identity
        ticks = identity.get("start_ticks")
        for entry in self.processes.values():
            if same_namespace(entry.pid_ns, identity.get("pid_ns")) and ticks is not None:
                local = entry.pid_in_container if entry.pid_in_container is not None else entry.pid
                if local == identity.get("pid_in_ns") and entry.start_ticks == ticks:
                    return entry
        return None

    def to_dict(self) -> dict:
        """JSON-ready: ``state``, ``reason``, ``written_at``, ``age_s``, ``processes`` (a count)."""
        age = None if self.written_at is None else max(0.0, time.time() - self.written_at)
        return {
            "state": self.state,
            "reason": self.reason,
            "written_at": self.written_at,
            "age_s": None if age is None else round(age, 1),
            "processes": len(self.processes),
        }


def agent_uid(
    agent_user: str | None = None, environ: Mapping[str, str] | None = None
) -> int | None:
    """The agent's uid besides root: ``$JAX_NBMEM_AGENT_USER`` (wins), else ``agent_user``."""
    environ = os.environ if environ is None else environ
    name = (environ.get(ENV_AGENT_USER) or agent_user or "").strip()
    if not name:
        return None
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, ValueError):
        log.info("jax_nbmem: agent user %r is unknown here; only root's agent is trusted", name)
        return None


# The last resolution parsed, by path, with the file's identity it came from.
_cache: dict[str, tuple[tuple, Resolution]] = {}


def load_resolution(
    share_dir: str | None,
    *,
    agent_user: str | None = None,
    now: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> Resolution:
    """Read and check the agent's resolution in ``share_dir``; never raises.

    Without a share directory (a pod on Kubernetes), the resolution the node agent last sent
    over the network (:mod:`~jax_nbmem.node.agent_client_tcp`), if any; absent, or stale,
    with the reason the agent was not heard (no address, unreachable, silent).
    """
    if not share_dir:
        received = parsed_network_resolution(_parse)
        if received is None:
            return Resolution("absent", network_absence(environ))
        judged = _judge_age(received, time.time() if now is None else now)
        trouble = network_problem()
        if judged.state == "stale" and trouble:
            judged = replace(judged, reason=f"{judged.reason}; {trouble}")
        return judged
    directory = os.path.join(share_dir, AGENT_DIR)
    path = resolution_path(share_dir)
    trusted_uids = {0}
    uid = agent_uid(agent_user, environ)
    if uid is not None:
        trusted_uids.add(uid)
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return Resolution("absent", f"no node agent here ({directory} does not exist)", path)
    except (OSError, ValueError) as exc:
        return Resolution("absent", f"{directory} cannot be read: {_why(exc)}", path)
    problem = _untrusted(info, directory, trusted_uids, is_dir=True)
    if problem:
        return Resolution("untrusted", problem, path)
    # The file with every name where this reader may open it (root, the agent's user).
    found = read_file_head(full_resolution_path(share_dir), MAX_BYTES)
    if found is not None:
        path = full_resolution_path(share_dir)
    else:
        found = read_file_head(path, MAX_BYTES)
    if found is None:
        if not os.path.lexists(path):
            return Resolution("absent", f"the node agent has written no {path} yet", path)
        return Resolution("untrusted", f"{path} is not a regular file (or unreadable)", path)
    data, file_info = found
    problem = _untrusted(file_info, path, {info.st_uid}, is_dir=False)
    if problem:
        return Resolution("untrusted", problem, path)
    key = (file_info.st_dev, file_info.st_ino, file_info.st_size, file_info.st_mtime_ns)
    cached = _cache.get(path)
    if cached is not None and cached[0] == key:
        resolution = cached[1]
    else:
        resolution = _parse(data, path)
        _cache.clear()
        _cache[path] = (key, resolution)
    return _judge_age(resolution, time.time() if now is None else now)


def _untrusted(info: os.stat_result, path: str, uids: set[int], *, is_dir: bool) -> str | None:
    """Why ``path`` (its ``lstat``/``fstat``) is not the agent's, or None."""
    if is_dir and not stat.S_ISDIR(info.st_mode):
        what = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"
        return f"{path} is {what}, not the agent's directory; ignored"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by others (mode {info.st_mode & 0o777:o}); ignored"
    if info.st_uid not in uids:
        return (
            f"{path} is owned by uid {info.st_uid}, not by root or the agent's user "
            f"(${ENV_AGENT_USER}); ignored"
        )
    if is_dir and info.st_uid == os.geteuid() and os.geteuid() != 0:
        return f"{path} is owned by this very user (uid {info.st_uid}); ignored"
    return None


def _judge_age(resolution: Resolution, now: float) -> Resolution:
    if resolution.state != "fresh":
        return resolution
    interval = resolution.interval_s or 0.0
    limit = max(3 * interval, _MIN_STALE_S)
    age = now - (resolution.written_at or 0.0)
    if age > limit:
        reason = (
            f"the node agent's resolution is {age:.0f} s old (it is rewritten every "
            f"{interval:g} s): the agent has stopped"
        )
        return Resolution(
            "stale", reason, resolution.path, resolution.written_at, resolution.interval_s,
            resolution.agent,
        )  # fmt: skip
    return resolution


_PROCESSES = re.compile(rb'"processes"\s*:\s*\[')


def _parse(data: bytes, path: str) -> Resolution:
    cut = len(data) > MAX_BYTES
    try:
        if cut:
            raise ValueError("over the cap")
        content = json.loads(data)
    except Exception as exc:  # any bytes at all: too deep, not UTF-8, numbers beyond a float
        if cut:
            cause = f"is over the readers' {MAX_BYTES >> 20} MiB"
        else:
            cause = f"is malformed JSON ({type(exc).__name__})"
        return _parse_head(data[:MAX_BYTES], path, cause)
    if not isinstance(content, dict) or content.get("schema") != SCHEMA:
        return Resolution("malformed", f"{path} is not a schema {SCHEMA} resolution; ignored", path)
    written_at = strict_number(content.get("written_at"))
    interval = strict_number(content.get("interval_s"))
    if written_at is None or interval is None or interval < 0:
        return Resolution("malformed", f"{path} says no written_at or interval_s; ignored", path)
    processes: dict[int, ResolvedProcess] = {}
    entries = content.get("processes")
    for entry in entries if isinstance(entries, list) else ():
        try:
            resolved = _entry(entry, path)
        except Exception:  # one malformed entry is skipped, never fatal
            resolved = None
        if resolved is not None:
            processes[resolved.pid] = resolved
    agent = content.get("agent")
    if isinstance(agent, dict):
        agent = {k: v for k, v in agent.items() if strict_text(k, 64)}
    else:
        agent = None
    return Resolution("fresh", None, path, written_at, interval, agent, processes)


def _parse_head(data: bytes, path: str, cause: str) -> Resolution:
    """What can be trusted of a resolution that breaks off: its head, its whole entries."""
    found = _PROCESSES.search(data)
    if found is None:
        return Resolution("malformed", f"{path} {cause}; ignored", path)
    head = _parse(data[: found.end()] + b"]}", path)
    if head.state != "fresh":
        return Resolution("malformed", f"{path} {cause}; ignored", path)
    text = data[found.end() :].decode("utf-8", "ignore")
    decoder, position, processes = json.JSONDecoder(), 0, {}
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        try:
            entry, position = decoder.raw_decode(text, position)
            resolved = _entry(entry, path)
        except Exception:  # the fault (or the cut): what came before it stands
            break
        if resolved is not None:
            processes[resolved.pid] = resolved
    reason = f"{path} {cause}: its {len(processes)} entries before that are used, the rest left out"
    return replace(head, reason=reason, processes=processes)


def _entry(entry: Any, path: str) -> ResolvedProcess | None:
    if not isinstance(entry, dict):
        return None
    pid = strict_count(entry.get("pid"))
    if pid is None or not 0 < pid < 2**31:
        return None
    inner = strict_count(entry.get("pid_in_container"))
    ns = entry.get("pid_ns")
    ns_ok = isinstance(ns, list) and len(ns) == 2 and all(strict_count(v) is not None for v in ns)
    gpus = entry.get("gpus")
    gpus = tuple(g for g in gpus if strict_text(g, 128)) if isinstance(gpus, list) else ()
    kernel = entry.get("kernel")
    beacon = beacon_from(kernel, f"{path} (pid {pid})") if isinstance(kernel, dict) else None
    return ResolvedProcess(
        pid=pid,
        pid_in_container=inner if inner is not None and 0 < inner < 2**31 else None,
        pid_ns=(ns[0], ns[1]) if ns_ok else None,
        start_ticks=strict_count(entry.get("start_ticks")),
        gpus=gpus,
        container=_container(entry.get("container")),
        kernel=beacon,
        names_reason=strict_text(kernel.get("names_reason"), 256) if beacon is not None else None,
        **_user(entry),
    )


def _user(entry: dict) -> dict:
    """An entry's ``user`` and ``user_source``, both or neither (an agent before them: none)."""
    source, user = entry.get("user_source"), strict_text(entry.get("user"), 64)
    if source not in _USER_SOURCES or not user:
        return {}
    return {"user": user, "user_source": source}


def _container(value: Any) -> dict | None:
    if not isinstance(value, dict):
        return None
    container_id = strict_text(value.get("id"), 256)
    if not container_id:
        return None
    runtime = value.get("runtime")
    return {
        "id": container_id,
        "runtime": runtime if runtime in _RUNTIMES else "unknown",
        "name": strict_text(value.get("name"), 256),
        "pod_uid": strict_text(value.get("pod_uid"), 64),
        "pod": strict_text(value.get("pod"), 256),
        "namespace": strict_text(value.get("namespace"), 256),
        "name_reason": strict_text(value.get("name_reason"), 1024),
        "rootless_uid": strict_count(value.get("rootless_uid")),
    }


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or type(exc).__name__
