"""A listener that cannot accept (EMFILE and the like) rests, and says so at a bounded rate.

A selector fires again at once for a listener whose queue still holds a connection; accepting
fails again at once while the process is out of descriptors. Retrying in that loop costs a
core and a log line each time (issue 52: 1.5 million lines in 30 s). :class:`AcceptPause`
takes the listener out of the selector for a while instead (50 ms, doubling to 1 s while it
keeps failing) and logs the failure once, then at most once every ``log_every_s`` with how
many it left unsaid. :meth:`AcceptPause.accept` is the one accept of every listener loop (the
agent's Unix and TCP sides, the exporter's HTTP front): a connection, or None with the failure
already handled.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from typing import Any

from jax_nbmem.text import printable

__all__ = ["AcceptPause"]


class AcceptPause:
    """Rests listeners whose accept failed; see the module."""

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        *,
        first_s: float = 0.05,
        most_s: float = 1.0,
        log_every_s: float = 10.0,
    ) -> None:
        self.log, self.what = log, what
        self.first_s, self.most_s, self.log_every_s = first_s, most_s, log_every_s
        self._resting: dict[Any, tuple[float, Any]] = {}  # listener -> (resume at, its data)
        self._delay = 0.0
        self._said_at = float("-inf")
        self._unsaid = 0
        self.failures = 0

    def accept(
        self, selector: selectors.BaseSelector, listener: socket.socket
    ) -> tuple[socket.socket, Any] | None:
        """One connection from ``listener``: (socket, its address), or None.

        None when nothing waits, or when accepting failed (EMFILE and the like): then the
        listener rests out of ``selector`` and the failure is said, at a bounded rate.
        """
        try:
            accepted = listener.accept()
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as error:
            self.failed(selector, listener, error)
            return None
        self.accepted()
        return accepted

    def failed(self, selector: selectors.BaseSelector, listener: Any, error: OSError) -> None:
        """``listener``'s accept raised ``error``: out of the selector for a while, said."""
        now = time.monotonic()
        self.failures += 1
        self._delay = min(self.most_s, self._delay * 2 if self._delay else self.first_s)
        try:
            data = selector.get_key(listener).data
            selector.unregister(listener)
        except (KeyError, ValueError):
            return
        self._resting[listener] = (now + self._delay, data)
        if now - self._said_at >= self.log_every_s:
            more = f" ({self._unsaid} more since last said)" if self._unsaid else ""
            said = f"{self.what}: accept failed: {error}; resting {self._delay:.2f} s{more}"
            self.log.warning("%s", printable(said))
            self._said_at, self._unsaid = now, 0
        else:
            self._unsaid += 1

    def accepted(self) -> None:
        """An accept worked: the next failure rests the shortest time again."""
        self._delay = 0.0

    def wait_s(self, longest: float) -> float:
        """How long a select may wait so that a resting listener comes back in time."""
        if not self._resting:
            return longest
        soonest = min(at for at, _ in self._resting.values())
        return max(0.0, min(longest, soonest - time.monotonic()))

    def resume(self, selector: selectors.BaseSelector) -> None:
        """Put back the listeners whose rest is over."""
        now = time.monotonic()
        for listener, (at, data) in list(self._resting.items()):
            if at <= now:
                del self._resting[listener]
                if listener.fileno() >= 0:
                    selector.register(listener, selectors.EVENT_READ, data)
