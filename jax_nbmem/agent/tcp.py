"""The node agent's TCP side: kernels in pods that have no share directory (see :mod:`.server`).

No credentials come with a TCP connection, so the caller is the host process that holds the
connecting socket, found from the host's side (:mod:`.netpeer`) at its first line (on a look-up
worker: :mod:`.lookups`), never what it says, and bound by start ticks to each process found
(:mod:`.binding`); then its lines are the Unix socket's. At accept only the source address is
known: the connection's group (:mod:`.admission`) is the network namespace that owns it in the
peer finder's map as it stands, else the address itself. On either socket a line ``{"request":
"resolution"}`` (``"since": W``: the one the caller has) is answered with the node's
resolution as the caller may see it: ``{"ok": true, "written_at": W, "resolution": {...}}``,
or ``{"ok": true, "written_at": W, "unchanged": true}``, and only to a caller that is a
process on this node.

The culler's notice for the caller (``jax_nbmem-cull-<key>.json`` in the share directory,
which a kernel in a pod cannot read) comes with either answer as ``"notice": {...}``: only to
a caller proven on this connection, only the notice of its own key (``<pid>``, or
``<ns_ino>-<pid_in_ns>`` as the host sees its PID namespace) and of its host PID, and only a
notice the kernel would trust as a file (root's or the share directory owner's:
:func:`~.notices.read_notice`). In a full answer it comes first (``{"notice": {...}, "ok":
true, ...}``), so the resolution after it is sent as encoded once for every caller.

:class:`TcpSide` is a part of :class:`~.server.AgentServer` (its state is the server's).
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Any

from jax_nbmem.agent.binding import PROCESS_ENDED, bind_tcp
from jax_nbmem.agent.connection import Connection
from jax_nbmem.agent.netpeer import family_of
from jax_nbmem.agent.registry import AgentDirError
from jax_nbmem.node.notices import notice_content, read_notice

__all__ = ["LISTENER_TCP", "MAX_LINE_BYTES", "Connection", "TcpSide", "Verdict"]

log = logging.getLogger("jax_nbmem")
LISTENER_TCP = "tcp"
MAX_LINE_BYTES = 64 * 1024


@dataclass
class Verdict:
    """A look-up worker's judgement of one line.

    A refusal (``reason``), a proof, or a resolution to answer (``resolution``: written_at,
    text, notice, since).
    """

    reason: str | None = None
    close: bool = False
    proven: bool = False
    resolution: tuple | None = None


class TcpSide:
    """The TCP listener, the caller's host PID from its socket, and the resolution's answers."""

    def _listen_tcp(self, host: str, port: int) -> None:
        listener = socket.socket(family_of(host), socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(1024)
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
            accepted = self.accept_pause.accept(self._selector, self._tcp_listener)
            if accepted is None:
                return
            sock, far = accepted
            sock.setblocking(False)
            try:
                near = sock.getsockname()
            except OSError:
                sock.close()
                continue
            self._numbers += 1
            # Its host PID is found from the host's side at its first line (_holders).
            connection = Connection(sock, self._numbers, 0, -1, time.monotonic(), bytearray(),
                                    peer=(far[:2], near[:2]))  # fmt: skip
            namespace = self.peers.namespace_of(far[0])
            connection.group = ("net_ns", namespace) if namespace else ("address", far[0])
            self._open(connection, self.admission.refusal(connection.group))

    def _holders(self, connection: Connection) -> str | None:
        """Find and bind the host processes holding a TCP caller's socket; None, or why not.

        On a look-up worker. Once found, the ones that ended since are dropped.
        """
        viewer = self.registry.viewer
        if connection.holders:
            connection.holders = tuple(h for h in connection.holders if not h.ended(viewer))
            if not connection.holders or (
                connection.binding is not None and connection.binding not in connection.holders
            ):
                return PROCESS_ENDED
            return None
        held, reason = self.peers.holders(*connection.peer)
        if reason is not None:
            return reason
        pid = held[0]
        full = self._pid_full(pid)  # early, before binding: applied, the verdict is checked again
        if full is not None:
            return full
        bound = tuple(b for b in (bind_tcp(p, viewer, pidfd=False) for p in held) if b)
        if not bound:
            return "no process holds the connecting socket any more"
        seen = viewer.view(bound[0].pid)
        connection.holders, connection.pid = bound, bound[0].pid
        connection.uid = seen.uid if seen is not None and seen.uid is not None else -1
        return None

    def _resolution_verdict(self, connection: Connection, since: Any) -> Verdict:
        """The node's resolution for the caller, and its notice (on a worker: files, views)."""
        found = None
        if self.resolution is not None:
            try:
                found = self.resolution(connection.pid)
            except Exception:
                log.warning("jax-nbmem agent: the resolution for a caller failed", exc_info=True)
        if found is None:
            return Verdict("the agent has no resolution yet")
        written_at, text = found
        return Verdict(resolution=(written_at, text, self._notice_for(connection), since))

    def _answer_parts(self, verdict: Verdict) -> tuple[bytes, ...]:
        """The answer's bytes (on the serving thread).

        The resolution as encoded once for every caller, after the caller's own notice where
        it has one.
        """
        written_at, text, notice, since = verdict.resolution
        if since is not None and since == written_at:  # the caller has it already
            answer = {"ok": True, "written_at": written_at, "unchanged": True}
            answer = answer if notice is None else {**answer, "notice": notice}
            return (json.dumps(answer).encode() + b"\n",)
        head, body, tail = self._encoded(written_at, text)
        if notice is not None:  # first, before the resolution encoded for every caller
            head = b'{"notice":' + json.dumps(notice).encode() + b"," + head[1:]
        return head, body, tail

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

    def _encoded(self, written_at: float, text: str) -> tuple[bytes, bytes, bytes]:
        """The answer line for a resolution text: (head, the text encoded, tail).

        Encoded once per pass and text, and queued by reference. Not once per ask: 200
        kernels asking for a resolution of a few MiB would encode it 200 times; and not
        joined: the join would be another copy of it.
        """
        if self._answers and next(iter(self._answers))[0] != written_at:
            self._answers.clear()
        key = (written_at, id(text))
        found = self._answers.get(key)
        if found is None or found[0] is not text:
            head = b'{"ok":true,"written_at":' + json.dumps(written_at).encode() + b',"resolution":'
            found = self._answers[key] = (text, (head, text.encode(), b"}\n"))
        return found[1]
