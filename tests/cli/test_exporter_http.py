"""The exporter's HTTP side keeps its bounds: a cap, a deadline per request, a slow one cut.

A WSGI app of the test's own behind :class:`HttpFront` with small limits, and real sockets:
a slowloris client trickling a header line is closed at its deadline however it trickles; a
full server cuts the connection that sent part of a request for a new one, never a whole
request; a request over the size limit, a body, HEAD (issue 52 item 1).
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from jax_nbmem.cli.exporter_http import HttpFront, HttpLimits
from tests.waiting import wait_for


def _app(environ, start_response):
    body = environ["wsgi.input"].read()
    text = (
        f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']} {environ['QUERY_STRING']} {len(body)}"
    )
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [text.encode()]


@pytest.fixture
def front():
    server = HttpFront("127.0.0.1", 0, _app, limits=HttpLimits(max_connections=4, request_s=1.0))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _get(server, path="/metrics?name[]=x") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}{path}", timeout=5) as r:
        assert r.headers["Connection"] == "close"
        return r.read().decode()


def _partial(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.server_port))
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    return sock


def _closed(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_whole_request_is_answered_and_its_connection_closed(front):
    assert _get(front) == "GET /metrics name[]=x 0"
    request = urllib.request.Request(f"http://127.0.0.1:{front.server_port}/x", data=b"abc")
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.read() == b"POST /x  3"
    request = urllib.request.Request(f"http://127.0.0.1:{front.server_port}/x", method="HEAD")
    with urllib.request.urlopen(request, timeout=5) as reply:
        assert reply.read() == b"" and reply.headers["Content-Length"] == "10"  # "HEAD /x  0"


def test_a_slowloris_client_is_cut_at_its_deadline_however_it_trickles(front):
    sock = _partial(front)
    began = time.monotonic()
    while not _closed(sock, 0.2):
        try:
            sock.sendall(b"X-Slow: 1\r\n")  # a line every 0.2 s: never idle, never whole
        except OSError:
            break
        assert time.monotonic() - began < 5, "a trickling request was never cut"
    assert time.monotonic() - began >= 0.9  # its whole request's deadline, 1 s here
    sock.close()


def test_a_full_server_cuts_a_partial_request_for_a_new_one_and_answers_it(front):
    held = [_partial(front) for _ in range(4)]
    wait_for("four connections held", lambda: front.connections == 4)
    assert _get(front) == "GET /metrics name[]=x 0"  # a partial one made room
    assert sum(_closed(sock, 0.5) for sock in held) >= 1
    assert front.cut >= 1
    for sock in held:
        sock.close()


def test_a_request_over_the_limit_is_refused_said(front):
    sock = socket.create_connection(("127.0.0.1", front.server_port))
    sock.sendall(b"GET / HTTP/1.1\r\nX-Big: " + b"x" * (17 << 10) + b"\r\n\r\n")
    sock.settimeout(5)
    said = b""
    while chunk := sock.recv(4096):
        said += chunk
    assert said.startswith(b"HTTP/1.1 431 ") and b"a request over 16 KiB" in said
    sock.close()
