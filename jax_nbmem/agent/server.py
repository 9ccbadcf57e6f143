"""The node agent's socket: kernels prove who they are from the host's side.

Every container runs as the same ``jovyan``, so a beacon file proves nothing: any container
can write any claim. The agent listens on ``S/agent/agent.sock`` (a Unix socket, mode 0666,
in a directory only the agent can write). At accept it reads the peer's credentials with
SO_PEERCRED: the kernel's *host* PID, whatever PID namespace it connects from. Each line the
kernel sends is its beacon (JSON, at most 64 KiB), with its ``identity`` claims; the
:class:`Registry` checks them against the host's view of that very PID (:mod:`.hostview`):
PID namespace (device, inode), innermost NSpid, start ticks and boot id, all equal. Then the
content is *proven* for that host PID while the connection stays open; it is dropped when the
connection closes (a killed kernel's socket closes with it). Each line is answered with one
line: ``{"ok": true, "pid": <host pid>}`` or ``{"ok": false, "reason": "..."}``.

Over TCP (``tcp=(host, port)``, the command's ``--agent-listen``: kernels in pods that have
neither the host's PID namespace nor the share directory) the lines and answers are the same;
no credentials come with a TCP connection, so the caller is the host process that holds the
connecting socket, found from the host's side (:mod:`.netpeer`) at its first line, never
what it says. Either way a line ``{"request": "resolution"}`` is answered with
``{"ok": true, "written_at": W, "resolution": {...}}``: the node's resolution as the caller may
see it (``resolution(host_pid)`` gives ``(written_at, its text)``; a pod's kernel has no share
directory to read it from), only to a caller that is a process on this node; with
``"since": W`` of the one it has, ``{"ok": true, "written_at": W, "unchanged": true}``.

The server is one selector loop on a daemon thread, with limits: connections in all and per
peer PID, 64 KiB lines (a longer one, or one that is not a JSON object, is refused and the
connection closed), a first line within 30 s, a started line finished within 10 s, and a peer
that does not read its answers is let go.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable

from jax_nbmem.agent.netpeer import PeerFinder
from jax_nbmem.agent.registry import (
    AGENT_DIR,
    AgentDirError,
    Registration,
    Registry,
    beacon_from_content,
    prepare_agent_dir,
)
from jax_nbmem.agent.tcp import LISTENER_TCP, Connection, TcpSide

__all__ = [
    "AGENT_DIR",
    "MAX_ANSWER_BYTES",
    "MAX_LINE_BYTES",
    "RESOLUTION_REQUEST",
    "SOCKET_NAME",
    "AgentDirError",
    "AgentServer",
    "Registration",
    "Registry",
    "beacon_from_content",
    "prepare_agent_dir",
]

log = logging.getLogger("jax_nbmem")

SOCKET_NAME = "agent.sock"
MAX_LINE_BYTES = 64 * 1024
# A resolution answer may be long (8 GPUs x 200 kernels' beacons); a peer that leaves more
# than this unread is let go.
MAX_ANSWER_BYTES = 32 << 20
RESOLUTION_REQUEST = "resolution"
_UNIX = "unix"
_PEERCRED = struct.Struct("3i")


class AgentServer(TcpSide):
    """Listens on ``S/agent/agent.sock`` and feeds a :class:`Registry` (see the module).

    ``on_change`` is called (on the server's thread) after a registration came or went.
    """

    def __init__(
        self,
        share_dir: str | None,
        registry: Registry,
        *,
        max_connections: int = 1024,
        max_per_pid: int = 4,
        first_line_s: float = 30.0,
        line_s: float = 10.0,
        on_change: Callable[[], None] | None = None,
        tcp: tuple[str, int] | None = None,
        peers: PeerFinder | None = None,
        resolution: Callable[[int], tuple[float, str] | None] | None = None,
    ) -> None:
        self.share_dir = share_dir
        self.tcp = tcp
        self.tcp_address: tuple[str, int] | None = None  # where it listens (port 0: chosen)
        self.peers = PeerFinder(registry.viewer.proc) if peers is None else peers
        self.resolution = resolution
        self.registry = registry
        self.max_connections = max_connections
        self.max_per_pid = max_per_pid
        self.first_line_s = first_line_s
        self.line_s = line_s
        self.on_change = on_change
        self.directory = ""
        self.path = ""
        self._listener: socket.socket | None = None
        self._tcp_listener: socket.socket | None = None
        self._answers: dict[tuple[float, int], tuple[str, bytes]] = {}
        self._selector: selectors.BaseSelector | None = None
        self._connections: dict[int, Connection] = {}
        self._numbers = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refused = 0

    def start(self) -> str:
        """Make the directory and the socket and serve on a thread; returns the socket's path.

        Without a share directory (``share_dir`` None: a Kubernetes node, whose pods reach it
        over TCP only) it listens on TCP alone and returns ''. AgentDirError when the
        directory is unsafe, another agent already listens there, or the TCP address is taken.
        """
        if self._thread is not None and self._thread.is_alive():
            return self.path
        if self.share_dir is None and self.tcp is None:
            raise AgentDirError("neither a share directory nor a TCP address to listen on")
        self._selector = selectors.DefaultSelector()
        try:
            if self.share_dir is not None:
                self._listen_unix()
            if self.tcp is not None:
                self._listen_tcp(*self.tcp)
        except AgentDirError:
            self.stop()  # what was made is undone: the socket, the selector
            raise
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="jax-nbmem-agent", daemon=True)
        self._thread.start()
        return self.path

    def _listen_unix(self) -> None:
        self.directory = prepare_agent_dir(self.share_dir)
        self.path = os.path.join(self.directory, SOCKET_NAME)
        self._clear_stale_socket()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            os.chmod(self.path, 0o666)  # every container's kernel may connect
            listener.listen(128)
            listener.setblocking(False)
        except OSError as error:
            listener.close()
            raise AgentDirError(
                f"cannot listen on {self.path}: {error.strerror or error}"
            ) from None
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, _UNIX)

    def stop(self) -> None:
        """Stop serving, close every connection and remove the socket; a second call is a no-op."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(5.0)
        for connection in list(self._connections.values()):
            self._close(connection)
        if self._tcp_listener is not None:
            self._tcp_listener.close()
            self._tcp_listener = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            try:
                if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                    os.unlink(self.path)
            except OSError:
                pass
        if self._selector is not None:
            self._selector.close()
            self._selector = None

    @property
    def connections(self) -> int:
        """How many connections are open now."""
        return len(self._connections)

    def _clear_stale_socket(self) -> None:
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(info.st_mode):
            raise AgentDirError(f"{self.path} exists and is no socket: remove it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(1.0)
            probe.connect(self.path)
        except OSError:
            os.unlink(self.path)  # a socket nobody listens on: a previous agent's
            return
        finally:
            probe.close()
        raise AgentDirError(f"another agent already listens on {self.path}")

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._selector.select(timeout=0.5)
            except OSError:
                break
            for key, mask in events:
                if key.data == _UNIX:
                    self._accept()
                elif key.data == LISTENER_TCP:
                    self._accept_tcp()
                else:
                    self._service(key.data, mask)
            self._expire(time.monotonic())

    def _accept(self) -> None:
        for _ in range(64):  # what is waiting now, bounded
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # EMFILE and the like: say it, keep serving
                log.warning("jax-nbmem agent: accept failed: %s", error)
                return
            sock.setblocking(False)
            try:
                pid, uid, _gid = _PEERCRED.unpack(
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
                )
            except OSError:
                sock.close()
                continue
            self._numbers += 1
            connection = Connection(sock, self._numbers, pid, uid, time.monotonic(),
                                     bytearray(), bytearray())  # fmt: skip
            reason = self._admit(connection)
            self._connections[connection.number] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)
            if reason is not None:
                self._refuse(connection, reason, close=True)

    def _admit(self, connection: Connection) -> str | None:
        if connection.pid <= 0:
            return "your PID is not visible from the agent's PID namespace"
        if len(self._connections) >= self.max_connections:
            return f"the agent has {self.max_connections} connections already"
        same = sum(1 for c in self._connections.values() if c.pid == connection.pid)
        if same >= self.max_per_pid:
            return f"host PID {connection.pid} has {same} connections already"
        return None

    def _service(self, connection: Connection, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._flush(connection)
        if not mask & selectors.EVENT_READ or connection.closing:
            return
        try:
            data = connection.sock.recv(MAX_LINE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(connection)
            return
        connection.inbox += data
        while not connection.closing:
            end = connection.inbox.find(b"\n")
            if end < 0:
                break
            line = bytes(connection.inbox[:end])
            del connection.inbox[: end + 1]
            self._line(connection, line)
        if connection.closing:
            return
        if len(connection.inbox) > MAX_LINE_BYTES:
            self._refuse(connection, "a line over 64 KiB", close=True)
        else:
            connection.line_since = time.monotonic() if connection.inbox else None

    def _line(self, connection: Connection, line: bytes) -> None:
        if len(line) > MAX_LINE_BYTES:
            self._refuse(connection, "a line over 64 KiB", close=True)
            return
        try:
            content = json.loads(line)
        except (ValueError, RecursionError):
            content = None
        if not isinstance(content, dict):
            self._refuse(connection, "not a JSON object", close=True)
            return
        if connection.peer is not None:
            reason = self._holders(connection)
            if reason is not None:
                self._refuse(connection, reason, close=True)
                return
        if content.get("request") == RESOLUTION_REQUEST:
            self._answer_resolution(connection, content.get("since"))
            return
        reason = self._register(connection, content)
        if reason is not None:
            if connection.proven and self.registry.drop(connection.number):
                connection.proven = False  # what it proved before no longer stands
                self._changed()
            self._refuse(connection, reason, close=False)
            return
        connection.proven = True
        self._send(connection, {"ok": True, "pid": connection.pid})
        self._changed()

    def _register(self, connection: Connection, content: dict) -> str | None:
        """Prove ``content`` for the caller's host PID (over TCP: one holder of its socket)."""
        candidates = connection.holders or (connection.pid,)
        reason = None
        for pid in candidates:  # after a fork several hold it: the claims say which one
            uid = connection.uid
            if connection.peer is not None:
                seen = self.registry.viewer.view(pid)
                uid = seen.uid if seen is not None and seen.uid is not None else -1
            reason = self.registry.register(pid, uid, content, connection.number)
            if reason is None:
                connection.pid = pid
                return None
        return reason

    def _refuse(self, connection: Connection, reason: str, *, close: bool) -> None:
        self.refused += 1
        log.info("jax-nbmem agent: refused host PID %s: %s", connection.pid, reason)
        self._send(connection, {"ok": False, "reason": reason})
        if close:
            connection.closing = True
            self._flush(connection)
            self._close(connection)

    def _send(self, connection: Connection, answer: dict) -> None:
        self._send_raw(connection, json.dumps(answer).encode() + b"\n")

    def _send_raw(self, connection: Connection, line: bytes) -> None:
        if len(connection.outbox) > MAX_LINE_BYTES:  # it does not read its answers
            self._close(connection)
            return
        if len(connection.outbox) + len(line) > MAX_ANSWER_BYTES:
            line = json.dumps({"ok": False, "reason": "the answer is too long"}).encode() + b"\n"
        connection.outbox += line
        self._flush(connection)

    def _flush(self, connection: Connection) -> None:
        if connection.number not in self._connections:
            return
        try:
            sent = connection.sock.send(connection.outbox) if connection.outbox else 0
            del connection.outbox[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as error:
            if error.errno not in (errno.EAGAIN,):
                self._close(connection)
                return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if connection.outbox else 0)
        try:
            self._selector.modify(connection.sock, events, connection)
        except (KeyError, ValueError, OSError):
            pass

    def _expire(self, now: float) -> None:
        for connection in list(self._connections.values()):
            if connection.line_since is not None and now - connection.line_since > self.line_s:
                self._refuse(connection, f"a line unfinished after {self.line_s:g} s", close=True)
            elif not connection.proven and now - connection.accepted_at > self.first_line_s:
                self._refuse(connection, f"nothing proven after {self.first_line_s:g} s",
                             close=True)  # fmt: skip

    def _close(self, connection: Connection) -> None:
        if self._connections.pop(connection.number, None) is None:
            return
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError, OSError, AttributeError):
            pass
        connection.sock.close()
        if self.registry.drop(connection.number):
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                log.warning("jax-nbmem agent: on_change failed", exc_info=True)
