"""One HTTP exchange with one deadline, no redirect followed; runtime files read safely; a
server's address matched whole against the sockets its process really listens on."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jax_nbmem.agent.listeners import listeners_of, proven_address
from jax_nbmem.node.exchange import exchange
from jax_nbmem.node.servers import JupyterServer, find_servers, read_runtime_file


@pytest.fixture
def trickler():
    """A server that sends its headers, then one byte every 0.2 s for 10 s."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/moved":
                self.send_response(302)
                self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", "50")
            self.end_headers()
            try:
                for _ in range(50):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_trickled_answer_ends_at_the_deadline_not_at_its_last_byte(trickler):
    connection = http.client.HTTPConnection("127.0.0.1", trickler, timeout=1.0)
    with pytest.raises(TimeoutError, match="no full answer within 1 s"):
        exchange(connection, "GET", "/", {}, 1.0)


def test_a_redirect_is_an_answer_and_nothing_is_sent_where_it_points(trickler):
    connection = http.client.HTTPConnection("127.0.0.1", trickler, timeout=5)
    answer = exchange(connection, "GET", "/moved", {"Authorization": "token x"}, 5)
    assert (answer.status, answer.location) == (302, "http://127.0.0.1:9/elsewhere")


def _runtime_file(folder, pid: int, port: int, host: str = "127.0.0.1") -> str:
    path = os.path.join(folder, f"jpserver-{pid}.json")
    with open(path, "w") as f:
        json.dump({"url": f"http://{host}:{port}/", "hostname": host, "port": port,
                   "pid": pid, "token": "t0k"}, f)  # fmt: skip
    return path


def test_runtime_files_that_are_fifos_links_or_too_big_are_not_read(tmp_path):
    good = _runtime_file(tmp_path, os.getpid(), 8888)
    os.mkfifo(tmp_path / "jpserver-1.json")
    os.symlink(good, tmp_path / "jpserver-2.json")
    (tmp_path / "jpserver-3.json").write_text(" " * (128 << 10))
    found = find_servers(str(tmp_path))
    assert [s.runtime_file for s in found] == [good]
    assert read_runtime_file(str(tmp_path / "jpserver-1.json")) is None
    assert read_runtime_file(good, owner_uid=os.geteuid() + 1) is None  # someone else's


def _listening(address: str, family=socket.AF_INET, port: int = 0) -> socket.socket:
    sock = socket.socket(family)
    sock.bind((address, port))
    sock.listen()
    return sock


def test_the_address_is_compared_whole_never_the_port_alone(tmp_path):
    mine = _listening("127.0.0.2")
    port = mine.getsockname()[1]
    try:
        held = listeners_of(os.getpid())
        assert ("127.0.0.2", port) in {(str(a), p) for a, p in held.tcp}
        server = read_runtime_file(_runtime_file(tmp_path, os.getpid(), port))
        asked, why = proven_address(os.getpid(), os.geteuid(), server)
        assert asked is None
        assert why == f"it names 127.0.0.1:{port}, but PID {os.getpid()} listens at " + (
            held.describe()
        )
        honest = read_runtime_file(_runtime_file(tmp_path, os.getpid(), port, "127.0.0.2"))
        asked, why = proven_address(os.getpid(), os.geteuid(), honest)
        assert why == "" and (asked.connect_host, asked.port) == ("127.0.0.2", port)
    finally:
        mine.close()


@pytest.mark.parametrize(
    ("bound", "family", "named", "asked"),
    [
        ("0.0.0.0", socket.AF_INET, "", "127.0.0.1"),
        ("0.0.0.0", socket.AF_INET, "127.0.0.1", "127.0.0.1"),
        ("0.0.0.0", socket.AF_INET, "localhost", "127.0.0.1"),
        ("::1", socket.AF_INET6, "localhost", "::1"),
        ("::", socket.AF_INET6, "::", "::1"),
        ("127.0.0.1", socket.AF_INET, "localhost", "127.0.0.1"),
        ("::1", socket.AF_INET6, "127.0.0.1", None),
        ("127.0.0.1", socket.AF_INET, "10.0.0.1", None),
    ],
)
def test_wildcards_and_localhost_are_asked_where_the_process_listens(
    tmp_path, bound, family, named, asked
):
    sock = _listening(bound, family)
    try:
        port = sock.getsockname()[1]
        server = JupyterServer(url=f"http://{named}:{port}/", root_dir=None, pid=os.getpid(),
                               runtime_file="x", port=port, host=named)  # fmt: skip
        found, why = proven_address(os.getpid(), os.geteuid(), server)
        assert (found.connect_host if found else None) == asked, why
    finally:
        sock.close()


def test_a_unix_socket_is_matched_by_its_path(tmp_path):
    path = str(tmp_path / "jupyter.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.listen()
    try:
        server = JupyterServer(url="x", root_dir=None, pid=os.getpid(), runtime_file="x", sock=path)
        assert proven_address(os.getpid(), os.geteuid(), server) == (server, "")
        other = JupyterServer(url="x", root_dir=None, pid=os.getpid(), runtime_file="x",
                              sock=str(tmp_path / "other.sock"))  # fmt: skip
        assert "does not listen on" in proven_address(os.getpid(), os.geteuid(), other)[1]
    finally:
        sock.close()
