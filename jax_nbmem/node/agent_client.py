"""The kernel's side of the node agent's socket: sending its beacon to be proven.

The node agent (``jax-nbmem exporter --share-dir S``, on the host) listens on
``S/agent/agent.sock``. A kernel connects there and sends its beacon's content, one JSON line
each time it writes its beacon; the agent learns the caller's host PID from the socket itself
(SO_PEERCRED), checks the beacon's ``identity`` against the host's view of that PID, and
answers ``{"ok": true, "pid": <host pid>}`` or ``{"ok": false, "reason": ...}``. The
registration lasts while the connection stays open.

Only the beacon writer's thread uses this (never a cell's path). Each call waits at most
``TIMEOUT_S``; a broken connection is made again at most once every ``RECONNECT_S``; an absent
socket means no agent, silently; any other failure is logged once, never raised.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import time
from typing import Any

from jax_nbmem.text import printable

__all__ = ["AGENT_DIR", "MAX_LINE", "RECONNECT_S", "TIMEOUT_S", "AgentClient", "socket_path"]

log = logging.getLogger("jax_nbmem")

AGENT_DIR = "agent"
RECONNECT_S = 5.0
MAX_LINE = 64 * 1024
TIMEOUT_S = 2.0


def socket_path(share_dir: str) -> str:
    """Where the agent listens, in the share directory ``share_dir``."""
    return os.path.join(share_dir, AGENT_DIR, "agent.sock")


class AgentClient:
    """One connection to the agent, kept open; ``send(content)`` after each beacon write.

    ``proven_pid`` is the host PID the agent last confirmed (None: not proven, or no agent);
    ``last_reason`` why the last registration failed, if it did.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        self._last_attempt = -RECONNECT_S
        self._pending = b""
        self._logged: set[str] = set()
        self.proven_pid: int | None = None
        self.last_reason: str | None = None

    def send(self, content: dict[str, Any], *, resend: bool = False) -> None:
        """Send ``content`` as a line (connecting first when need be); never raises.

        ``resend``: only when the connection had to be made again (the agent forgot us).
        """
        line = self._line(content)
        if line is None:
            return
        if self._sock is not None and self._closed_by_agent():
            self._drop()
        if self._sock is None:
            if not self._connect():
                return
        elif resend:
            return
        try:
            self._sock.sendall(line)
            self._read_reply()
        except OSError as exc:
            self._once("send", f"jax_nbmem: the node agent's socket failed: {exc}")
            self._drop()

    def keep_alive(self, content: dict[str, Any] | None) -> None:
        """Between writes: notice a closed connection and register ``content`` again."""
        if content is not None:
            self.send(content, resend=True)

    def close(self) -> None:
        """Close the connection (the agent forgets the registration); a second call is a no-op."""
        self._drop()

    def _connect(self) -> bool:
        now = time.monotonic()
        if now - self._last_attempt < RECONNECT_S:
            return False
        self._last_attempt = now
        if not os.path.exists(self.path):
            return False  # no agent on this node: nothing to say
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_S)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            self._once("connect", f"jax_nbmem: cannot reach the node agent at {self.path}: {exc}")
            return False
        self._sock, self._pending = sock, b""
        return True

    def _line(self, content: dict[str, Any]) -> bytes | None:
        """``content`` as the line the agent reads, or None (said once) when it cannot be."""
        try:
            line = json.dumps(content, separators=(",", ":")).encode("utf-8") + b"\n"
        except (TypeError, ValueError) as exc:
            self._once("encode", f"jax_nbmem: beacon not sent to the node agent: {exc}")
            return None
        if len(line) > MAX_LINE:
            self._once("size", "jax_nbmem: beacon too large for the node agent; not sent")
            return None
        return line

    def _read_reply(self) -> None:
        self._registered(self._answer(MAX_LINE, TIMEOUT_S))

    def _answer(self, limit: int, timeout: float) -> bytes:
        """The agent's next answer line (without its newline); OSError when it breaks."""
        self._sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            if time.monotonic() > deadline:
                raise TimeoutError("the node agent did not answer in time")
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                raise ConnectionResetError("the node agent closed the connection")
            self._pending += chunk
            if len(self._pending) > limit + 1:
                raise ConnectionResetError("the node agent's answer is too long")
        line, self._pending = self._pending.split(b"\n", 1)
        return line

    def _registered(self, line: bytes) -> None:
        """Keep what the agent answered to a beacon: the host PID it proved, or its refusal."""
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise ConnectionResetError("the node agent's answer is not a JSON object")
        if reply.get("ok") is True and isinstance(reply.get("pid"), int):
            self.proven_pid, self.last_reason = reply["pid"], None
        else:
            self.proven_pid = None
            self.last_reason = str(reply.get("reason") or "refused")[:500]
            why = f"jax_nbmem: the node agent did not register this kernel: {self.last_reason}"
            self._once(f"refused:{self.last_reason}", why)

    def _closed_by_agent(self) -> bool:
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
            if readable:
                return self._sock.recv(4096, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True
        return False

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        self.proven_pid = None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _once(self, what: str, message: str) -> None:
        if what not in self._logged:
            self._logged.add(what)
            log.info("%s", printable(message))
