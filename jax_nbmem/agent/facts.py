"""Proven facts and claimed ones: the trust boundary, in types.

An action taken with someone else's authority (root's ``jax-nbmem shutdown``, the culler
with its hub token) decides whose kernel it is from facts the target could not write, never
from what the kernel says of itself. Two kinds of value, never mixed:

- *Proven* (``Proven*``): read by the host from the kernel of the operating system, or from a
  record the target's user cannot write. :class:`ProvenProcess` (host PID with its start
  ticks, real UID, real parent, PID namespace, the container its host cgroup names),
  :class:`ProvenOwner` (the Unix user of that UID on a plain host; in a container, the hub user
  as its runtime recorded it: a pod's ``hub.jupyter.org/username`` annotation from the
  Kubernetes API, ``JUPYTERHUB_USER`` in a rootful Docker's or Podman's own record of the
  container), :class:`ProvenServer` (the real ancestor that is a Jupyter server, of the same
  UID and PID namespace, listening on the port its runtime file names) and
  :class:`ProvenKernelId` (a kernel id that *that* server's own ``api/kernels`` lists).
- *Claimed* (:class:`Claimed`): everything the kernel, its beacon, its environment or its
  command line says: its kernel id, hub user, notebook, ``JPY_PARENT_PID``. A claim may be
  shown (marked as claimed); it is used only where a proven fact bounds it (a kernel id is
  asked of the proven server only), and where it disagrees with a fact, nothing is done
  (:func:`disagreements` names each disagreement).

Code that acts (:mod:`jax_nbmem.cli.stop`, :mod:`jax_nbmem.cli.culler`) takes the proven types.
Nothing here raises but :class:`FactError`, whose message says which fact is missing.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
from dataclasses import dataclass, field

from jax_nbmem.agent.cgroups import Container
from jax_nbmem.agent.hostview import HostViewer, read_proc
from jax_nbmem.agent.stores import podman_config_path

__all__ = [
    "Claimed",
    "FactError",
    "ProvenKernelId",
    "ProvenOwner",
    "ProvenProcess",
    "ProvenServer",
    "disagreements",
    "owner_of",
    "parent_pid",
    "prove_process",
]

ENV_HUB_USER = "JUPYTERHUB_USER"
_MAX_RECORD_BYTES = 4 << 20
_MAX_STAT_BYTES = 4096


class FactError(RuntimeError):
    """A fact that could not be proven; the message says which, and why."""


@dataclass(frozen=True)
class ProvenProcess:
    """A host process as the host's ``/proc`` shows it (see the module).

    ``pid``: the host's PID; ``start_ticks``: its start (a reused PID has another);
    ``container``: what its host cgroup names (None: none), named where the host can.
    """

    pid: int
    start_ticks: int
    uid: int
    user: str | None  # the host's name of ``uid`` (None: none, or it runs in a container)
    parent_pid: int | None
    pid_ns: tuple[int, int] | None
    pid_in_container: int | None
    container: Container | None

    @property
    def namespaced(self) -> bool:
        """Whether it runs in a PID namespace below the host's (a container's)."""
        return self.pid_in_container is not None

    def still_running(self, viewer: HostViewer | None = None) -> bool:
        """Whether the same process (same start) still has this PID."""
        return (viewer or HostViewer()).start_ticks(self.pid) == self.start_ticks


@dataclass(frozen=True)
class ProvenOwner:
    """Whose a process is, from a source its user cannot write; ``source`` names it."""

    name: str  # the hub user where one is known for sure, else the Unix user
    source: str
    is_hub_user: bool


@dataclass(frozen=True)
class ProvenServer:
    """A kernel's Jupyter server, found from host facts (see :func:`.authority.parent_server`).

    ``server``: the runtime file's :class:`~jax_nbmem.node.servers.JupyterServer` (its token
    never shows); ``pid`` the server's host PID, a real ancestor of the kernel.
    """

    pid: int
    url: str
    server: object = field(repr=False, compare=False)


@dataclass(frozen=True)
class ProvenKernelId:
    """A kernel id that the named server's own list has (``listed_by``: which server)."""

    kernel_id: str
    listed_by: str


@dataclass(frozen=True)
class Claimed:
    """What a kernel says of itself (beacon, environment, command line); never proof.

    ``kernel_id`` is its beacon's (or, for a kernel in a container, the node agent's relayed
    one); ``command_line_kernel_id`` the ``kernel-<id>.json`` its command line names (as
    forgeable: its server's user wrote it); ``server_pid`` its ``$JPY_PARENT_PID``.
    """

    kernel_id: str | None = None
    command_line_kernel_id: str | None = None
    hub_user: str | None = None
    notebook: str | None = None
    server_pid: int | None = None

    @property
    def any_kernel_id(self) -> str | None:
        """The kernel id it claims (beacon first); :func:`disagreements` says if two differ."""
        return self.kernel_id or self.command_line_kernel_id


def parent_pid(pid: int, proc: str = "/proc") -> int | None:
    """The real parent of host PID ``pid`` (field 4 of ``/proc/PID/stat``), or None."""
    try:
        text = read_proc(f"{proc}/{pid}/stat", _MAX_STAT_BYTES)
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def prove_process(pid: int, viewer: HostViewer | None = None) -> ProvenProcess:
    """What the host's ``/proc`` says of ``pid``; FactError when it cannot be read whole.

    Must run in the host's PID namespace (NVML's PIDs and ``/proc``'s are then the same).
    """
    viewer = viewer or HostViewer()
    view = viewer.view(pid)
    if view is None:
        raise FactError(f"PID {pid} is gone, or not readable in this PID namespace")
    if view.uid is None:
        raise FactError(f"PID {pid}: its owner (the Uid line of /proc/{pid}/status) is unreadable")
    user: str | None = None
    if view.container is None:  # in a container, the host's name for its uid is someone else's
        try:
            user = pwd.getpwuid(view.uid).pw_name
        except KeyError:
            pass
    parent = parent_pid(pid, viewer.proc)
    if viewer.start_ticks(pid) != view.start_ticks:
        raise FactError(f"PID {pid} ended while it was read: it names another process now")
    return ProvenProcess(
        pid=pid, start_ticks=view.start_ticks, uid=view.uid, user=user, parent_pid=parent,
        pid_ns=view.pid_ns, pid_in_container=view.pid_in_container, container=view.container,
    )  # fmt: skip


def owner_of(
    process: ProvenProcess,
    docker_root: str = "/var/lib/docker",
    podman_root: str = "/var/lib/containers/storage",
) -> ProvenOwner:
    """Whose ``process`` is, from a source its user cannot write; FactError: none exists.

    No container: the Unix user of its UID (on a plain host the hub, LocalProcessSpawner or
    SystemdSpawner, names a server's Unix user after its hub user). A pod: KubeSpawner's
    annotation, as the node's pod directory read it from the Kubernetes API. Docker or rootful
    Podman: ``JUPYTERHUB_USER`` in the runtime's own record of the container (root's file; only
    that key is read, the rest, which holds the server's token, is never kept nor logged).
    """
    container = process.container
    if container is None:
        if process.user is None:
            raise FactError(f"PID {process.pid}: its UID {process.uid} has no user name")
        return ProvenOwner(process.user, "the Unix user of its process", is_hub_user=False)
    shown = container.name or (container.id or "?")[:12]
    if container.pod_uid:
        if container.hub_user:
            source = f"its pod {container.namespace}/{container.pod}'s hub.jupyter.org/username"
            return ProvenOwner(container.hub_user, source + " (the Kubernetes API)", True)
        why = container.name_reason or "the pod carries no hub.jupyter.org/username annotation"
        raise FactError(f"container {shown}'s hub user is unknown: {why}")
    if container.runtime == "docker" and container.id:
        path = os.path.join(docker_root, "containers", container.id, "config.v2.json")
        env = _entry(_root_record(path), "Config", "Env")
        return _hub_user_in(env, f"Docker's record of container {shown}", path)
    if container.runtime == "podman" and container.id:
        try:
            path = podman_config_path(podman_root, container.id)
        except LookupError as error:
            raise FactError(f"container {shown}'s hub user is unknown: {error}") from None
        env = _entry(_root_record(path), "process", "env")
        return _hub_user_in(env, f"rootful Podman's record of container {shown}", path)
    raise FactError(
        f"container {shown} ({container.runtime}): no record its user cannot write names its "
        "hub user (read: a pod's annotation, Docker's and rootful Podman's container records)"
    )


def _root_record(path: str) -> dict:
    """The JSON of a runtime's record of a container: root's regular file, never a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        raise FactError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode) or held.st_uid != 0 or held.st_mode & 0o022:
            raise FactError(f"{path} is not root's own record (owner or mode): not believed")
        data = os.read(fd, _MAX_RECORD_BYTES + 1)
        while len(data) <= _MAX_RECORD_BYTES and (more := os.read(fd, _MAX_RECORD_BYTES)):
            data += more
    except OSError as error:
        raise FactError(f"cannot read {path}: {error.strerror or error}") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_RECORD_BYTES:
        raise FactError(f"{path} is over {_MAX_RECORD_BYTES >> 20} MiB: not read")
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        raise FactError(f"{path} is not a container record") from None
    if not isinstance(record, dict):
        raise FactError(f"{path} is not a container record")
    return record


def _entry(record: dict, section: str, key: str) -> object:
    """``record[section][key]``, or None where either is missing or not an object."""
    part = record.get(section)
    return part.get(key) if isinstance(part, dict) else None


def _hub_user_in(env: object, record: str, path: str) -> ProvenOwner:
    """``JUPYTERHUB_USER`` among a record's ``KEY=value`` strings; only that key is looked at."""
    prefix = ENV_HUB_USER + "="
    for entry in env if isinstance(env, list) else ():
        if isinstance(entry, str) and entry.startswith(prefix) and entry[len(prefix) :].strip():
            return ProvenOwner(entry[len(prefix) :].strip(), f"{ENV_HUB_USER} in {record}", True)
    raise FactError(f"{record} ({path}) sets no {ENV_HUB_USER}: its hub user is unknown")


def disagreements(
    process: ProvenProcess,
    owner: ProvenOwner | None,
    claimed: Claimed,
    ancestors: tuple[int, ...] = (),
    *,
    through_hub: bool = False,
) -> list[str]:
    """Where the kernel's claims contradict the facts, each in words; [] when none do.

    ``ancestors``: the host PIDs of its real ancestors (its ``$JPY_PARENT_PID`` must be one,
    where it is in the host's PID namespace: in a container it names a PID there).
    ``through_hub``: the hub is to be asked for the owner's server; a Unix user then stands for
    the hub user (as a hub's LocalProcessSpawner or SystemdSpawner names them), so a claimed
    hub user must be it. Without the hub a claimed hub user selects nothing, and a hub that
    maps names otherwise stays free to.
    """
    found = []
    claimed_user = claimed.hub_user
    if owner is not None and claimed_user and claimed_user != owner.name:
        if owner.is_hub_user:
            found.append(f"it claims hub user {claimed_user}, but {owner.source} says {owner.name}")
        elif through_hub:
            found.append(f"it claims hub user {claimed_user}, but it runs as Unix user "
                         f"{owner.name}, whose server the hub is asked for")  # fmt: skip
    beacon_id, line_id = claimed.kernel_id, claimed.command_line_kernel_id
    if beacon_id and line_id and beacon_id != line_id:
        found.append(f"its beacon claims kernel id {beacon_id}, but its own command line "
                     f"names kernel-{line_id}.json")  # fmt: skip
    if claimed.server_pid is not None and not process.namespaced and ancestors:
        if claimed.server_pid not in ancestors:
            found.append(f"its JPY_PARENT_PID names PID {claimed.server_pid}, which is not one "
                         f"of its real ancestors ({', '.join(map(str, ancestors))})")  # fmt: skip
    return found
