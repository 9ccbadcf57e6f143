"""The node agent's TCP side: kernels in pods that have no share directory (see :mod:`.server`).

No credentials come with a TCP connection, so the caller is the host process that holds the
connecting socket, found from the host's side (:mod:`.netpeer`) at its first line, never what
it says; then its lines are the Unix socket's. On either socket a line ``{"request":
"resolution"}`` (``"since": W``: the one the caller has) is answered with the node's
resolution as the caller may see it: ``{"ok": true, "written_at": W, "resolution": {...}}``,
or ``{"ok": true, "written_at": W, "unchanged": true}``, and only to a caller that is a
process on this node.

The culler's notice for the caller (``jax_nbmem-cull-<key>.json`` in the share directory,
which a kernel in a pod cannot read) comes with either answer as ``"notice": {...}``: only to
a caller proven on this connection, only the notice of its own key (``<pid>``, or
``<ns_ino>-<pid_in_ns>`` as the host sees its PID namespace) and of its host PID, and only a
notice the kernel would trust as a file (root's or the share directory owner's:
:func:`~.culling.read_notice`). In a full answer it comes first (``{"notice": {...}, "ok":
true, ...}``), so the resolution after it is sent as encoded once for every caller.

:class:`TcpSide` is a part of :class:`~.agent.AgentServer` (its state is the server's).
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Any

from jax_nbmem.agent.netpeer import family_of
from jax_nbmem.agent.registry import AgentDirError
from jax_nbmem.tenants.culling import notice_content, read_notice

__all__ = ["LISTENER_TCP", "Connection", "TcpSide"]

log = logging.getLogger("jax_nbmem")
LISTENER_TCP = "tcp"


@dataclass
class Connection:
    """One kernel's connection to the agent (Unix or TCP)."""

    sock: socket.socket
    number: int
    pid: int
    uid: int
    accepted_at: float
    inbox: bytearray
    outbox: bytearray
    line_since: float | None = None
    proven: bool = False
    closing: bool = False
    peer: tuple | None = None  # TCP: (address, port) of each end, the caller's first
    holders: tuple[int, ...] = ()  # TCP: the host PIDs holding the caller's socket


class TcpSide:
    """The TCP listener, the caller's host PID from its socket, and the resolution's answers."""

    def _listen_tcp(self, host: str, port: int) -> None:
        listener = socket.socket(family_of(host), socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(128)
            listener.setblocking(False)
        except OSError as error:
            listener.close()
            raise AgentDirError(
                f"cannot listen on {host}:{port} (--agent-listen): {error.strerror or error}"
            ) from None
        self._tcp_listener = listener
        self.tcp_address = listener.getsockname()[:2]
        self._selector.register(listener, selectors.EVENT_READ, LISTENER_TCP)

    def _accept_tcp(self) -> None:
        for _ in range(64):
            try:
                sock, far = self._tcp_listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                log.warning("jax-nbmem agent: accept failed: %s", error)
                return
            sock.setblocking(False)
            try:
                near = sock.getsockname()
            except OSError:
                sock.close()
                continue
            self._numbers += 1
            # Its host PID is found from the host's side at its first line (_holders).
            connection = Connection(sock, self._numbers, 0, -1, time.monotonic(), bytearray(),
                                     bytearray(), peer=(far[:2], near[:2]))  # fmt: skip
            full = len(self._connections) >= self.max_connections
            self._connections[connection.number] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)
            if full:
                why = f"the agent has {self.max_connections} connections already"
                self._refuse(connection, why, close=True)

    def _holders(self, connection: Connection) -> str | None:
        """Find which host processes hold a TCP caller's socket; None, or why it is refused."""
        if connection.holders:
            return None
        held, reason = self.peers.holders(*connection.peer)
        if reason is not None:
            return reason
        pid = held[0]
        same = sum(1 for c in self._connections.values() if c.pid == pid)
        if same >= self.max_per_pid:
            return f"host PID {pid} has {same} connections already"
        seen = self.registry.viewer.view(pid)
        connection.holders, connection.pid = tuple(held), pid
        connection.uid = seen.uid if seen is not None and seen.uid is not None else -1
        return None

    def _answer_resolution(self, connection: Connection, since: Any) -> None:
        found = None
        if self.resolution is not None:
            try:
                found = self.resolution(connection.pid)
            except Exception:
                log.warning("jax-nbmem agent: the resolution for a caller failed", exc_info=True)
        if found is None:
            self._send(connection, {"ok": False, "reason": "the agent has no resolution yet"})
            return
        written_at, text = found
        notice = self._notice_for(connection)
        if since is not None and since == written_at:  # the caller has it already
            answer = {"ok": True, "written_at": written_at, "unchanged": True}
            self._send(connection, answer if notice is None else {**answer, "notice": notice})
            return
        line = self._encoded(written_at, text)
        if notice is not None:  # first, before the resolution encoded for every caller
            line = b'{"notice":' + json.dumps(notice).encode() + b"," + line[1:]
        self._send_raw(connection, line)

    def _notice_for(self, connection: Connection) -> dict | None:
        """The culler's notice for the kernel proven on ``connection``, or None (see the module).

        Read at each ask (at most one small file, none when there is no notice): a notice
        written or taken away reaches the kernel at its next ask.
        """
        if not connection.proven or not self.share_dir:
            return None
        registration = self.registry.of_connection(connection.pid, connection.number)
        if registration is None:
            return None
        key = registration.key
        try:
            notice = read_notice([self.share_dir], registration.pid,
                                 key=None if key == str(registration.pid) else key)  # fmt: skip
        except OSError:
            return None
        if notice is None or notice.pid != registration.pid:
            return None  # another process's (an earlier one of that key)
        return notice_content(notice)

    def _encoded(self, written_at: float, text: str) -> bytes:
        """The answer line for a resolution text, encoded once per pass and text.

        Not once per ask: 200 kernels asking for a resolution of a few MiB would encode it
        200 times.
        """
        if self._answers and next(iter(self._answers))[0] != written_at:
            self._answers.clear()
        key = (written_at, id(text))
        found = self._answers.get(key)
        if found is None or found[0] is not text:
            head = b'{"ok":true,"written_at":' + json.dumps(written_at).encode()
            found = self._answers[key] = (text, head + b',"resolution":' + text.encode() + b"}\n")
        return found[1]
