"""A stand-in Kubernetes API server for tests: the pods of a node, list and watch.

It answers what the node agent asks (``GET /api/v1/pods`` with ``fieldSelector``, ``limit``,
``continue``; ``watch=1`` streams one JSON event a line) and can refuse (403 with a Status),
answer garbage, or be told to end a watch. Requests are recorded.
"""

from __future__ import annotations

import json
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

TOKEN = "sa-token-1"
NODE = "gpu-node-1"


def pod(uid, name, namespace, containers=(), *, node=NODE, hub_user=None, version="1"):
    """A pod object as the API gives it; ``containers``: (name, "containerd://<id>") pairs."""
    meta = {"uid": uid, "name": name, "namespace": namespace, "resourceVersion": version}
    if hub_user:
        meta["annotations"] = {"hub.jupyter.org/username": hub_user}
    return {
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {"containerStatuses": [{"name": n, "containerID": c} for n, c in containers]},
    }


class KubeStandIn:
    """The server; ``pods`` on its node, ``mode`` ``ok``, ``refuse`` or ``garbage``."""

    def __init__(self, pods=(), page=2):
        self.pods = list(pods)
        self.page = page
        self.mode = "ok"
        self.token = TOKEN
        self.requests: list[tuple[str, dict]] = []
        self.watchers: list[queue.Queue] = []
        self._lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 (the base's name)
                stand_in.handle(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.send_event(None)
        self.server.shutdown()
        self.server.server_close()

    def push(self, kind: str, item: dict) -> None:
        """A change to the node's pods: kept for the next list, and sent to the watch."""
        uid = item["metadata"]["uid"]
        self.pods = [p for p in self.pods if p["metadata"]["uid"] != uid]
        if kind != "DELETED":
            self.pods.append(item)
        self.send_event({"type": kind, "object": item})

    def send_event(self, event) -> None:
        """An event to every watch open now (None: end them)."""
        with self._lock:
            for watcher in self.watchers:
                watcher.put(event)

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(request.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        self.requests.append((parts.path, query))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._send(request, 401, {"kind": "Status", "message": "Unauthorized"})
        if self.mode == "refuse":
            message = ('pods is forbidden: User "system:serviceaccount:jax-nbmem:agent" cannot '
                       'list resource "pods" in API group "" at the cluster scope')  # fmt: skip
            return self._send(request, 403, {"kind": "Status", "message": message})
        if self.mode == "garbage":
            return self._send(request, 200, None, raw=b"<html>proxy error</html>")
        if parts.path != "/api/v1/pods":
            return self._send(request, 404, {"kind": "Status", "message": "not found"})
        node = query.get("fieldSelector", "").removeprefix("spec.nodeName=")
        mine = [p for p in self.pods if p["spec"]["nodeName"] == node]
        if query.get("watch") == "1":
            return self._watch(request)
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or len(mine) or 1)
        limit = min(limit, self.page)
        items = mine[start : start + limit]
        meta = {"resourceVersion": "100"}
        if start + limit < len(mine):
            meta["continue"] = str(start + limit)
        self._send(request, 200, {"kind": "PodList", "metadata": meta, "items": items})

    def _send(self, request, status, body, raw=None):
        data = raw if raw is not None else json.dumps(body).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def _watch(self, request) -> None:
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Transfer-Encoding", "chunked")
        request.end_headers()
        mine: queue.Queue = queue.Queue()
        with self._lock:
            self.watchers.append(mine)
        try:
            while True:
                event = mine.get()
                if event is None:
                    request.wfile.write(b"0\r\n\r\n")
                    request.wfile.flush()
                    request.close_connection = True
                    return
                line = json.dumps(event).encode() + b"\n"
                request.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                request.wfile.flush()
        except OSError:
            request.close_connection = True  # the watcher went away
        finally:
            with self._lock:
                self.watchers.remove(mine)
