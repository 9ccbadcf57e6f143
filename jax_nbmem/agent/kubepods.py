"""The pods on this node, from the Kubernetes API: a pod UID's name, namespace and containers.

A process's cgroup path names its pod by UID only (:mod:`.cgroups`). The node agent asks the
API server for the pods on its node (``GET /api/v1/pods?fieldSelector=spec.nodeName=NODE``,
page by page), then watches them (``watch=1`` from the list's ``resourceVersion``), so a
lookup is a dictionary read and never waits for the network; a UID not known yet asks the
thread to list again (at most every ``relist_s`` seconds). A watch that ends is resumed, one
whose version is gone (410) listed again, and an error retried with backoff.

In a pod the agent uses the in-cluster configuration (:meth:`KubeAPI.in_cluster`):
``$KUBERNETES_SERVICE_HOST`` and ``_PORT``, the service account's token (read again at every
request: projected tokens rotate) and CA at ``/var/run/secrets/kubernetes.io/serviceaccount``.
Its role needs ``get``, ``list`` and ``watch`` on ``pods``. Plain ``http.client``: no client
library.

Faults are said, never raised: :meth:`PodDirectory.health` gives ``state`` (``ok``,
``starting``, ``unreachable``, ``refused``, ``error``) and ``reason``; names then come from the
kubelet's log directories where the host has them.

In Zero to JupyterHub every user's container is called ``notebook``: the pod's
``hub.jupyter.org/username`` annotation (KubeSpawner's) is kept as the pod's hub user.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

from jax_nbmem.text import printable

__all__ = [
    "KubeAPI",
    "KubeError",
    "NoPods",
    "Pod",
    "PodDirectory",
    "SERVICE_ACCOUNT",
    "pod_from",
]

log = logging.getLogger("jax_nbmem")

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
HUB_USER_ANNOTATION = "hub.jupyter.org/username"
_MAX_BODY = 64 << 20
_MAX_EVENT = 4 << 20
_PAGE = 500


class KubeError(Exception):
    """The API could not be asked; ``state`` is ``unreachable``, ``refused`` or ``error``."""

    def __init__(self, state: str, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.state, self.reason, self.code = state, reason, code


@dataclass(frozen=True)
class Pod:
    """One pod: ``containers`` maps a runtime's container id (64 hex digits) to its name."""

    uid: str
    name: str
    namespace: str
    containers: Mapping[str, str] = field(default_factory=dict)
    hub_user: str | None = None


def _text(value: Any, limit: int = 253) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= limit else None


def pod_from(item: Any) -> Pod | None:
    """A :class:`Pod` from the API's pod object; None when it is not one."""
    if not isinstance(item, dict) or not isinstance(item.get("metadata"), dict):
        return None
    meta = item["metadata"]
    uid, name, namespace = (
        _text(meta.get("uid"), 64),
        _text(meta.get("name")),
        _text(meta.get("namespace"), 63),
    )
    if not (uid and name and namespace):
        return None
    containers = {}
    status = item.get("status") if isinstance(item.get("status"), dict) else {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for entry in status.get(key) or ():
            if not isinstance(entry, dict):
                continue
            # "containerd://<id>", "cri-o://<id>", "docker://<id>"
            runtime_id = (_text(entry.get("containerID"), 200) or "").rpartition("://")[2]
            if runtime_id and _text(entry.get("name")):
                containers[runtime_id] = entry["name"]
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    return Pod(uid, name, namespace, containers, _text(annotations.get(HUB_USER_ANNOTATION)))


class KubeAPI:
    """The API server at ``base_url`` (``https://host:port``), with a bearer token file."""

    def __init__(
        self,
        base_url: str,
        *,
        token_file: str | None = None,
        ca_file: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the Kubernetes API's address is no http(s) URL: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout_s = timeout_s

    @classmethod
    def in_cluster(
        cls,
        environ: Mapping[str, str] | None = None,
        service_account: str = SERVICE_ACCOUNT,
        **kwargs: Any,
    ) -> KubeAPI:
        """The API as a pod reaches it; KubeError (``off``) outside a cluster."""
        environ = os.environ if environ is None else environ
        host = environ.get("KUBERNETES_SERVICE_HOST", "").strip()
        port = environ.get("KUBERNETES_SERVICE_PORT", "443").strip() or "443"
        if not host:
            raise KubeError("off", "not in a Kubernetes pod (no $KUBERNETES_SERVICE_HOST)")
        host = f"[{host}]" if ":" in host else host
        return cls(
            f"https://{host}:{port}",
            token_file=os.path.join(service_account, "token"),
            ca_file=os.path.join(service_account, "ca.crt"),
            **kwargs,
        )

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "http":
            return http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as error:
            raise KubeError(
                "error", f"the API's CA {self.ca_file} is unreadable: {error}"
            ) from None
        return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=context)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "jax-nbmem-agent"}
        if self.token_file:
            try:
                with open(self.token_file, encoding="ascii") as file:
                    token = file.read(64 << 10).strip()
            except (OSError, ValueError) as error:
                why = getattr(error, "strerror", None) or error
                raise KubeError(
                    "error", f"the token {self.token_file} is unreadable: {why}"
                ) from None
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _open(self, path: str, query: Mapping[str, Any], timeout: float):
        connection = self._connection(timeout)
        target = f"{path}?{urlencode(query)}" if query else path
        try:
            connection.request("GET", target, headers=self._headers())
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            why = getattr(error, "strerror", None) or str(error) or type(error).__name__
            raise KubeError("unreachable", f"the Kubernetes API at {self.base_url} did not "
                            f"answer: {why}") from None  # fmt: skip
        if response.status != 200:
            body = response.read(64 << 10)
            connection.close()
            raise _refusal(response.status, response.reason, body)
        return connection, response

    def get(self, path: str, query: Mapping[str, Any] | None = None) -> dict:
        """The JSON object at ``path``; KubeError when not answered or refused."""
        connection, response = self._open(path, query or {}, self.timeout_s)
        try:
            body = response.read(_MAX_BODY + 1)
        except (OSError, http.client.HTTPException) as error:
            raise KubeError(
                "unreachable", f"the Kubernetes API's answer broke off: {error}"
            ) from None
        finally:
            connection.close()
        if len(body) > _MAX_BODY:
            raise KubeError("error", f"the Kubernetes API's answer is over {_MAX_BODY >> 20} MiB")
        try:
            found = json.loads(body)
        except ValueError:
            found = None
        if not isinstance(found, dict):
            raise KubeError("error", "the Kubernetes API's answer is not a JSON object")
        return found

    def watch(
        self, path: str, query: Mapping[str, Any], idle_s: float, stop: threading.Event
    ) -> Iterator[dict]:
        """The watch's events (JSON objects) until it ends, ``stop`` is set or ``idle_s`` pass."""
        connection, response = self._open(path, {**query, "watch": "1"}, idle_s)
        try:
            while not stop.is_set():
                try:
                    line = response.readline(_MAX_EVENT + 1)
                except TimeoutError:
                    return  # quiet for idle_s: made again by the caller
                except (OSError, http.client.HTTPException) as error:
                    raise KubeError("unreachable", f"the pods' watch broke off: {error}") from None
                if not line:
                    return
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
                if isinstance(event, dict):
                    yield event
        finally:
            connection.close()


def _refusal(status: int, reason: str, body: bytes) -> KubeError:
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    said = f"{status} {reason}" + (f": {str(message)[:300]}" if message else "")
    if status in (401, 403):
        why = (f"the Kubernetes API refused to list pods ({said}); the agent's service account "
               "needs get, list and watch on pods")  # fmt: skip
        return KubeError("refused", why, status)
    return KubeError("error", f"the Kubernetes API answered {said}", status)


class PodDirectory:
    """The pods on node ``node``, kept current by a daemon thread (see the module)."""

    def __init__(
        self,
        api: KubeAPI,
        node: str,
        *,
        relist_s: float = 10.0,
        resync_s: float = 600.0,
        idle_s: float = 300.0,
    ) -> None:
        if not node:
            raise ValueError("the node's name is needed (--node-name or $JAX_NBMEM_NODE_NAME)")
        self.api, self.node = api, node
        self.relist_s, self.resync_s, self.idle_s = relist_s, resync_s, idle_s
        self._pods: dict[str, Pod] = {}
        self._state, self._reason = "starting", "the pods on this node are being listed"
        self._listed_at: float | None = None
        self._wanted = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lists = 0

    def start(self) -> None:
        """Start the thread (a running one is reused)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="jax-nbmem-pods", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (a watch under way ends at its next event); a second call is a no-op."""
        self._stop.set()
        self._wanted.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(1.0)

    def lookup(self, uid: str | None) -> Pod | None:
        """The pod of ``uid`` if known now; an unknown one asks for a new list. Never waits."""
        if not uid:
            return None
        found = self._pods.get(uid)
        if found is None:
            self._wanted.set()
        return found

    def health(self) -> dict:
        """``state``, ``reason`` (None when ok), ``pods`` known, ``listed_at``, ``node``."""
        return {"state": self._state, "reason": self._reason, "pods": len(self._pods),
                "listed_at": self._listed_at, "node": self.node}  # fmt: skip

    @property
    def _path(self) -> str:
        return "/api/v1/pods"

    def _query(self) -> dict:
        return {"fieldSelector": f"spec.nodeName={self.node}"}

    def list_now(self) -> str:
        """List the node's pods (page by page) and keep them; the list's resourceVersion."""
        pods: dict[str, Pod] = {}
        token, version = None, ""
        for _ in range(1000):
            query = {**self._query(), "limit": _PAGE, **({"continue": token} if token else {})}
            page = self.api.get(self._path, query)
            for item in page.get("items") or ():
                pod = pod_from(item)
                if pod is not None:
                    pods[pod.uid] = pod
            meta = page.get("metadata") if isinstance(page.get("metadata"), dict) else {}
            version = str(meta.get("resourceVersion") or version)
            token = meta.get("continue")
            if not token:
                break
        self._pods = pods
        self._listed_at = time.time()
        self.lists += 1
        self._state, self._reason = "ok", None
        return version

    def _event(self, event: dict) -> str | None:
        """Apply a watch event; the version it brings (None: the watch must list again)."""
        kind, item = event.get("type"), event.get("object")
        if kind == "ERROR":
            return None  # 410 Gone and the like: list again
        meta = item.get("metadata") if isinstance(item, dict) else None
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            pod = pod_from(item)
            if pod is not None:
                pods = dict(self._pods)
                if kind == "DELETED":
                    pods.pop(pod.uid, None)
                else:
                    pods[pod.uid] = pod
                self._pods = pods  # replaced whole: readers on other threads see one or the other
        return str(version) if version else ""

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                version = self.list_now()
                backoff = 1.0
                self._watch(version)
            except KubeError as error:
                self._state, self._reason = error.state, error.reason
                log.warning("jax-nbmem agent: pods unknown: %s", printable(error.reason))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)
            except Exception as error:  # never the thread's end
                self._state, self._reason = "error", f"{type(error).__name__}: {error}"
                log.warning("jax-nbmem agent: the pods' thread failed", exc_info=True)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 60.0)

    def _watch(self, version: str) -> None:
        listed = time.monotonic()
        self._wanted.clear()
        while not self._stop.is_set() and time.monotonic() - listed < self.resync_s:
            query = {**self._query(), "allowWatchBookmarks": "true",
                     "timeoutSeconds": int(self.idle_s)}  # fmt: skip
            if version:
                query["resourceVersion"] = version
            for event in self.api.watch(self._path, query, self.idle_s + 10, self._stop):
                found = self._event(event)
                if found is None:
                    return  # list again
                version = found or version
                if self._wanted.is_set() and time.monotonic() - listed >= self.relist_s:
                    return  # an unknown UID was asked about: list again
            if self._wanted.is_set():
                self._stop.wait(max(0.0, self.relist_s - (time.monotonic() - listed)))
                return


class NoPods:
    """A pods' directory that cannot be: nothing is named, and ``health`` says why."""

    def __init__(self, state: str, reason: str) -> None:
        self.state, self.reason = state, reason

    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""

    def lookup(self, uid: str | None) -> None:
        """No pod is known."""
        return None

    def health(self) -> dict:
        """Its state and reason, as :meth:`PodDirectory.health` says them."""
        return {"state": self.state, "reason": self.reason, "pods": 0, "listed_at": None,
                "node": None}  # fmt: skip
