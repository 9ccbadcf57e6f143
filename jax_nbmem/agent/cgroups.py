"""Which container a host process runs in: its cgroup path, read from the host's side.

The container runtimes name their cgroups after the container (cgroup v1 and v2 alike):

- Docker: ``/system.slice/docker-<id>.scope`` (systemd driver) or ``/docker/<id>`` (cgroupfs);
- containerd under Kubernetes: ``.../cri-containerd-<id>.scope``; CRI-O: ``.../crio-<id>.scope``
  (``.../pod<uid>/crio-<id>`` under the cgroupfs driver);
  Podman: ``.../libpod-<id>.scope`` or ``/libpod_parent/libpod-<id>``;
- a Kubernetes pod: ``kubepods-burstable-pod<uid>.slice`` (systemd spells the UID's dashes as
  underscores) or ``/kubepods/burstable/pod<uid>/<id>`` (cgroupfs driver).

Inside a container the path is useless (cgroup v2 runtimes give it a private cgroup
namespace: ``0::/``), so only the host's view is read. A shape never seen before is no
error: a 64-hex id found anywhere is kept with runtime ``unknown``; no id at all, no container.
The raw path is kept for the log either way.

Names: Docker's ``/var/lib/docker/containers/<id>/config.v2.json`` (its ``Name``; a container's
host name is its id, not its name); a pod's from the Kubernetes API when the agent has it
(:class:`~.kubepods.PodDirectory`: pod, namespace, container, hub user), else from Kubernetes'
log directories (``/var/log/pods/
<namespace>_<pod>_<uid>``, ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log``),
readable by root only; what cannot be read is said in ``name_reason``.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Container", "ContainerNames", "container_from_cgroup", "container_text", "named_fully"]

_ID = r"([0-9a-f]{64})"
# (runtime, pattern): the first that matches a path wins; the id is group 1.
_SCOPES = (
    ("docker", re.compile(rf"(?:^|/)docker-{_ID}\.scope(?:/|$)")),
    ("docker", re.compile(rf"(?:^|/)docker/{_ID}(?:/|$)")),
    ("containerd", re.compile(rf"(?:^|/)cri-containerd-{_ID}\.scope(?:/|$)")),
    ("crio", re.compile(rf"(?:^|/)crio-{_ID}\.scope(?:/|$)")),
    ("crio", re.compile(rf"(?:^|/)crio-{_ID}(?:/|$)")),  # CRI-O's cgroupfs driver: no .scope
    ("podman", re.compile(rf"(?:^|/)libpod-{_ID}\.scope(?:/|$)")),
    ("podman", re.compile(rf"(?:^|/)libpod_parent/libpod-{_ID}(?:/|$)")),
)
_POD_SLICE = re.compile(r"kubepods(?:-[a-z]+)*-pod([0-9a-f_]{32,36})\.slice(?:/|$)")
_POD_DIR = re.compile(rf"(?:^|/)kubepods/(?:[a-z]+/)?pod([0-9a-f-]{{32,36}})(?:/{_ID})?(?:/|$)")
_ANY_ID = re.compile(rf"(?<![0-9a-f]){_ID}(?![0-9a-f])")
_MAX_CONFIG_BYTES = 4 << 20
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

    def to_dict(self) -> dict:
        """The resolution's ``container`` object (contract), ``name_reason`` included."""
        return asdict(self)


def container_text(container: Any) -> str | None:
    """A process entry's ``container`` as a person reads it, or None (no container).

    ``container jupyter-bob``; in a pod ``container notebook in pod jhub/jupyter-alice`` (in
    Zero to JupyterHub every user's container is ``notebook``: the pod says whose it is).
    """
    if not isinstance(container, dict) or not (container.get("name") or container.get("id")):
        return None
    shown = f"container {container.get('name') or str(container['id'])[:12]}"
    if container.get("pod"):
        shown += f" in pod {container.get('namespace') or '?'}/{container['pod']}"
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
    for path in paths:
        match = _ANY_ID.search(path)
        if match:
            return Container(id=match.group(1), runtime="unknown"), path
    shown = next((p for p in paths if p != "/"), paths[0])
    return None, shown


def _known_shape(path: str) -> Container | None:
    pod_uid = None
    slice_match = _POD_SLICE.search(path)
    if slice_match:
        pod_uid = slice_match.group(1).replace("_", "-")
    dir_match = _POD_DIR.search(path)
    if dir_match and pod_uid is None:
        pod_uid = dir_match.group(1)
    for runtime, pattern in _SCOPES:
        match = pattern.search(path)
        if match:
            return Container(id=match.group(1), runtime=runtime, pod_uid=pod_uid)
    if dir_match and dir_match.group(2):
        return Container(id=dir_match.group(2), runtime="kubepods", pod_uid=pod_uid)
    if pod_uid is not None:  # the pod's own cgroup (a pause process, or a cgroup-less child)
        return Container(id=None, runtime="kubepods", pod_uid=pod_uid)
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
        pod_logs: str = "/var/log/pods",
        container_logs: str = "/var/log/containers",
        pods: Any = None,
    ) -> None:
        self.pods = pods
        self.docker_root = docker_root
        self.pod_logs = pod_logs
        self.container_logs = container_logs
        self._named: dict[tuple, tuple[float, Container]] = {}
        self._listings: dict[str, tuple[float, list[str] | str]] = {}

    def name(self, container: Container | None) -> Container | None:
        """``container`` with its name (and pod, namespace) filled in where the host says."""
        if container is None:
            return None
        key = (container.id, container.runtime, container.pod_uid)
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
        elif container.runtime == "docker" and container.id:
            fields.update(self._docker(container.id))
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

    def _docker(self, container_id: str) -> dict:
        path = os.path.join(self.docker_root, "containers", container_id, "config.v2.json")
        try:
            with open(path, "rb") as file:
                data = file.read(_MAX_CONFIG_BYTES + 1)
            if len(data) > _MAX_CONFIG_BYTES:
                return {"name_reason": f"{path} is over {_MAX_CONFIG_BYTES >> 20} MiB"}
            name = json.loads(data).get("Name")
        except OSError as error:
            return {"name_reason": f"cannot read {path}: {error.strerror or error}"}
        except (ValueError, AttributeError, RecursionError):
            return {"name_reason": f"{path} is not Docker's container config"}
        if not isinstance(name, str) or not name.strip("/"):
            return {"name_reason": f"{path} names no container"}
        return {"name": name.lstrip("/")}

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
