"""One caller's connection to the node agent, and its bounded queue of answers.

An answer is queued as views of bytes, not copied: the node's resolution (up to 32 MiB) is
encoded once per pass and every caller's queue refers to that one copy, so a caller that does
not read costs the agent a reference, not its answer's size. The queue is bounded: at most
:data:`MAX_QUEUED_ANSWERS` answers not fully sent (an honest kernel reads each answer before
it sends its next line), and an answer that has not moved for the server's write limit gets
its reader dropped (:meth:`Connection.stalled`).
"""

from __future__ import annotations

import socket
import time
from collections import deque
from dataclasses import dataclass, field

from jax_nbmem.agent.binding import Binding

__all__ = ["MAX_QUEUED_ANSWERS", "Connection"]

MAX_QUEUED_ANSWERS = 2


@dataclass
class Connection:
    """One kernel's connection to the agent (Unix or TCP)."""

    sock: socket.socket
    number: int
    pid: int
    uid: int
    accepted_at: float
    inbox: bytearray
    group: tuple = ()  # what its limits count (see .admission)
    binding: Binding | None = None  # the process it speaks for (see .binding)
    line_since: float | None = None
    proven: bool = False
    closing: bool = False
    busy: bool = False  # a line of its is being judged (see .lookups)
    peer: tuple | None = None  # TCP: (address, port) of each end, the caller's first
    holders: tuple[Binding, ...] = ()  # TCP: the host processes holding the caller's socket
    outbox: deque = field(default_factory=deque)  # (memoryview, ends an answer)
    counted_pid: int = 0  # the host PID its per-PID count is under (0: none)
    queued: int = 0  # answers not fully sent
    moved_at: float = 0.0  # when its queue last moved (or got its first answer)

    def queue(self, *parts: bytes) -> bool:
        """Queue one answer made of ``parts``; False when it already has too many unread."""
        if self.queued >= MAX_QUEUED_ANSWERS:
            return False
        if not self.outbox:
            self.moved_at = time.monotonic()
        for number, part in enumerate(parts, 1):
            self.outbox.append((memoryview(part), number == len(parts)))
        self.queued += 1
        return True

    def flush(self) -> bool:
        """Send what the socket takes now; False when the connection broke."""
        while self.outbox:
            view, ends = self.outbox[0]
            try:
                sent = self.sock.send(view)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if sent:
                self.moved_at = time.monotonic()
            if sent < len(view):
                self.outbox[0] = (view[sent:], ends)
                return True
            self.outbox.popleft()
            self.queued -= ends
        return True

    def stalled(self, now: float, limit_s: float) -> bool:
        """Whether answers wait and none of their bytes moved for ``limit_s``."""
        return bool(self.outbox) and now - self.moved_at > limit_s

    def unread(self) -> int:
        """Bytes queued and not sent yet."""
        return sum(len(view) for view, _ in self.outbox)
