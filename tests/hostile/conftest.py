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

    def deletes(self) -> list[str]:
        """The kernel ids this server was asked to shut down, in order."""
        text = self.deletes_file.read_text() if self.deletes_file.exists() else ""
        return text.split()

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

    def server(self, user: User, kernels: list[dict]) -> StandInServer:
        """Start ``user``'s stand-in server with ``kernels`` (see standin_server.py)."""
        deletes = self.folder / f"deletes-{user.name}-{secrets.token_hex(4)}"
        deletes.touch()
        os.chown(deletes, user.uid, user.gid)
        token = secrets.token_hex(16)
        config = {"token": token, "deletes": str(deletes), "share": str(self.share),
                  "kernels": kernels}  # fmt: skip
        env = {**self.env, "HOME": str(user.home), "USER": user.name}
        env.pop("JUPYTER_RUNTIME_DIR", None)
        process = subprocess.Popen(
            [self.python, str(STANDIN), json.dumps(config)], user=user.uid, group=user.gid,
            extra_groups=[], env=env, cwd=user.home, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        said = json.loads(process.stdout.readline() or "null")
        assert said, f"{user.name}'s stand-in server did not start"
        started = StandInServer(user, process, said["pid"], said["port"], token,
                                said["kernels"], deletes)  # fmt: skip
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
    """What ``jax-nbmem`` asks a hub: ``GET hub/api/users/NAME``, ``user/NAME/api/kernels``.

    ``servers`` maps hub user names to their stand-in servers; every request is recorded in
    ``requests`` as (method, path). The token is :data:`HUB_TOKEN`.
    """

    def __init__(self, servers: dict[str, StandInServer]) -> None:
        self.servers = servers
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                hub._answer(self, "GET")

            def do_DELETE(self) -> None:  # noqa: N802
                hub._answer(self, "DELETE")

            def log_message(self, *args) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def deletes(self) -> list[str]:
        return [path for method, path in self.requests if method == "DELETE"]

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        self.requests.append((method, handler.path))
        if handler.headers.get("Authorization") != f"token {HUB_TOKEN}":
            return self._send(handler, 403, {"message": "bad token"})
        parts = handler.path.strip("/").split("/")
        if method == "GET" and parts[:3] == ["hub", "api", "users"] and len(parts) == 4:
            if parts[3] not in self.servers:
                return self._send(handler, 404, {"message": "no such user"})
            return self._send(
                handler, 200, {"name": parts[3], "servers": {"": {"url": f"/user/{parts[3]}/"}}}
            )
        if parts[:1] == ["user"] and len(parts) >= 4 and parts[2:4] == ["api", "kernels"]:
            server = self.servers.get(parts[1])
            if server is None:
                return self._send(handler, 503, {"message": "no server"})
            return self._forward(handler, method, server, "/" + "/".join(parts[2:]))
        return self._send(handler, 404, {"message": "not here"})

    @staticmethod
    def _forward(handler, method: str, server: StandInServer, path: str) -> None:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}{path}",
            method=method,
            headers={"Authorization": f"token {server.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                status, body = reply.status, reply.read()
        except urllib.error.HTTPError as error:
            status, body = error.code, error.read()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    @staticmethod
    def _send(handler, status: int, content) -> None:
        body = json.dumps(content).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
