"""A connection bound to the process it proved, so that a reused PID proves nothing.

A PID names a process only while that process lives: once it ends, the number goes to the next
process made (``pid_max`` is 32,768 on many hosts). A connection kept open after its process
ended (handed to a child, say) must not prove the process that gets the number next. So each
connection is bound, when the agent first learns its host PID, to that very process (as
polkit's subject is a PID *with* its start time):

- a pidfd, where the kernel gives one: ``SO_PEERPIDFD`` on a Unix socket (Linux 6.5; Python
  3.11 has no constant for it: 77) names the process that connected, whatever its PID is now;
  for a TCP caller, ``pidfd_open`` of the host PID found holding its socket, kept only if the
  process's start is still the one read before it (else the PID was reused in between). A
  pidfd turns readable when its process ends: the agent closes the connection then.
- and always its start ticks (``/proc/PID/stat`` field 22), read at the same moment, which is
  all there is where no pidfd can be had.

:meth:`Binding.ended` is asked whenever the connection speaks and whenever its proof is used;
it reads one pidfd poll, or one ``stat`` file.
"""

from __future__ import annotations

import os
import select
import socket
from dataclasses import dataclass

from jax_nbmem.agent.hostview import HostViewer

__all__ = ["SO_PEERPIDFD", "Binding", "bind_tcp", "bind_unix"]

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)
PROCESS_ENDED = "the process that opened this connection has ended"


@dataclass
class Binding:
    """The process a connection speaks for: host PID, start ticks, and a pidfd or None."""

    pid: int
    start_ticks: int
    pidfd: int | None = None

    def ended(self, viewer: HostViewer) -> bool:
        """Whether the process is gone (its PID now free, or another process's)."""
        if self.pidfd is not None:
            return _readable(self.pidfd)
        return viewer.start_ticks(self.pid) != self.start_ticks

    def close(self) -> None:
        """Close the pidfd (a second call is a no-op)."""
        fd, self.pidfd = self.pidfd, None
        if fd is not None:
            os.close(fd)


def _readable(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def bind_unix(sock: socket.socket, pid: int, viewer: HostViewer, *, pidfd: bool = True):
    """The Binding of a Unix socket's peer (host PID ``pid``); or None when it has ended.

    ``pidfd=False``: start ticks alone (as on a kernel without ``SO_PEERPIDFD``).
    """
    fd = None
    if pidfd:
        try:
            fd = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError:
            fd = None  # an older kernel (ENOPROTOOPT), or the peer is gone (ESRCH)
    return _bound(pid, viewer, fd)


def bind_tcp(pid: int, viewer: HostViewer, *, pidfd: bool = True) -> Binding | None:
    """The Binding of host PID ``pid`` (found holding a TCP caller's socket); None if ended."""
    fd = None
    if pidfd and hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return None if _gone(pid, viewer) else _bound(pid, viewer, None)
    return _bound(pid, viewer, fd)


def _gone(pid: int, viewer: HostViewer) -> bool:
    return viewer.start_ticks(pid) is None


def _bound(pid: int, viewer: HostViewer, fd: int | None) -> Binding | None:
    ticks = viewer.start_ticks(pid)
    # Read after the pidfd was had: if its process still lives now, the ticks are its own.
    if ticks is None or (fd is not None and _readable(fd)):
        if fd is not None:
            os.close(fd)
        return None
    return Binding(pid, ticks, fd)
