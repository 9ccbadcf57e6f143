"""The simulated GPU's registrar: host PIDs for processes in containers, as a real driver lists.

A real driver lists host PIDs, whatever PID namespace a process runs in, and forgets a process
when it ends. A kernel's mirror in a container knows only its in-container PID, and cannot test
whether a host PID still runs. The registrar, run on the host (``python -m jax_nbmem.simgpu
registrar --state FILE``, as root), closes that gap through a Unix socket beside the state file
(``FILE.sock``):

* a process connects and keeps the connection open; at once the registrar reads the caller's
  host PID off the socket (``SO_PEERCRED``: the kernel translates it across namespaces) and
  answers one line, ``{"ok": true, "pid": HOST_PID, "pidns": INODE, "pid_in_ns": PID,
  "start": TICKS}`` (``start``: when HOST_PID started, for the lines' ``start=``; null unread)
  (``pidns``: the registrar's PID namespace, the one HOST_PID belongs to);
* the mirror writes its lines with that PID and ``pidns=INODE`` (see ``STATE_FORMAT``);
* when the connection closes (the process ended, however: its descriptors close with it), the
  registrar removes the lines of that PID in its namespace, as a driver forgets a process;
* a caller may ask ``{"op": "pid", "pid": N}``: the host PID of the registered process whose
  PID is N in the caller's own namespace (what ``tenant`` in a container waits for).

It also looks over its namespace's lines every few seconds and removes those of processes that
no longer run (judged here, on the host): what a registrar that was down could not see close.
Like the rest of the simulator it is a stand-in for tests and demos, not a boundary: anyone who
may write the state file may write any line.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from jax_nbmem.rootfiles import UnsafeFile, lock_file
from jax_nbmem.simgpu.liveness import process_start, running_since
from jax_nbmem.simgpu.registration import (
    LINE_BYTES,
    RegistrarError,
    Registration,
    register,
    send,
    socket_path,
)
from jax_nbmem.simgpu.state import SimState, StateError

__all__ = [
    "Registrar",
    "RegistrarError",
    "Registration",
    "register",
    "socket_path",
]

_SWEEP_S = 5.0
_TICK_S = 1.0


def _pid_namespace(pid: int | str = "self") -> int | None:
    """The inode of a process's PID namespace; None when it cannot be read."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def _innermost_pid(pid: int) -> int | None:
    """The PID the process has in its own namespace (the last entry of NSpid), or None."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class _Caller:
    pid: int
    pidns: int | None
    pid_in_ns: int | None
    pending: bytes = b""


class Registrar:
    """The host side: accepts registrations and forgets the lines of processes that ended."""

    def __init__(self, state_path: str | os.PathLike[str], log=None) -> None:
        self.state_path = Path(state_path)
        self.socket_path = socket_path(state_path)
        self.pidns = _pid_namespace()
        self._log = log or (lambda text: print(f"jax_nbmem registrar: {text}", file=sys.stderr))
        self._callers: dict[socket.socket, _Caller] = {}
        self._forget: set[int] = set()  # host PIDs whose lines are still to be removed
        self._said: str | None = None
        self._stop = threading.Event()
        self._listener: socket.socket | None = None

    # --- Setting up and stopping ------------------------------------------------------------

    def listen(self) -> Registrar:
        """Check the state file and bind the socket; raises RegistrarError saying why not."""
        if self.pidns is None:
            raise RegistrarError("/proc/self/ns/pid cannot be read: is /proc mounted?")
        if not self.state_path.exists():
            raise RegistrarError(f"{self.state_path}: no such state file")
        try:
            SimState.read(self.state_path)
        except StateError as error:
            raise RegistrarError(f"{error}: fix it first") from None
        try:
            serving = register(self.state_path, timeout=1.0)
        except RegistrarError:
            serving = None  # a dead registrar's socket, or none
        if serving is not None:
            serving.close()
            raise RegistrarError(f"a registrar already serves {self.state_path}")
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(os.lstat(self.socket_path).st_mode):
                raise RegistrarError(f"{self.socket_path} exists and is not a socket")
            self.socket_path.unlink()  # a dead registrar's
        self._lock_file_for_all()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Every user's processes register: the socket is made 0666 by bind itself, under a
        # umask of 0111. A chmod by its name after bind would follow whatever a user put at
        # that name meanwhile (the folder is everyone's).
        umask = os.umask(0o111)
        try:
            listener.bind(os.fspath(self.socket_path))
        finally:
            os.umask(umask)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        return self

    def _lock_file_for_all(self) -> None:
        """The state's lock, there and a regular file: never made or changed through a link.

        In a folder anyone writes (shared-setup's), one that is not a regular file of root's
        (a user's link, FIFO or file) is replaced by root's own, 0666 by ``fchmod``.
        """
        lock = f"{self.state_path}.lock"
        shared = bool(stat.S_IMODE(os.stat(self.state_path.parent).st_mode) & 0o002)
        try:
            os.close(lock_file(lock, shared_mode=0o666 if shared else None))
        except UnsafeFile as error:
            raise RegistrarError(str(error)) from None

    def stop(self) -> None:
        """Ask :meth:`serve` to return (from any thread or a signal handler)."""
        self._stop.set()

    def close(self) -> None:
        """Stop listening and remove the socket; registered lines stay (their mirrors come back)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        for sock in list(self._callers):
            sock.close()
        self._callers.clear()

    # --- The loop ---------------------------------------------------------------------------

    def serve(self) -> None:
        """Serve until :meth:`stop`; every few seconds, forget what ended unseen."""
        assert self._listener is not None, "listen() first"
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        next_sweep = 0.0
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(_TICK_S):
                    if key.fileobj is self._listener:
                        self._accept(selector)
                    else:
                        self._receive(selector, key.fileobj)  # type: ignore[arg-type]
                if time.monotonic() >= next_sweep:
                    self._sweep()
                    next_sweep = time.monotonic() + _SWEEP_S
                self._remove_forgotten()
        finally:
            selector.close()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        try:
            sock, _ = self._listener.accept()  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, _uid, _gid = struct.unpack("3i", creds)
        try:
            if pid <= 0:
                # The caller's process is not visible from here: the registrar is not on the host.
                send(sock, {"ok": False, "reason": "the registrar cannot see your process: "
                             "run it in the host's PID namespace"})  # fmt: skip
                sock.close()
                return
            caller = _Caller(pid, _pid_namespace(pid), _innermost_pid(pid))
            # start: when the host PID started, for its lines' start= (a reused PID is not it).
            send(sock, {"ok": True, "pid": pid, "pidns": self.pidns, "pid_in_ns": caller.pid_in_ns,
                        "start": process_start(pid)})  # fmt: skip
        except OSError:
            sock.close()
            return
        sock.setblocking(False)
        self._callers[sock] = caller
        self._forget.discard(pid)  # a PID reused, or a mirror back after our restart
        selector.register(sock, selectors.EVENT_READ)

    def _receive(self, selector: selectors.BaseSelector, sock: socket.socket) -> None:
        caller = self._callers[sock]
        try:
            chunk = sock.recv(LINE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._hang_up(selector, sock)
            return
        caller.pending += chunk
        while b"\n" in caller.pending:
            line, caller.pending = caller.pending.split(b"\n", 1)
            if not self._answer(sock, caller, line):
                self._hang_up(selector, sock)
                return
        if len(caller.pending) > LINE_BYTES:
            with contextlib.suppress(OSError):
                send(sock, {"ok": False, "reason": f"a line longer than {LINE_BYTES} bytes"})
            self._hang_up(selector, sock)

    def _answer(self, sock: socket.socket, caller: _Caller, line: bytes) -> bool:
        """Answer one request; False to hang up on a caller who sent something unreadable."""
        try:
            request = json.loads(line)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            answer, keep = {"ok": False, "reason": "not a JSON object"}, False
        elif request.get("op") == "pid" and isinstance(request.get("pid"), int):
            answer, keep = self._lookup(caller, request["pid"]), True
        else:
            answer, keep = {"ok": False, "reason": "unknown request (op: pid)"}, True
        try:
            sock.setblocking(True)
            sock.settimeout(1.0)
            send(sock, answer)
            sock.setblocking(False)
        except OSError:
            return False
        return keep

    def _lookup(self, caller: _Caller, pid: int) -> dict:
        if caller.pidns is None:
            return {"ok": False, "reason": "the registrar cannot read your PID namespace"}
        for other in self._callers.values():
            if other.pidns == caller.pidns and other.pid_in_ns == pid:
                return {"ok": True, "pid": other.pid}
        return {"ok": False, "reason": f"no registered process {pid} in your PID namespace"}

    def _hang_up(self, selector: selectors.BaseSelector, sock: socket.socket) -> None:
        caller = self._callers.pop(sock)
        selector.unregister(sock)
        sock.close()
        if not any(other.pid == caller.pid for other in self._callers.values()):
            self._forget.add(caller.pid)

    # --- Forgetting what ended ----------------------------------------------------------------

    def _remove_forgotten(self) -> None:
        registered = {caller.pid for caller in self._callers.values()}
        self._forget -= registered
        if not self._forget:
            return
        forget = set(self._forget)

        def remove(state: SimState) -> None:
            for pid in forget:
                state.remove_process(pid, self.pidns)

        if self._edit(remove):
            self._forget -= forget

    def _sweep(self) -> None:
        """Remove this namespace's lines of processes that no longer run (judged here)."""
        registered = {caller.pid for caller in self._callers.values()}

        def remove_ended(state: SimState) -> None:
            for proc in state.processes():
                ended = proc.pidns == self.pidns and proc.pid not in registered
                if ended and not running_since(proc.pid)[0]:
                    state.remove_process(proc.pid, self.pidns)

        self._edit(remove_ended)

    def _edit(self, change) -> bool:
        """Change the state under its lock; a state with a problem is said once and waited out."""
        try:
            with SimState.update(self.state_path) as state:
                change(state)
        except (StateError, OSError) as error:
            if str(error) != self._said:
                self._log(f"waiting for a good state file: {error}")
            self._said = str(error)
            return False
        self._said = None
        return True


def run(state_path: str | os.PathLike[str]) -> int:
    """``registrar --state FILE``: serve until SIGTERM or SIGINT; 1 and why when it cannot."""
    registrar = Registrar(state_path)
    try:
        registrar.listen()
    except (RegistrarError, OSError) as error:
        print(f"jax_nbmem registrar: {error}", file=sys.stderr)
        return 1
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: registrar.stop())
    print(f"jax_nbmem registrar: serving {registrar.state_path} at {registrar.socket_path}",
          flush=True)  # fmt: skip
    try:
        registrar.serve()
    finally:
        registrar.close()
    return 0


def add_parser(commands, name: str) -> None:
    """The ``registrar`` subcommand's arguments."""
    command = commands.add_parser(
        name,
        help="as root, on the host: give processes in containers (PID namespaces) their host "
        "PIDs on the simulated GPU, as a real driver lists them, and forget a process when it "
        "ends (a Unix socket beside the state file, STATE.sock)",
        description="Listen at STATE.sock. A process that connects is told its host PID (read "
        "off the socket: SO_PEERCRED) and the host's PID namespace; kernels' mirrors write "
        "their lines with both (pidns=INODE). When its connection closes (the process ended, "
        "however) its lines are removed. Runs until SIGTERM or SIGINT, then removes the socket.",
    )
    command.add_argument(
        "--state",
        required=True,
        help="the state file (it must exist and be good: see `check`)",
    )


def main_from_args(args) -> int:
    """Run the parsed ``registrar`` subcommand."""
    return run(args.state)
