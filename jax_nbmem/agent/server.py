"""The node agent's socket: kernels prove who they are from the host's side.

Every container runs as the same ``jovyan``, so a beacon file proves nothing: any container
can write any claim. The agent listens on ``S/agent/agent.sock`` (a Unix socket, mode 0666,
in a directory only the agent can write). At accept it reads the peer's credentials with
SO_PEERCRED: the kernel's *host* PID, whatever PID namespace it connects from, and binds the
connection to that very process (:mod:`.binding`: a pidfd, and its start ticks). Each line the
kernel sends is its beacon (JSON, at most 64 KiB), with its ``identity`` claims; the
:class:`Registry` checks them against the host's view of that PID (:mod:`.hostview`): PID
namespace (device, inode), innermost NSpid, start ticks and boot id, all equal, the process
the connection is bound to, owned by the socket's UID. Then the content is *proven* for that
host PID while the connection stays open and its process lives; it is dropped when either
ends (a connection whose process ended is closed). Each line is answered with one line:
``{"ok": true, "pid": <host pid>}`` or ``{"ok": false, "reason": "..."}``; a refusal names the
caller's claim that failed, never what the host sees of any process.

Over TCP (``tcp=(host, port)``, the command's ``--agent-listen``: kernels in pods that have
neither the host's PID namespace nor the share directory) the lines and answers are the same;
no credentials come with a TCP connection, so the caller is the host process that holds the
connecting socket, found from the host's side (:mod:`.netpeer`) at its first line, never
what it says, and bound by its start ticks (and a pidfd where ``pidfd_open`` works). Either
way a line ``{"request": "resolution"}`` is answered with ``{"ok": true, "written_at": W,
"resolution": {...}}``: the node's resolution as the caller may see it (``resolution(host_pid)``
gives ``(written_at, its text)``), only to a caller that is a process on this node; with
``"since": W`` of the one it has, ``{"ok": true, "written_at": W, "unchanged": true}``.

It keeps serving under attack. One selector loop on a thread accepts, reads, parses, writes:
connections are limited at accept, before any line, per caller group (a PID namespace, a host
user, a network namespace or address: :mod:`.admission`), with a share of the slots kept for
groups with none open, and per host PID; each line's judgement (the host's view, a TCP
caller's socket search) is a job for :mod:`.lookups`' workers, one at a time per group.
Lines are at most 64 KiB (else, or not a JSON object: refused, closed); a proof must come
within 30 s, a started line finish within 10 s; answers are queued by reference
(:mod:`.connection`), and a peer that leaves them unread (``write_s``) is dropped.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from jax_nbmem.agent.accepting import AcceptPause
from jax_nbmem.agent.admission import Admission, ServingLimits, enough_descriptors, unix_group
from jax_nbmem.agent.binding import PROCESS_ENDED, bind_unix
from jax_nbmem.agent.connection import Connection
from jax_nbmem.agent.judging import (
    MAX_ANSWER_BYTES,
    RESOLUTION_REQUEST,
    Ended,
    Judging,
    release,
)
from jax_nbmem.agent.lookups import Lookups
from jax_nbmem.agent.netpeer import PeerFinder
from jax_nbmem.agent.registry import (
    AGENT_DIR,
    AgentDirError,
    Registration,
    Registry,
    beacon_from_content,
    prepare_agent_dir,
)
from jax_nbmem.agent.tcp import LISTENER_TCP, MAX_LINE_BYTES, TcpSide

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
_UNIX = "unix"
_WAKE = "wake"
_PEERCRED = struct.Struct("3i")
_EXPIRE_EVERY_S = 0.25


class AgentServer(TcpSide, Judging):
    """Listens on ``S/agent/agent.sock`` and feeds a :class:`Registry` (see the module).

    ``on_change`` is called (on the server's thread) after a registration came or went; how
    much it serves at once and how long it waits are its :class:`ServingLimits`.
    """

    def __init__(
        self,
        share_dir: str | None,
        registry: Registry,
        *,
        on_change: Callable[[], None] | None = None,
        tcp: tuple[str, int] | None = None,
        peers: PeerFinder | None = None,
        resolution: Callable[[int], tuple[float, str] | None] | None = None,
        **limits: Any,
    ) -> None:
        """``limits``: the fields of :class:`ServingLimits` (a TypeError names any other)."""
        limits = ServingLimits(**limits)
        self.limits = limits
        self.share_dir = share_dir
        self.tcp = tcp
        self.tcp_address: tuple[str, int] | None = None  # where it listens (port 0: chosen)
        self.peers = PeerFinder(registry.viewer.proc) if peers is None else peers
        self.resolution = resolution
        self.registry = registry
        self.max_connections = limits.max_connections
        self.max_per_pid = limits.max_per_pid
        reserve = limits.max_connections // 4 if limits.reserved is None else limits.reserved
        self.admission = Admission(limits.max_connections, limits.max_per_group, reserve)
        self.first_line_s = limits.first_line_s
        self.line_s = limits.line_s
        self.write_s = limits.write_s
        self.on_change = on_change
        self.peer_pidfd = limits.peer_pidfd
        self.directory = ""
        self.path = ""
        self._listener: socket.socket | None = None
        self._tcp_listener: socket.socket | None = None
        self._answers: dict[tuple[float, int], tuple[str, tuple]] = {}
        self._selector: selectors.BaseSelector | None = None
        self._connections: dict[int, Connection] = {}
        self._per_pid: Counter = Counter()
        self._numbers = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._done: deque = deque()  # (connection, verdict) from the look-up workers
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self.lookups = Lookups(
            self._delivered, workers=limits.lookup_workers, budget_s=limits.lookup_budget_s
        )
        self._expired_at = self._swept_at = 0.0
        self.refused = 0
        self.accept_pause = AcceptPause(log, "jax-nbmem agent")

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
        enough_descriptors(2 * self.max_connections + 64)  # a socket and a pidfd each
        self._selector = selectors.DefaultSelector()
        self._wake = socket.socketpair()
        for end in self._wake:
            end.setblocking(False)
        self._selector.register(self._wake[0], selectors.EVENT_READ, _WAKE)
        try:
            if self.share_dir is not None:
                self._listen_unix()
            if self.tcp is not None:
                self._listen_tcp(*self.tcp)
        except AgentDirError:
            self.stop()  # what was made is undone: the socket, the selector
            raise
        self._stop.clear()
        self.lookups.start()
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
            listener.listen(1024)  # a burst of connections is accepted and judged, not lost
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
        self.lookups.stop()
        for connection in list(self._connections.values()):
            connection.busy = False  # the workers are gone
            self._close(connection)
        for listener in (self._tcp_listener, *(self._wake or ())):
            if listener is not None:
                listener.close()
        self._tcp_listener = self._wake = None
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
                events = self._selector.select(timeout=self.accept_pause.wait_s(0.5))
            except OSError:
                break
            self.accept_pause.resume(self._selector)
            for key, mask in events:
                if key.data == _UNIX:
                    self._accept()
                elif key.data == LISTENER_TCP:
                    self._accept_tcp()
                elif key.data == _WAKE:
                    self._take_verdicts()
                elif isinstance(key.data, Ended):
                    if key.data.connection.number in self._connections:
                        self._refuse(key.data.connection, PROCESS_ENDED, close=True)
                elif key.data.number in self._connections:
                    self._service(key.data, mask)
            now = time.monotonic()
            if now - self._expired_at > _EXPIRE_EVERY_S:
                self._expired_at = now
                self._expire(now)

    def _accept(self) -> None:
        for _ in range(64):  # what is waiting now, bounded
            accepted = self.accept_pause.accept(self._selector, self._listener)
            if accepted is None:
                return
            sock, _ = accepted
            sock.setblocking(False)
            try:
                pid, uid, _gid = _PEERCRED.unpack(
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
                )
            except OSError:
                sock.close()
                continue
            self._numbers += 1
            connection = Connection(sock, self._numbers, pid, uid, time.monotonic(), bytearray())
            reason = self._admit(connection)
            if reason is None:
                connection.binding = bind_unix(
                    sock, pid, self.registry.viewer, pidfd=self.peer_pidfd
                )
                if connection.binding is None:
                    reason = PROCESS_ENDED
            self._open(connection, reason)

    def _admit(self, connection: Connection) -> str | None:
        if connection.pid <= 0:
            return "your PID is not visible from the agent's PID namespace"
        connection.group = unix_group(self.registry.viewer.proc, connection.pid, connection.uid)
        return self.admission.refusal(connection.group) or self._pid_full(connection.pid)

    def _open(self, connection: Connection, reason: str | None) -> None:
        """Serve ``connection``, or refuse it with ``reason`` (counted in no limit)."""
        self._connections[connection.number] = connection
        self._selector.register(connection.sock, selectors.EVENT_READ, connection)
        if reason is not None:
            connection.group = ()
            self._refuse(connection, reason, close=True)
            return
        self.admission.opened(connection.group)
        self._count_pid(connection)
        if connection.binding is not None and connection.binding.pidfd is not None:
            self._selector.register(connection.binding.pidfd, selectors.EVENT_READ,
                                    Ended(connection))  # fmt: skip

    def _pid_full(self, pid: int) -> str | None:
        """Why host PID *pid* may open no more connections (it has ``max_per_pid``), or None.

        The count is the serving thread's: a look-up worker that asks may be one behind, and
        the serving thread asks again where it applies the verdict (Judging._crowded_pid).
        """
        held = self._per_pid[pid]
        if held < self.max_per_pid:
            return None
        return f"host PID {pid} has {held} connections already"

    def _count_pid(self, connection: Connection) -> None:
        """Keep ``_per_pid`` right after the connection's host PID was learnt or changed."""
        counted = connection.counted_pid
        if counted != connection.pid:
            if counted:
                self._per_pid[counted] -= 1
                if self._per_pid[counted] <= 0:
                    del self._per_pid[counted]
            if connection.pid > 0:
                self._per_pid[connection.pid] += 1
            connection.counted_pid = connection.pid

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
        self._lines(connection)

    def _lines(self, connection: Connection) -> None:
        """Judge the connection's next complete line, unless one is being judged."""
        while not connection.closing and not connection.busy:
            end = connection.inbox.find(b"\n")
            if end < 0:
                break
            line = bytes(connection.inbox[:end])
            del connection.inbox[: end + 1]
            self._line(connection, line)
        if connection.closing:
            return
        if len(connection.inbox) > MAX_LINE_BYTES:
            why = "a line over 64 KiB" if not connection.busy else "64 KiB sent before an answer"
            self._refuse(connection, why, close=True)
        elif not connection.busy:
            connection.line_since = time.monotonic() if connection.inbox else None

    def _close(self, connection: Connection) -> None:
        if self._connections.pop(connection.number, None) is None:
            return
        connection.closing = True
        if connection.outbox:  # a last refusal: sent if the socket takes it now
            connection.flush()
        for fd in (connection.sock, connection.binding and connection.binding.pidfd):
            try:
                if fd is not None:
                    self._selector.unregister(fd)
            except (KeyError, ValueError, OSError, AttributeError):
                pass
        connection.sock.close()
        if not connection.busy:  # else a worker may still poll its pidfd: released after
            release(connection)
        if connection.group:
            self.admission.closed(connection.group)
            connection.pid = 0
            self._count_pid(connection)
        if self.registry.drop(connection.number):
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                log.warning("jax-nbmem agent: on_change failed", exc_info=True)
