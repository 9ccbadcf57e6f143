"""The exporter's HTTP side: bounded, so that no user's connections starve the node agent.

The exporter and the node agent are one process (docs/security.md, "One process, its
descriptors shared"). A server with a thread per connection and no deadline lets any local
user hold a descriptor per idle connection until the process has none left; then the agent
cannot accept a kernel (issue 52). This server instead:

* holds at most ``max_connections`` connections (default 256, far below the unit's 4096
  descriptors; the agent's own are counted apart): when full, a new one takes the place of the
  oldest that sent part of a request and not the rest (then the oldest that sent nothing), so
  a slow client is the one cut, and a scraper, whose request comes whole at once, is heard;
* gives each connection ``request_s`` (5 s) for its TLS handshake, request line, headers and
  body together (at most 16 KiB), and ``write_s`` (10 s) to take its answer; past either it is
  closed (a slowloris client is cut, however it trickles);
* reads, parses and writes on one selector thread without blocking; only the WSGI app runs on
  a few worker threads, with the request already whole;
* rests its listener when accept fails (:class:`~jax_nbmem.agent.accepting.AcceptPause`).

One request per connection (``Connection: close``), as Prometheus and probes are served well.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import resource
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import unquote

from jax_nbmem.agent.accepting import AcceptPause

__all__ = ["HttpFront", "HttpLimits", "within_descriptors"]

log = logging.getLogger("jax_nbmem.exporter")

_LISTENER, _WAKE = "listener", "wake"
_SWEEP_S = 0.1


@dataclass(frozen=True)
class HttpLimits:
    """How much the HTTP side serves at once and how long it waits (see the module)."""

    max_connections: int = 256
    request_s: float = 5.0
    write_s: float = 10.0
    max_request_bytes: int = 16 << 10
    workers: int = 4


def within_descriptors(limits: HttpLimits) -> HttpLimits:
    """``limits`` with at most a quarter of this process's descriptors for HTTP connections.

    The rest stay the node agent's (its connections and their pidfds), the snapshot's and the
    log's, whatever HTTP clients do (docs/security.md).
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or limits.max_connections <= soft // 4:
        return limits
    return dataclasses.replace(limits, max_connections=max(4, soft // 4))


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    address: tuple
    deadline: float
    handshaking: bool = False
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None
    working: bool = False  # the request is whole: never the one cut to make room


class HttpFront:
    """Serves a WSGI ``app`` on ``(host, port)`` within :class:`HttpLimits` (see the module)."""

    def __init__(self, host: str, port: int, app: Callable, *, tls: ssl.SSLContext | None = None,
                 limits: HttpLimits | None = None) -> None:  # fmt: skip
        self.app, self.tls = app, tls
        self.limits = limits or HttpLimits()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(4096)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise
        self.server_address = self._listener.getsockname()
        self.server_port = self.server_address[1]
        self._selector = selectors.DefaultSelector()
        self._wake = socket.socketpair()
        for end in self._wake:
            end.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._wake[0], selectors.EVENT_READ, _WAKE)
        self._open: dict[socket.socket, _Connection] = {}  # in the order accepted
        self._answered: deque = deque()  # (connection, bytes) from the workers
        self._workers = ThreadPoolExecutor(self.limits.workers, "jax-nbmem-exporter-http")
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self.pause = AcceptPause(log, "jax-nbmem exporter")
        self.cut = 0  # connections closed for a deadline or to make room

    @property
    def connections(self) -> int:
        """How many connections are open now."""
        return len(self._open)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until :meth:`shutdown`."""
        swept = 0.0
        try:
            while not self._stop.is_set():
                timeout = self.pause.wait_s(min(poll_interval, _SWEEP_S))
                accepting = False
                for key, mask in self._selector.select(timeout):
                    if key.data == _LISTENER:
                        accepting = True
                    elif key.data == _WAKE:
                        self._take_answers()
                    elif key.data.sock in self._open:
                        self._service(key.data, mask)
                if accepting:  # last: what came on open connections is read before any is cut
                    self._accept()
                self.pause.resume(self._selector)
                now = time.monotonic()
                if now - swept >= _SWEEP_S:
                    swept = now
                    self._expire(now)
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` and wait for it (from another thread)."""
        self._stop.set()
        try:
            self._wake[1].send(b"x")
        except OSError:
            pass
        self._stopped.wait(5.0)

    def server_close(self) -> None:
        """Close the listener and every connection."""
        self._workers.shutdown(wait=False, cancel_futures=True)
        for connection in list(self._open.values()):
            self._close(connection)
        for sock in (self._listener, *self._wake):
            sock.close()
        self._selector.close()

    # --- Accepting ----------------------------------------------------------------------

    def _accept(self) -> None:
        # The whole queue, so that it never overflows and drops a scraper's SYN (a second's
        # retry); each new connection is read at once, and a scraper's whole request is never
        # the one cut (see _make_room).
        for _ in range(max(64, self.limits.max_connections)):
            accepted = self.pause.accept(self._selector, self._listener)
            if accepted is None:
                return
            sock, address = accepted
            if len(self._open) >= self.limits.max_connections and not self._make_room():
                sock.close()  # every slot holds a whole request being answered
                self.cut += 1
                continue
            sock.setblocking(False)
            connection = _Connection(sock, address, time.monotonic() + self.limits.request_s)
            if self.tls is not None:
                try:
                    connection.sock = self.tls.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
                except (OSError, ValueError):
                    sock.close()
                    continue
                connection.handshaking = True
            self._open[connection.sock] = connection
            self._selector.register(connection.sock, selectors.EVENT_READ, connection)
            if not connection.handshaking:
                self._read(connection)  # a scraper's request is often here already: never cut

    def _make_room(self) -> bool:
        """Cut one connection for a new one; False: every one's request is with the app.

        First the oldest that sent part of a request and not the rest (a scraper sends its
        request whole at once: a part is a slow client), then the oldest that sent nothing,
        then the oldest whose answer waits unread.
        """
        for rank in (_PARTIAL, _NOTHING, _UNREAD):
            for connection in self._open.values():
                if _rank(connection) == rank:
                    self.cut += 1
                    self._close(connection)
                    return True
        return False

    def _expire(self, now: float) -> None:
        for connection in list(self._open.values()):
            if now >= connection.deadline and not connection.working:
                self.cut += 1
                self._close(connection)

    # --- Reading a request --------------------------------------------------------------

    def _service(self, connection: _Connection, mask: int) -> None:
        if connection.handshaking:
            self._handshake(connection)
        elif connection.outbox is not None:
            self._flush(connection)
        elif not connection.working:
            self._read(connection)

    def _handshake(self, connection: _Connection) -> None:
        try:
            connection.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(connection.sock, selectors.EVENT_READ, connection)
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
            return
        except (OSError, ValueError):
            log.debug("jax-nbmem exporter: a TLS handshake failed", exc_info=True)
            self._close(connection)
            return
        connection.handshaking = False
        self._selector.modify(connection.sock, selectors.EVENT_READ, connection)
        self._read(connection)  # TLS may hold the request's bytes already

    def _read(self, connection: _Connection) -> None:
        while True:
            try:
                data = connection.sock.recv(self.limits.max_request_bytes + 1)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                break
            except ssl.SSLWantWriteError:
                self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
                break
            except OSError:
                data = b""
            if not data:
                self._close(connection)
                return
            connection.inbox += data
            if len(connection.inbox) > self.limits.max_request_bytes:
                self._answer(connection, _plain("431 Request Header Fields Too Large",
                                                "a request over 16 KiB"))  # fmt: skip
                return
        request = _parse(bytes(connection.inbox))
        if request is None:
            return  # not whole yet: its deadline runs
        if isinstance(request, bytes):
            self._answer(connection, request)
            return
        connection.working = True
        self._selector.unregister(connection.sock)  # until its answer: nothing more is read
        environ = self._environ(connection, *request)
        self._workers.submit(self._run_app, connection, environ)

    def _environ(self, connection: _Connection, method: str, target: str, version: str,
                 headers: dict[str, str], body: bytes) -> dict:  # fmt: skip
        path, _, query = target.partition("?")
        host, port = self.server_address[:2]
        environ = {
            "REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": unquote(path),
            "QUERY_STRING": query, "SERVER_NAME": str(host), "SERVER_PORT": str(port),
            "SERVER_PROTOCOL": version, "REMOTE_ADDR": str(connection.address[0]),
            "CONTENT_LENGTH": headers.get("content-length", ""),
            "CONTENT_TYPE": headers.get("content-type", ""),
            "wsgi.version": (1, 0), "wsgi.url_scheme": "https" if self.tls else "http",
            "wsgi.input": io.BytesIO(body), "wsgi.errors": io.StringIO(),
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
        }  # fmt: skip
        for name, value in headers.items():
            key = "HTTP_" + name.upper().replace("-", "_")
            if key not in ("HTTP_CONTENT_LENGTH", "HTTP_CONTENT_TYPE"):
                environ[key] = value
        return environ

    # --- Answering ----------------------------------------------------------------------

    def _run_app(self, connection: _Connection, environ: dict) -> None:
        """On a worker: the app's whole answer, handed to the selector's thread."""
        try:
            answer = _call(self.app, environ)
        except Exception:
            log.warning("jax-nbmem exporter: a request failed", exc_info=True)
            answer = _plain("500 Internal Server Error", "the request failed (see the log)")
        self._answered.append((connection, answer))
        try:
            self._wake[1].send(b"x")
        except OSError:
            pass  # full: the selector's thread is being woken already

    def _take_answers(self) -> None:
        try:
            while self._wake[0].recv(4096):
                pass
        except OSError:
            pass
        while self._answered:
            connection, answer = self._answered.popleft()
            if connection.sock in self._open:
                connection.working = False
                self._answer(connection, answer)

    def _answer(self, connection: _Connection, answer: bytes) -> None:
        connection.outbox = memoryview(answer)
        connection.deadline = time.monotonic() + self.limits.write_s
        try:
            self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        except KeyError:
            self._selector.register(connection.sock, selectors.EVENT_WRITE, connection)
        self._flush(connection)

    def _flush(self, connection: _Connection) -> None:
        try:
            while connection.outbox:
                sent = connection.sock.send(connection.outbox)
                connection.outbox = connection.outbox[sent:]
            _drain(connection.sock)
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return
        except OSError:
            pass
        self._close(connection)

    def _close(self, connection: _Connection) -> None:
        if self._open.pop(connection.sock, None) is None:
            return
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()


def _drain(sock: socket.socket) -> None:
    """Read what the client sent past its request (a refused one's rest).

    Closing a socket with unread input resets it: the client may lose the answer just sent.
    """
    for _ in range(16):
        try:
            if not sock.recv(65536):
                return
        except (BlockingIOError, InterruptedError, ssl.SSLError, OSError):
            return


_PARTIAL, _NOTHING, _UNREAD, _WORKING = range(4)


def _rank(connection: _Connection) -> int:
    if connection.working:
        return _WORKING
    if connection.outbox is not None:
        return _UNREAD
    return _PARTIAL if connection.inbox else _NOTHING


def _parse(data: bytes):
    """(method, target, version, headers, body) once whole; None: not yet; bytes: an answer."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = data[:end].decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _plain("400 Bad Request", "not an HTTP request")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            return _plain("400 Bad Request", "a malformed header")
        headers[name.lower()] = value.strip()
    if "transfer-encoding" in headers:
        return _plain("411 Length Required", "a body needs a Content-Length")
    try:
        length = int(headers.get("content-length") or 0)
    except ValueError:
        return _plain("400 Bad Request", "a malformed Content-Length")
    body = data[end + 4 :]
    if length < 0:
        return _plain("400 Bad Request", "a malformed Content-Length")
    if len(body) < length:
        return None
    return parts[0], parts[1], parts[2], headers, body[:length]


def _call(app: Callable, environ: dict) -> bytes:
    """The app's answer as HTTP/1.1 bytes, ``Connection: close``."""
    said: dict = {}

    def start_response(status, headers, exc_info=None):
        said["status"], said["headers"] = status, headers

    chunks = app(environ, start_response)
    try:
        body = b"".join(chunks)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    length = len(body)  # HEAD: the length a GET would have
    if environ["REQUEST_METHOD"] == "HEAD":
        body = b""
    head = [f"HTTP/1.1 {said['status']}"]
    head += [f"{name}: {value}" for name, value in said["headers"]
             if name.lower() not in ("content-length", "connection")]  # fmt: skip
    head += [f"Content-Length: {length}", "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _plain(status: str, text: str) -> bytes:
    body = f"jax-nbmem exporter: {text}\n".encode()
    head = (f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    return head.encode("latin-1") + body
