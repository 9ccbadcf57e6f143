"""A node shared by bob and mallory (real Unix users), their servers and a stand-in hub.

Needs root (it creates the users and runs their servers as them); CI runs the suite as root.
Each user's stand-in Jupyter server (:mod:`tests.hostile.standin_server`) runs as that user
with kernels as its children; every ``DELETE api/kernels/<id>`` a server receives is written
to its ``deletes`` file, so a test sees exactly which kernels anyone asked it to stop. The
stand-in hub (:class:`StandInHub`) answers what ``jax-nbmem`` asks a JupyterHub (a user's
server, through the proxy: its kernels' list and their shutdown) and records each request.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.users import User, add_user, python_for, remove_user

STANDIN = Path(__file__).with_name("standin_server.py")
HUB_TOKEN = secrets.token_hex(16)


@dataclass
class StandInServer:
    """One user's running stand-in server: its PID, port, token and kernels (id -> PID)."""

    user: User
    process: subprocess.Popen = field(repr=False)
    pid: int
    port: int
    token: str = field(repr=False)
    kernels: dict[str, int]
    deletes_file: Path
    requests_file: Path | None = None

    def deletes(self) -> list[str]:
        """The kernel ids this server was asked to shut down, in order."""
        text = self.deletes_file.read_text() if self.deletes_file.exists() else ""
        return text.split()

    def requests(self) -> list[str]:
        """Every request this server received, ``METHOD PATH``, in order."""
        text = self.requests_file.read_text() if self.requests_file else ""
        return text.splitlines()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(20)


@dataclass
class Node:
    """Bob and mallory on one host, a Python both can run, a shared beacon directory."""

    bob: User
    mallory: User
    python: str
    env: dict
    share: Path
    folder: Path
    servers: list[StandInServer] = field(default_factory=list)

    def server(self, user: User, kernels: list[dict], **hostile) -> StandInServer:
        """Start ``user``'s stand-in server with ``kernels``; ``hostile``: what else it does.

        See standin_server.py for both; every request it receives is kept (``requests()``).
        ``netns=True``: it runs in a network namespace of its own (its loopback up), as any
        user can make one with an unprivileged user namespace.
        """
        netns = hostile.pop("netns", False)
        deletes, requests = (self.folder / f"{what}-{user.name}-{secrets.token_hex(4)}"
                             for what in ("deletes", "requests"))  # fmt: skip
        for path in (deletes, requests):
            path.touch()
            os.chown(path, user.uid, user.gid)
        token = secrets.token_hex(16)
        config = {"token": token, "deletes": str(deletes), "share": str(self.share),
                  "kernels": kernels, "requests": str(requests), **hostile}  # fmt: skip
        env = {**self.env, "HOME": str(user.home), "USER": user.name}
        env.pop("JUPYTER_RUNTIME_DIR", None)
        argv = [self.python, str(STANDIN), json.dumps(config)]
        if netns:  # made by root here, then the server drops to the user, as before
            argv = ["unshare", "--net", "sh", "-c", 'ip link set lo up && u=$0 g=$1 && shift '
                    '&& exec setpriv --reuid="$u" --regid="$g" --clear-groups "$@"',
                    str(user.uid), str(user.gid), *argv]  # fmt: skip
        as_user = {} if netns else {"user": user.uid, "group": user.gid, "extra_groups": []}
        process = subprocess.Popen(argv, env=env, cwd=user.home, stdout=subprocess.PIPE,
                                   text=True, **as_user)  # fmt: skip
        said = json.loads(process.stdout.readline() or "null")
        assert said, f"{user.name}'s stand-in server did not start"
        started = StandInServer(user, process, said["pid"], said["port"], token,
                                said["kernels"], deletes, requests)  # fmt: skip
        self.servers.append(started)
        return started


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    if os.geteuid() != 0:
        # A skip that says why; under CI, which runs as root, it would fail the run (skips.py).
        pytest.skip("the hostile-user tests run as root (they create Unix users)")
    # Not under pytest's own temporary folder (0700 root's): bob and mallory run from here.
    folder = Path(tempfile.mkdtemp(prefix="jnm-hostile-"))
    folder.chmod(0o755)
    share = folder / "share"
    share.mkdir()
    share.chmod(0o1777)
    bob, mallory = add_user("jnmbob"), add_user("jnmmal")
    try:
        python, env = python_for(bob, folder, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        yield Node(bob, mallory, python, env, share, folder)
    finally:
        for user in (bob, mallory):
            remove_user(user)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def servers(node: Node) -> Iterator[Node]:
    """The node, its servers stopped and its beacons removed after the test."""
    try:
        yield node
    finally:
        for server in node.servers:
            server.stop()
        node.servers.clear()
        for beacon in node.share.glob("jax_nbmem-*"):
            beacon.unlink()


class StandInHub:
    """What ``jax-nbmem`` asks a hub: its API (``hub/api/...``) and users' servers (``user/NAME/``).

    ``servers`` maps hub user names to their stand-in servers. The API takes :data:`HUB_TOKEN`
    (an administrator's: ``read:servers``, ``tokens`` and ``access:servers``, so that what a
    client sends a user's server is the client's choice): ``GET users/NAME``, ``POST
    users/NAME/tokens`` (a token for NAME's server alone, as JupyterHub issues one for the
    scope ``access:servers!server=NAME/``), ``DELETE users/NAME/tokens/ID``. The proxy's part,
    ``user/NAME/api/kernels...``, takes such a token or the administrator's and streams the
    server's answer as it comes (a redirect too), as configurable-http-proxy does. Every
    request is recorded in ``requests`` as (method, path); ``presented`` says which credential
    each request to a user's server carried ("hub", "server:NAME" or "none"), and ``timeline``
    when each such exchange began and ended (monotonic seconds).
    """

    def __init__(self, servers: dict[str, StandInServer]) -> None:
        self.servers = servers
        self.requests: list[tuple[str, str]] = []
        self.presented: list[tuple[str, str]] = []
        self.timeline: list[tuple[str, str, float, float]] = []  # method, path, began, ended
        self.issued: dict[str, str] = {}  # token -> the hub user whose server it may call
        self.revoked: list[str] = []
        self._ids: dict[str, str] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                hub._answer(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                hub._answer(self, "POST")

            def do_DELETE(self) -> None:  # noqa: N802
                hub._answer(self, "DELETE")

            def log_message(self, *args) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def deletes(self) -> list[str]:
        return [path for method, path in self.requests if method == "DELETE"
                and path.startswith("/user/")]  # fmt: skip

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        self.requests.append((method, handler.path))
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        parts = handler.path.strip("/").split("/")
        token = (handler.headers.get("Authorization") or "").removeprefix("token ")
        if parts[:1] == ["user"] and len(parts) >= 4 and parts[2:4] == ["api", "kernels"]:
            return self._proxied(handler, method, parts, token)
        if token != HUB_TOKEN:
            return self._send(handler, 403, {"message": "bad token"})
        if parts[:3] != ["hub", "api", "users"] or len(parts) < 4:
            return self._send(handler, 404, {"message": "not here"})
        name = parts[3]
        if name not in self.servers:
            return self._send(handler, 404, {"message": "no such user"})
        if method == "GET" and len(parts) == 4:
            server = {"": {"url": f"/user/{name}/"}}
            return self._send(handler, 200, {"name": name, "servers": server})
        if method == "POST" and parts[4:] == ["tokens"]:
            return self._issue(handler, name, json.loads(body or b"{}"))
        if method == "DELETE" and len(parts) == 6 and parts[4] == "tokens":
            self.revoked.append(self._ids.get(parts[5], "?"))
            return self._send(handler, 204, None)
        return self._send(handler, 404, {"message": "not here"})

    def _issue(self, handler, name: str, request: dict) -> None:
        if request.get("scopes") != [f"access:servers!server={name}/"]:
            return self._send(handler, 400, {"message": f"unexpected scopes {request!r}"})
        token = secrets.token_hex(16)
        token_id = f"a{len(self.issued) + 1}"
        self.issued[token] = name
        self._ids[token_id] = token
        self._send(handler, 201, {"id": token_id, "token": token, "scopes": request["scopes"]})

    def _proxied(self, handler, method: str, parts: list[str], token: str) -> None:
        name = parts[1]
        if token == HUB_TOKEN:
            kind = "hub"
        elif self.issued.get(token) == name and token not in self.revoked:
            kind = f"server:{name}"
        else:
            kind = "none"
        self.presented.append((handler.path, kind))
        server = self.servers.get(name)
        if kind == "none":
            return self._send(handler, 403, {"message": "no access to this server"})
        if server is None:
            return self._send(handler, 503, {"message": "no server"})
        began = time.monotonic()
        try:
            self._forward(handler, method, server, "/" + "/".join(parts[2:]))
        finally:
            self.timeline.append((method, handler.path, began, time.monotonic()))

    @staticmethod
    def _forward(handler, method: str, server: StandInServer, path: str) -> None:
        """The server's answer, streamed byte by byte as it comes (its headers first)."""
        import http.client

        upstream = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        try:
            upstream.request(method, path, headers={"Authorization": f"token {server.token}"})
            reply = upstream.getresponse()
            handler.send_response(reply.status)
            for header in ("Content-Type", "Content-Length", "Location"):
                if reply.getheader(header) is not None:
                    handler.send_header(header, reply.getheader(header))
            handler.end_headers()
            handler.wfile.flush()
            while chunk := reply.read1(65536):
                handler.wfile.write(chunk)
                handler.wfile.flush()
        except OSError:
            pass  # the client went away: so does this exchange
        finally:
            upstream.close()

    @staticmethod
    def _send(handler, status: int, content) -> None:
        body = b"" if content is None else json.dumps(content).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


class Collector:
    """An address a hostile server redirects to: it records each request's credential."""

    def __init__(self) -> None:
        self.received: list[tuple[str, str | None]] = []  # path, Authorization
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                collector.received.append((self.path, self.headers.get("Authorization")))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"[]")

            do_DELETE = do_GET  # noqa: N815

            def log_message(self, *args) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}/stolen"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
