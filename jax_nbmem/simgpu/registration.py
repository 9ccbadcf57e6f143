"""A process's registration with the simulated GPU's registrar (see :mod:`.registrar`).

The client's side: connect to ``STATE.sock``, keep the connection open, and learn this
process's host PID (what the GPU lists) and the host's PID namespace (what its lines say,
``pidns=``); ask for the host PID of another registered process of this namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "LINE_BYTES",
    "RegistrarError",
    "Registration",
    "read_line",
    "register",
    "send",
    "socket_path",
]

LINE_BYTES = 4096


class RegistrarError(Exception):
    """The registrar's socket is there but gave no registration; the message says why."""


def socket_path(state_path: str | os.PathLike[str]) -> Path:
    """Where the registrar of state file ``state_path`` listens: ``STATE.sock`` beside it."""
    return Path(f"{os.fspath(state_path)}.sock")


def send(sock: socket.socket, message: dict) -> None:
    """Send ``message`` as one line of JSON."""
    sock.sendall(json.dumps(message).encode() + b"\n")


def read_line(sock: socket.socket, deadline: float) -> dict:
    """One line of JSON from ``sock`` before ``deadline``; RegistrarError otherwise."""
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RegistrarError("the registrar did not answer in time")
        sock.settimeout(left)
        try:
            chunk = sock.recv(LINE_BYTES)
        except TimeoutError:
            continue
        except OSError as error:
            raise RegistrarError(f"the registrar's connection failed: {error}") from None
        if not chunk:
            raise RegistrarError("the registrar closed the connection")
        data += chunk
        if len(data) > LINE_BYTES:
            raise RegistrarError("the registrar's answer is too long")
    try:
        message = json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        raise RegistrarError("the registrar's answer is not JSON") from None
    if not isinstance(message, dict):
        raise RegistrarError("the registrar's answer is not a JSON object")
    return message


@dataclass
class Registration:
    """This process's registration: its host PID, for as long as the connection stays open."""

    pid: int
    pidns: int
    pid_in_ns: int | None
    _sock: socket.socket = field(repr=False)
    start: int | None = None  # when the host PID started, as the registrar read it; None: unsaid

    def alive(self) -> bool:
        """Whether the registrar still holds this registration (it may have stopped)."""
        try:
            self._sock.setblocking(False)
            return self._sock.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def host_pid(self, pid: int, timeout: float = 2.0) -> int | None:
        """The host PID of registered process ``pid`` of this namespace; None if none is."""
        self._sock.setblocking(True)
        send(self._sock, {"op": "pid", "pid": pid})
        answer = read_line(self._sock, time.monotonic() + timeout)
        found = answer.get("pid") if answer.get("ok") else None
        return found if isinstance(found, int) else None

    def close(self) -> None:
        """Give the registration up (the registrar then removes this process's lines)."""
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def register(state_path: str | os.PathLike[str], timeout: float = 2.0) -> Registration | None:
    """Register this process with the registrar of ``state_path``; None when none listens there.

    None when there is no socket; :class:`RegistrarError` when there is one but it does not
    answer (a registrar that was killed leaves it) or refuses this process, saying why.
    """
    path = socket_path(state_path)
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            raise RegistrarError(f"{path} is not a socket")
    except FileNotFoundError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(os.fspath(path))
        except OSError as error:
            raise RegistrarError(f"no registrar answers at {path}: {error.strerror}") from None
        answer = read_line(sock, time.monotonic() + timeout)
        if not answer.get("ok"):
            raise RegistrarError(f"the registrar refused: {answer.get('reason', 'no reason')}")
        pid, pidns = answer.get("pid"), answer.get("pidns")
        if not isinstance(pid, int) or not isinstance(pidns, int) or pid <= 0 or pidns <= 0:
            raise RegistrarError(f"the registrar's answer makes no sense: {answer}")
        inner, start = answer.get("pid_in_ns"), answer.get("start")
        return Registration(
            pid,
            pidns,
            inner if isinstance(inner, int) else None,
            sock,
            start if isinstance(start, int) and start >= 0 else None,
        )
    except BaseException:
        sock.close()
        raise
