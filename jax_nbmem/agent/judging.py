"""How the node agent judges a line and answers it (a part of :class:`~.server.AgentServer`).

The serving thread parses a line and hands its judgement to a look-up worker
(:mod:`.lookups`): the worker checks that the connection's process still lives
(:mod:`.binding`), finds a TCP caller's process, and proves the beacon or reads the
resolution; its :class:`~.tcp.Verdict` comes back to the serving thread, which answers,
counts and closes. The connection's next line waits until then, so its answers keep their
order. :meth:`Judging._expire` lets go of connections that stall, prove nothing in time, or
whose process ended where no pidfd says so.
"""

from __future__ import annotations

import json
import logging
import os
import selectors

from jax_nbmem.agent.binding import PROCESS_ENDED
from jax_nbmem.agent.connection import Connection
from jax_nbmem.agent.tcp import MAX_LINE_BYTES, Verdict
from jax_nbmem.text import printable

__all__ = ["MAX_ANSWER_BYTES", "RESOLUTION_REQUEST", "Judging", "release"]

log = logging.getLogger("jax_nbmem")

# A resolution answer may be long (8 GPUs x 200 kernels' beacons); longer is refused.
MAX_ANSWER_BYTES = 32 << 20
RESOLUTION_REQUEST = "resolution"
_SWEEP_EVERY_S = 2.0  # how often bindings without a pidfd are checked


class Ended:
    """A connection's pidfd in the selector: readable once its process ended."""

    __slots__ = ("connection",)

    def __init__(self, connection: Connection) -> None:
        self.connection = connection


class Judging:
    """Lines to verdicts to answers (its state is the server's)."""

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
        connection.busy, connection.line_since = True, None
        self.lookups.submit(connection.group, connection,
                            lambda: self._judge(connection, content))  # fmt: skip

    def _judge(self, connection: Connection, content: dict) -> Verdict:
        """What to answer ``content`` (on a look-up worker: it reads the host's ``/proc``)."""
        if connection.peer is not None:
            reason = self._holders(connection)
            if reason is not None:
                return Verdict(reason, close=True)
        elif connection.binding.ended(self.registry.viewer):
            return Verdict(PROCESS_ENDED, close=True)
        if content.get("request") == RESOLUTION_REQUEST:
            return self._resolution_verdict(connection, content.get("since"))
        reason = self._register(connection, content)
        return Verdict(reason, close=reason == PROCESS_ENDED, proven=reason is None)

    def _register(self, connection: Connection, content: dict) -> str | None:
        """Prove ``content`` for the caller's host PID (over TCP: one holder of its socket)."""
        if connection.peer is None:
            binding = connection.binding
            return self.registry.register(binding.pid, connection.uid, content,
                                          connection.number, start_ticks=binding.start_ticks,
                                          socket_uid=connection.uid)  # fmt: skip
        reason = None
        for holder in connection.holders:  # after a fork several hold it: the claims say which
            seen = self.registry.viewer.view(holder.pid)
            uid = seen.uid if seen is not None and seen.uid is not None else -1
            reason = self.registry.register(holder.pid, uid, content, connection.number,
                                            start_ticks=holder.start_ticks)  # fmt: skip
            if reason is None:
                connection.pid, connection.uid, connection.binding = holder.pid, uid, holder
                return None
        return reason

    def _delivered(self, connection: Connection, verdict) -> None:
        """A worker's verdict: queued for the serving thread, which is woken."""
        self._done.append((connection, verdict))
        try:
            self._wake[1].send(b"\0")
        except (BlockingIOError, OSError, TypeError):
            pass  # already awake (a full pipe), or stopping

    def _take_verdicts(self) -> None:
        try:
            while self._wake[0].recv(4096):
                pass
        except (BlockingIOError, InterruptedError, OSError):
            pass
        while self._done:
            connection, verdict = self._done.popleft()
            connection.busy = False
            if connection.number not in self._connections:
                release(connection)  # its pidfd was kept for the worker until now
                if self.registry.drop(connection.number):  # proven while it closed
                    self._changed()
                continue
            self._apply(connection, verdict)
            self._lines(connection)

    def _apply(self, connection: Connection, verdict) -> None:
        if not isinstance(verdict, Verdict):  # the look-up failed (logged by the worker)
            verdict = Verdict("the agent could not judge this line", close=False)
        crowded = self._crowded_pid(connection)
        if crowded is not None:
            verdict = Verdict(crowded, close=True)
            if self.registry.drop(connection.number):  # proven on the worker, not kept
                connection.proven = False
                self._changed()
            connection.pid = connection.counted_pid  # counted under none new
        self._count_pid(connection)
        if verdict.reason is not None:
            if connection.proven and self.registry.drop(connection.number):
                connection.proven = False  # what it proved before no longer stands
                self._changed()
            self._refuse(connection, verdict.reason, close=verdict.close)
        elif verdict.proven:
            connection.proven = True
            self._watch_ending(connection)
            self._send(connection, {"ok": True, "pid": connection.pid})
            self._changed()
        else:
            self._send_parts(connection, *self._answer_parts(verdict))

    def _crowded_pid(self, connection: Connection) -> str | None:
        """Why a TCP caller's newly learnt host PID may not have this connection, or None.

        The worker's look-up checked the count too, but the count is the serving thread's:
        a look-up started before the verdict of the same process's previous connection was
        applied saw one too few (and let a fifth connection in).
        """
        pid = connection.pid
        if pid <= 0 or pid == connection.counted_pid:
            return None
        return self._pid_full(pid)

    def _watch_ending(self, connection: Connection) -> None:
        """Over TCP: a pidfd for the proven holder, to close the connection when it ends."""
        binding = connection.binding
        if connection.peer is None or binding.pidfd is not None or not self.peer_pidfd:
            return
        fd = _pidfd_of(binding.pid)
        if fd is None:
            return
        binding.pidfd = fd
        if (
            binding.ended(self.registry.viewer)
            or self.registry.viewer.start_ticks(binding.pid) != binding.start_ticks
        ):  # ended, or the PID was reused before the pidfd was had
            self._refuse(connection, PROCESS_ENDED, close=True)
            return
        self._selector.register(fd, selectors.EVENT_READ, Ended(connection))

    def _refuse(self, connection: Connection, reason: str, *, close: bool) -> None:
        self.refused += 1
        log.info("jax-nbmem agent: refused host PID %d: %s", connection.pid,
                 printable(reason))  # fmt: skip
        self._send(connection, {"ok": False, "reason": reason})
        if close:
            connection.closing = True
            self._close(connection)

    def _send(self, connection: Connection, answer: dict) -> None:
        self._send_parts(connection, json.dumps(answer).encode() + b"\n")

    def _send_parts(self, connection: Connection, *parts: bytes) -> None:
        if sum(map(len, parts)) > MAX_ANSWER_BYTES:
            parts = (json.dumps({"ok": False, "reason": "the answer is too long"}).encode()
                     + b"\n",)  # fmt: skip
        if not connection.queue(*parts):
            log.info("jax-nbmem agent: host PID %d does not read its answers", connection.pid)
            self._close(connection)
            return
        self._flush(connection)

    def _flush(self, connection: Connection) -> None:
        if connection.number not in self._connections:
            return
        if not connection.flush():
            self._close(connection)
            return
        if connection.closing:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if connection.outbox else 0)
        try:
            self._selector.modify(connection.sock, events, connection)
        except (KeyError, ValueError, OSError):
            pass

    def _expire(self, now: float) -> None:
        sweep = now - self._swept_at > _SWEEP_EVERY_S
        if sweep:
            self._swept_at = now
        for connection in list(self._connections.values()):
            if connection.stalled(now, self.write_s):
                log.info("jax-nbmem agent: host PID %d does not read its answers", connection.pid)
                self._close(connection)
            elif connection.line_since is not None and now - connection.line_since > self.line_s:
                self._refuse(connection, f"a line unfinished after {self.line_s:g} s", close=True)
            elif not connection.proven and now - connection.accepted_at > self.first_line_s:
                if not connection.busy:
                    self._refuse(connection, f"nothing proven after {self.first_line_s:g} s",
                                 close=True)  # fmt: skip
            elif sweep and connection.proven and connection.binding.pidfd is None:
                if connection.binding.ended(self.registry.viewer):  # no pidfd to say it
                    self._refuse(connection, PROCESS_ENDED, close=True)


def release(connection: Connection) -> None:
    """Close the pidfds of the processes ``connection`` was bound to."""
    for binding in {id(b): b for b in (connection.binding, *connection.holders) if b}.values():
        binding.close()


def _pidfd_of(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
