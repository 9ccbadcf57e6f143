"""Whether a process a state line names still runs: the one rule, the Python side of it.

A real driver forgets a process the moment it exits. The simulated GPU does the same for a
``proc`` line with ``ends=exit``, by this rule, which the C stand-in follows too
(``process_running`` and ``proc_gone`` in ``nvml_stub.c``; ``jaxNbmemSimLive`` lets the tests
compare the two on the same lines):

* a line without ``ends=exit`` is listed whatever runs (a neighbour that is only a number);
* a line of another PID namespace (``pidns=``, not the caller's) cannot be judged here: it
  stays until the registrar removes it;
* otherwise the line has ended when no process PID runs (none, or a zombie: the driver frees a
  context at exit, before the parent reaps it), or when the process PID that runs started at
  another time than the line's ``start=`` says: the PID was reused, and the new process is not
  the one that held the memory. The start is field 22 of ``/proc/PID/stat`` (clock ticks since
  boot), which a PID keeps for its whole life.

A process that exists but whose ``/proc/PID/stat`` cannot be read (another user's, under
``hidepid``) runs, as far as anyone here can tell: only "no such process" says it ended.
"""

from __future__ import annotations

import os

from jax_nbmem.simgpu.state_format import ProcLine

__all__ = ["line_ended", "own_pid_namespace", "process_start", "running_since"]

_GONE = "gone"  # no such process, or a zombie


def _stat_fields(pid: int) -> list[bytes] | str | None:
    """The fields of ``/proc/PID/stat`` after its command name; "gone"; None: unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            text = stat_file.read()
    except FileNotFoundError:
        return _GONE
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return _GONE
        except OSError:  # EPERM: it exists, another user's
            return None
        return None
    return text[text.rfind(b")") + 2 :].split()


def running_since(pid: int) -> tuple[bool, int | None]:
    """Whether process ``pid`` runs here, and its start (None when it cannot be read)."""
    fields = _stat_fields(pid)
    if fields == _GONE:
        return False, None
    if fields is None:
        return True, None
    if not fields or fields[0] in (b"Z", b"X"):
        return False, None
    # Field 22 of the whole line; the fields here start at field 3 (the state).
    return True, int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def process_start(pid: int | None = None) -> int | None:
    """When process ``pid`` (default: this one) started, in ticks since boot; None: unknown."""
    found, start = running_since(os.getpid() if pid is None else pid)
    return start if found else None


_own_namespace: tuple[int, int | None] | None = None  # (for PID, the inode), as in the C side


def own_pid_namespace() -> int | None:
    """The inode of this process's PID namespace (looked up again in a forked child)."""
    global _own_namespace
    pid = os.getpid()
    if _own_namespace is None or _own_namespace[0] != pid:
        try:
            inode: int | None = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            inode = None
        _own_namespace = (pid, inode)
    return _own_namespace[1]


def line_ended(proc: ProcLine) -> bool:
    """Whether the GPU no longer lists ``proc``, for a caller here (see the module)."""
    if not proc.ends_with_process:
        return False
    if proc.pidns is not None and proc.pidns != own_pid_namespace():
        return False
    runs, start = running_since(proc.pid)
    if not runs:
        return True
    return proc.start is not None and start is not None and start != proc.start
