"""Which container a host process runs in: its cgroup path, read from the host's side.

A container is read only from where its runtime puts containers (cgroup v1 and v2 alike),
each shape anchored at the top of the hierarchy:

- Docker: ``/system.slice/docker-<id>.scope`` (systemd driver) or ``/docker/<id>`` (cgroupfs);
- Podman: ``/machine.slice/libpod-<id>.scope`` (in a pod: ``/machine.slice/
  machine-libpod_pod_<pod>.slice/libpod-<id>.scope``) or ``/libpod_parent/libpod-<id>``
  (cgroupfs);
- a Kubernetes pod: ``/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid>.slice``
  (systemd spells the UID's dashes as underscores) or ``/kubepods[/<qos>]/pod<uid>``
  (cgroupfs), and in it containerd's ``cri-containerd-<id>.scope``, CRI-O's ``crio-<id>[.scope]``
  or a bare ``<id>`` (cgroupfs: the runtime is not in the path, ``kubepods``);
- a rootless container (Podman's ``libpod-<id>.scope``, Docker's ``docker-<id>.scope``)
  anywhere in ``/user.slice/user-<uid>.slice/user@<uid>.service/``: systemd delegates that
  subtree to its user, so what is found there is that uid's own container
  (``rootless_uid``), never another user's and never a pod.

A cgroup below a container's own is that container's (a runtime nested in it names nothing).
The DaemonSet's agent reads from a private cgroup namespace: other pods' paths are relative
(``/../../kubepods-burstable.slice/…``) and may start below ``kubepods``. Inside a container
the path is useless (``0::/``), so only the host's view is read. Any other shape, an id
found elsewhere included, is no container; the raw path is kept for the log either way.

Names (:mod:`.stores`): Docker's ``config.v2.json`` and Podman's ``containers.json`` (a
rootless runtime's, in its user's home, is that user's claim); a pod's from the Kubernetes API
when the agent has it (:class:`~.kubepods.PodDirectory`: pod, namespace, container, hub user),
else from Kubernetes' log directories (``/var/log/pods/<namespace>_<pod>_<uid>``,
``/var/log/containers/<pod>_<namespace>_<container>-<id>.log``), readable by root only; what
cannot be read is said in ``name_reason``.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

from jax_nbmem.agent.stores import PODMAN_ROOT, docker_name, podman_name, rootless_home

__all__ = [
    "Container",
    "ContainerNames",
    "container_from_cgroup",
    "container_text",
    "named_fully",
]

# A process entry's ``container`` in public output (status JSON, the server's API).

_HEX = "[0-9a-f]{64}"
# Each runtime's own cgroup for a container, one path component; the id is group 1.
_DOCKER_SCOPE = re.compile(rf"docker-({_HEX})\.scope")
_LIBPOD_SCOPE = re.compile(rf"libpod-({_HEX})\.scope")
_BARE_ID = re.compile(f"({_HEX})")
_LIBPOD_DIR = re.compile(f"libpod-({_HEX})")
# Below a pod's cgroup (the kubelet's): the container's, per runtime and driver.
_IN_POD = (
    ("containerd", re.compile(rf"cri-containerd-({_HEX})\.scope")),
    ("crio", re.compile(rf"crio-({_HEX})(?:\.scope)?")),  # CRI-O's cgroupfs driver: no .scope
    ("docker", _DOCKER_SCOPE),  # dockershim, systemd driver
    ("kubepods", _BARE_ID),  # the cgroupfs driver: the runtime is not in the path
)
_QOS = ("burstable", "besteffort")
_POD_SLICE = re.compile(r"kubepods(?:-(?:burstable|besteffort))?-pod([0-9a-f_]{36})\.slice")
_POD_DIR = re.compile(r"pod([0-9a-f-]{36})")
_USER_SLICE = re.compile(r"user-([0-9]{1,10})\.slice")
_USER_SERVICE = re.compile(r"user@([0-9]{1,10})\.service")
_NAMES_MAX = 4096
_LISTING_EVERY_S = 5.0


def named_fully(container: Container) -> bool:
    """Whether all there is to name is named (no need to look again)."""
    return bool(container.name) and (container.pod_uid is None or bool(container.pod))


@dataclass(frozen=True)
class Container:
    """A container as the host knows it; None fields are not known (``name_reason``: why).

    ``runtime``: docker, containerd, crio, podman, kubepods (a pod's cgroup under the cgroupfs
    driver: the runtime is not in the path) or unknown.
    """

    id: str | None
    runtime: str
    name: str | None = None
    pod_uid: str | None = None
    pod: str | None = None
    namespace: str | None = None
    name_reason: str | None = None
    hub_user: str | None = None  # a pod's hub.jupyter.org/username annotation (KubeSpawner's)
    # A rootless container's host uid (its cgroup is in that user's delegated subtree): the
    # container is that user's, and its name that user's claim. None: a rootful runtime's.
    rootless_uid: int | None = None

    def to_dict(self) -> dict:
        """The resolution's ``container`` object (contract), ``name_reason`` included."""
        return asdict(self)


def container_text(container: Any, claimed_hostname: Any = None) -> str | None:
    """A process entry's ``container`` as a person reads it, or None (no container).

    ``container jupyter-bob``; in a pod ``container notebook in pod jhub/jupyter-alice`` (in
    Zero to JupyterHub every user's container is ``notebook``: the pod says whose it is).
    Where no runtime records it, the entry's ``container_hostname_claimed`` (*claimed_hostname*,
    its kernel's word): ``container with host name box (its own claim)``.
    """
    if not isinstance(container, dict) or not (container.get("name") or container.get("id")):
        if isinstance(claimed_hostname, str) and claimed_hostname:
            return f"container with host name {claimed_hostname} (its own claim)"
        return None
    shown = f"container {container.get('name') or str(container['id'])[:12]}"
    if container.get("pod"):
        shown += f" in pod {container.get('namespace') or '?'}/{container['pod']}"
    owner = container.get("rootless_uid")
    if isinstance(owner, int) and not isinstance(owner, bool):
        shown += f" (rootless, uid {owner}'s; its name is that user's claim)"
    elif not container.get("name") and container.get("name_reason"):
        shown += f" (unnamed: {container['name_reason']})"
    return shown


def container_from_cgroup(text: str) -> tuple[Container | None, str]:
    """The container named by ``/proc/PID/cgroup``'s content, and the path it was read from.

    Never raises: a malformed line is skipped; ``(None, path)`` when no path names a container.
    """
    paths = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2]:
            # cgroup v2's unified line first: it is the one the runtimes manage today.
            paths.insert(0 if parts[0] == "0" else len(paths), parts[2])
    if not paths:
        return None, ""
    for path in paths:
        found = _known_shape(path)
        if found is not None:
            return found, path
    shown = next((p for p in paths if p != "/"), paths[0])
    return None, shown


def _known_shape(path: str) -> Container | None:
    """The container of one cgroup path, read only from where its runtime puts containers.

    Each runtime's parent is anchored at the top of the hierarchy; a cgroup below a
    container's own (systemd in a container, a nested runtime) is that container's. A path
    relative to the reader's cgroup namespace (``/../../…``: the agent in a pod) starts at a
    child of the common ancestor, which no user can write, so it may also start at a pod's
    levels below ``kubepods``.
    """
    parts = [part for part in path.split("/") if part]
    relative = bool(parts) and parts[0] == ".."
    while parts and parts[0] == "..":
        parts.pop(0)
    if not parts:
        return None
    top, rest = parts[0], parts[1:]
    if top == "user.slice":
        return _rootless(rest)
    if top == "system.slice":  # Docker's systemd driver
        return _runtime_child("docker", _DOCKER_SCOPE, rest)
    if top == "docker":  # Docker's cgroupfs driver
        return _runtime_child("docker", _BARE_ID, rest)
    if top == "machine.slice":  # Podman's systemd driver (a pod's containers one level down)
        if rest and rest[0].startswith("machine-libpod_pod_") and rest[0].endswith(".slice"):
            rest = rest[1:]
        return _runtime_child("podman", _LIBPOD_SCOPE, rest)
    if top == "libpod_parent":  # Podman's cgroupfs driver
        if rest and _BARE_ID.fullmatch(rest[0]):  # a pod's own cgroup, then its containers
            rest = rest[1:]
        return _runtime_child("podman", _LIBPOD_DIR, rest)
    if top == "kubepods.slice":
        return _pod_systemd(rest)
    if top == "kubepods":
        return _pod_cgroupfs(rest)
    if relative:  # the agent's own pod is under kubepods: the path may start below it
        return _pod_systemd(parts) or _pod_cgroupfs(parts)
    return None


def _runtime_child(runtime: str, pattern: re.Pattern, rest: list[str]) -> Container | None:
    match = pattern.fullmatch(rest[0]) if rest else None
    return Container(id=match.group(1), runtime=runtime) if match else None


def _pod_systemd(parts: list[str]) -> Container | None:
    """``[kubepods-<qos>.slice/]kubepods[-<qos>]-pod<uid>.slice[/<container>]``."""
    if parts and parts[0] in {f"kubepods-{qos}.slice" for qos in _QOS}:
        qos = parts[0][len("kubepods-") : -len(".slice")]
        parts = parts[1:]
        if not parts or not parts[0].startswith(f"kubepods-{qos}-pod"):
            return None
    match = _POD_SLICE.fullmatch(parts[0]) if parts else None
    if match is None:
        return None
    return _in_pod(match.group(1).replace("_", "-"), parts[1:])


def _pod_cgroupfs(parts: list[str]) -> Container | None:
    """``[<qos>/]pod<uid>[/<container>]``."""
    if parts and parts[0] in _QOS:
        parts = parts[1:]
    match = _POD_DIR.fullmatch(parts[0]) if parts else None
    return _in_pod(match.group(1), parts[1:]) if match else None


def _in_pod(pod_uid: str, rest: list[str]) -> Container:
    for runtime, pattern in _IN_POD:
        match = pattern.fullmatch(rest[0]) if rest else None
        if match:
            return Container(id=match.group(1), runtime=runtime, pod_uid=pod_uid)
    # The pod's own cgroup (a pause process, a cgroup-less child) or a sandbox's conmon.
    return Container(id=None, runtime="kubepods", pod_uid=pod_uid)


def _rootless(parts: list[str]) -> Container | None:
    """A rootless container in ``user-<uid>.slice/user@<uid>.service/…``: that uid's own.

    Systemd delegates ``user@<uid>.service`` to its user, who may make any cgroup there, named
    as any runtime names its own: a container found there is that uid's, never another user's
    and never a pod; its name is that user's claim (see :class:`ContainerNames`).
    """
    slice_match = _USER_SLICE.fullmatch(parts[0]) if parts else None
    service = _USER_SERVICE.fullmatch(parts[1]) if len(parts) > 1 else None
    if not slice_match or not service or slice_match.group(1) != service.group(1):
        return None
    for part in parts[2:]:
        for runtime, pattern in (("podman", _LIBPOD_SCOPE), ("docker", _DOCKER_SCOPE)):
            match = pattern.fullmatch(part)
            if match:
                return Container(match.group(1), runtime, rootless_uid=int(service.group(1)))
    return None


class ContainerNames:
    """Names containers from what the host keeps about them; cached by id (bounded).

    ``docker_root`` is Docker's data root, ``pod_logs`` and ``container_logs`` the kubelet's
    log directories; ``pods`` (a :class:`~.kubepods.PodDirectory`, or anything with its
    ``lookup(uid)`` and ``health()``) names pods from the Kubernetes API first. A name found is
    kept; a missing one is asked again after a few seconds (a container just started may not
    have written its config yet, a pod just made may not be listed yet).
    """

    def __init__(
        self,
        docker_root: str = "/var/lib/docker",
        podman_root: str = PODMAN_ROOT,
        pod_logs: str = "/var/log/pods",
        container_logs: str = "/var/log/containers",
        pods: Any = None,
    ) -> None:
        self.pods = pods
        self.docker_root = docker_root
        self.podman_root = podman_root
        self.pod_logs = pod_logs
        self.container_logs = container_logs
        self._named: dict[tuple, tuple[float, Container]] = {}
        self._listings: dict[str, tuple[float, list[str] | str]] = {}

    def name(self, container: Container | None) -> Container | None:
        """``container`` with its name (and pod, namespace) filled in where the host says."""
        if container is None:
            return None
        # Keyed by all that decides the name: a rootless cgroup of the same id (a user's own
        # ``docker-<id>.scope`` under her delegated subtree) is named from her store, never
        # from root's name of that id, nor root's cgroup from hers.
        key = (container.id, container.runtime, container.pod_uid, container.rootless_uid)
        now = time.monotonic()
        cached = self._named.get(key)
        if cached is not None and (named_fully(cached[1]) or now - cached[0] < _LISTING_EVERY_S):
            return cached[1]
        named = self._look_up(container)
        if len(self._named) >= _NAMES_MAX:
            self._named.clear()
        self._named[key] = (now, named)
        return named

    def _look_up(self, container: Container) -> Container:
        fields: dict = {}
        if container.pod_uid and self.pods is not None:
            fields.update(self._from_api(container))
        if container.pod_uid and not fields.get("pod"):
            said = fields.get("name_reason")
            fields.update(self._pod(container.pod_uid))
            if said and not fields.get("pod"):
                fields["name_reason"] = said  # the API's reason first: the log folder's is moot
        if fields.get("name"):
            pass
        elif container.runtime in ("docker", "podman") and container.id:
            fields.update(self._runtime_store(container))
        elif container.id and container.pod_uid:
            named = self._kubernetes_container(container.id)
            if named.get("name") or not fields.get("name_reason"):
                fields.update(named)
        elif not fields.get("name_reason"):
            fields["name_reason"] = f"names of {container.runtime} containers are not read"
        if fields.get("name"):
            fields["name_reason"] = None
        return Container(**{**asdict(container), **fields})

    def _from_api(self, container: Container) -> dict:
        """Pod, namespace, hub user and container name from the Kubernetes API's pods."""
        try:
            pod = self.pods.lookup(container.pod_uid)
            if pod is None:
                health = self.pods.health()
        except Exception as error:  # a directory's fault names nothing, never raises
            return {"name_reason": f"the pods' directory failed: {error}"}
        if pod is None:
            why = health.get("reason") or f"pod {container.pod_uid} is not on this node's list"
            return {"name_reason": f"pod names unknown: {why}"}
        fields = {"pod": pod.name, "namespace": pod.namespace, "hub_user": pod.hub_user}
        name = pod.containers.get(container.id) if container.id else None
        if name:
            fields["name"] = name
        elif container.id:
            fields["name_reason"] = f"container {container.id[:12]} not yet in pod {pod.name}"
        return fields

    def _runtime_store(self, container: Container) -> dict:
        """The name Docker's or Podman's store records: root's, or a rootless user's claim."""
        owner = container.rootless_uid
        if owner is None:
            if container.runtime == "docker":
                return docker_name(self.docker_root, container.id)
            return podman_name(self.podman_root, container.id)
        home = rootless_home(owner)
        if home is None:
            return {"name_reason": f"uid {owner} has no home here: its rootless store is unknown"}
        if container.runtime == "docker":
            return docker_name(os.path.join(home, ".local/share/docker"), container.id, owner)
        return podman_name(os.path.join(home, ".local/share/containers/storage"), container.id,
                           owner)  # fmt: skip

    def _pod(self, pod_uid: str) -> dict:
        names = self._listing(self.pod_logs)
        if isinstance(names, str):
            return {"name_reason": names}
        for entry in names:  # <namespace>_<pod>_<uid>
            namespace, _, rest = entry.partition("_")
            pod, _, uid = rest.rpartition("_")
            if uid == pod_uid and namespace and pod:
                return {"pod": pod, "namespace": namespace}
        return {"name_reason": f"pod {pod_uid} not in {self.pod_logs}"}

    def _kubernetes_container(self, container_id: str) -> dict:
        names = self._listing(self.container_logs)
        if isinstance(names, str):
            return {"name_reason": names}
        suffix = f"-{container_id}.log"
        for entry in names:  # <pod>_<namespace>_<container>-<id>.log
            if entry.endswith(suffix):
                container = entry[: -len(suffix)].rpartition("_")[2]
                if container:
                    return {"name": container}
        return {"name_reason": f"container {container_id[:12]} not in {self.container_logs}"}

    def _listing(self, directory: str) -> list[str] | str:
        """The names in ``directory`` (listed at most every few seconds), or why not."""
        now = time.monotonic()
        cached = self._listings.get(directory)
        if cached is not None and now - cached[0] < _LISTING_EVERY_S:
            return cached[1]
        try:
            found: list[str] | str = os.listdir(directory)[:65536]
        except OSError as error:
            found = f"cannot list {directory}: {error.strerror or error}"
        self._listings[directory] = (now, found)
        return found
