"""A kernel's side of the node agent over TCP: for pods without the share directory.

On Kubernetes users' pods have neither the host's PID namespace nor a ``hostPath`` share
directory (the baseline Pod Security Standard forbids both), so a kernel reaches the node
agent (``jax-nbmem exporter --agent-listen HOST:PORT``) at the node's address, which the pod
gets from the downward API:

- ``$JAX_NBMEM_AGENT_ADDRESS``: ``HOST:PORT`` (``[v6]:PORT``); else
- ``$JAX_NBMEM_AGENT_HOST`` (``valueFrom: fieldRef: status.hostIP``) and
  ``$JAX_NBMEM_AGENT_PORT`` (default 9842).

The lines are the Unix socket's (docs/containers.md, "The node agent"): the kernel's beacon,
answered ``{"ok": true, "pid": <host pid>}`` or ``{"ok": false, "reason": ...}``. The agent
proves the caller by the host process that holds this very socket, never by what it says. On
the same connection the kernel asks ``{"request": "resolution", "since": W}`` (at most every
``RESOLUTION_EVERY_S``; W: when the one it has was written, so an unchanged one is not sent
again) and keeps the answer: the node's resolution as this pod's namespace may see it, which
:func:`parsed_network_resolution` hands to the resolution's reader in place of
``S/agent/resolution.json``. An answer may carry the culler's notice for this kernel (``"notice":
{...}``, what ``S/jax_nbmem-cull-<key>.json`` says on a host with a share directory): kept, with
each answer, for :func:`network_notice`; an answer without one, or a lost connection, clears it.

:class:`TcpAgentClient` has :class:`~.agent_client.AgentClient`'s interface (``send``,
``keep_alive``, ``close``, ``proven_pid``, ``last_reason``): only the beacon writer's thread
uses it, never a cell's path. Each exchange waits at most a few seconds; a broken connection
is made again at most once every ``RECONNECT_S``; a failure is logged once, never raised.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from jax_nbmem.node.agent_client import MAX_LINE, RECONNECT_S, TIMEOUT_S, AgentClient
from jax_nbmem.text import printable

__all__ = [
    "DEFAULT_PORT",
    "ENV_AGENT_ADDRESS",
    "ENV_AGENT_HOST",
    "ENV_AGENT_PORT",
    "RECONNECT_S",
    "RESOLUTION_EVERY_S",
    "TcpAgentClient",
    "agent_address",
    "network_absence",
    "network_client",
    "network_configured",
    "network_notice",
    "network_problem",
    "network_resolution",
    "parsed_network_resolution",
]

log = logging.getLogger("jax_nbmem")

ENV_AGENT_ADDRESS = "JAX_NBMEM_AGENT_ADDRESS"
ENV_AGENT_HOST = "JAX_NBMEM_AGENT_HOST"
ENV_AGENT_PORT = "JAX_NBMEM_AGENT_PORT"
DEFAULT_PORT = 9842
RESOLUTION_EVERY_S = 2.0
_MAX_ANSWER = 32 << 20
_ANSWER_TIMEOUT_S = 5.0
_HEAD, _MIDDLE, _TAIL = b'{"ok":true,"written_at":', b',"resolution":', b"}"
_NOTICE_HEAD = b'{"notice":'
_MAX_NOTICE = 64 * 1024
T = TypeVar("T")

# The last resolution received, by any client of this process: [data, source, serial].
_latest: list = [None, "", 0]
_parsed: list = [0, None]  # [serial, what parse made of it]
# Why the last exchange with the agent failed, by any client of this process (None: it went well).
_trouble: list = [None]
# The culler's notice for this kernel in the agent's last answer (its dict), or None.
_notice: list = [None]
_latest_lock = threading.Lock()


def agent_address(environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """The agent's (host, port) from the environment (see the module); None when unset.

    ValueError when set but malformed.
    """
    environ = os.environ if environ is None else environ
    given = environ.get(ENV_AGENT_ADDRESS, "").strip()
    if given:
        host, sep, port = given.rpartition(":")
        if not sep or not host:
            raise ValueError(f"${ENV_AGENT_ADDRESS} wants HOST:PORT, not {given!r}")
    else:
        host = environ.get(ENV_AGENT_HOST, "").strip()
        port = environ.get(ENV_AGENT_PORT, "").strip() or str(DEFAULT_PORT)
        if not host:
            return None
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the node agent's port must be 1 to 65535, not {port!r}")
    return host, int(port)


def network_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment names a node agent's address (well formed or not)."""
    environ = os.environ if environ is None else environ
    return any(environ.get(name, "").strip() for name in (ENV_AGENT_ADDRESS, ENV_AGENT_HOST))


def network_client(environ: Mapping[str, str] | None = None) -> TcpAgentClient | None:
    """A client for the agent the environment names, or None (unset, or malformed: logged)."""
    try:
        address = agent_address(environ)
    except ValueError as error:
        log.warning("jax_nbmem: no node agent: %s", printable(error))
        return None
    return TcpAgentClient(address) if address is not None else None


def network_resolution() -> tuple[bytes, str] | None:
    """The last resolution a client received (its JSON) and where from; None if none yet."""
    with _latest_lock:
        return None if _latest[0] is None else (_latest[0], _latest[1])


def network_problem() -> str | None:
    """Why the last exchange with the node agent failed (unreachable, silent, no resolution).

    None when it went well, or none was tried yet.
    """
    with _latest_lock:
        return _trouble[0]


def network_absence(environ: Mapping[str, str] | None = None) -> str:
    """Why no resolution has come over the network: no address, a malformed one, or a failure."""
    try:
        address = agent_address(environ)
    except ValueError as error:
        return f"the node agent's address is malformed ({error})"
    if address is None:
        return (
            f"no share directory is set, nor the node agent's address (${ENV_AGENT_ADDRESS} or "
            f"${ENV_AGENT_HOST})"
        )
    return network_problem() or f"no resolution from {_source(address)} yet"


def network_notice() -> dict | None:
    """The culler's notice for this kernel, as the node agent last relayed it; None: none.

    Checked by the reader (:func:`~.notices.relayed_notice`): meant for this kernel's key and
    host PID, of its start.
    """
    with _latest_lock:
        return _notice[0]


def _relayed(notice: Any) -> None:
    with _latest_lock:
        _notice[0] = notice if isinstance(notice, dict) else None


def _without_notice(line: bytes) -> tuple[Any, bytes]:
    """(notice, the rest) of ``{"notice": {...}, "ok": true, ...}``; (None, ``line``): none.

    The agent puts the notice before the resolution it encodes once for all callers; a line
    without one first, or a bad one, is given back whole.
    """
    if not line.startswith(_NOTICE_HEAD):
        return None, line
    head = line[len(_NOTICE_HEAD) : len(_NOTICE_HEAD) + _MAX_NOTICE].decode("ascii", "replace")
    try:
        notice, end = json.JSONDecoder().raw_decode(head)
    except ValueError:
        return None, line
    rest = line[len(_NOTICE_HEAD) + end :]
    if not rest.startswith(b","):
        return None, line
    return notice, b"{" + rest[1:]


def parsed_network_resolution(parse: Callable[[bytes, str], T]) -> T | None:
    """``parse(data, source)`` of the last resolution received, made once per resolution."""
    with _latest_lock:
        data, source, serial = _latest
    if data is None:
        return None
    if _parsed[0] != serial:
        _parsed[:] = [serial, parse(data, source)]
    return _parsed[1]


def _split(line: bytes) -> tuple[float | None, bytes | None]:
    """(written_at, the resolution's JSON) of an answer as the agent writes it: no parse."""
    if not (line.startswith(_HEAD) and line.endswith(_TAIL)):
        return None, None
    middle = line.find(_MIDDLE, len(_HEAD), len(_HEAD) + 64)
    if middle < 0:
        return None, None
    try:
        written_at = float(line[len(_HEAD) : middle])
    except ValueError:
        return None, None
    return written_at, line[middle + len(_MIDDLE) : -len(_TAIL)]


def _keep(data: bytes, source: str) -> None:
    with _latest_lock:
        _latest[:] = [data, source, _latest[2] + 1]
        _trouble[0] = None


def _said(problem: str | None) -> None:
    with _latest_lock:
        _trouble[0] = problem


def _failure(source: str, error: OSError) -> str:
    if isinstance(error, TimeoutError):
        return f"{source} did not answer in time"
    return f"the connection to {source} failed ({error.strerror or error})"


def _source(address: tuple[str, int]) -> str:
    host, port = address
    return f"the node agent at {f'[{host}]' if ':' in host else host}:{port}"


class TcpAgentClient(AgentClient):
    """One TCP connection to the agent, kept open (see the module).

    The lines and their answers are the Unix socket's (:class:`~.agent_client.AgentClient`);
    only the connection, and the resolution asked for on it, differ.
    """

    def __init__(self, address: tuple[str, int], resolution_every_s: float = RESOLUTION_EVERY_S):
        super().__init__(_source(address))
        self.address = address
        self.source = self.path  # "the node agent at HOST:PORT", as messages say it
        self.resolution_every_s = resolution_every_s
        self._asked_at = -resolution_every_s
        self.resolution_reason: str | None = None
        self.written_at: float | None = None  # of the resolution it has

    def send(self, content: dict[str, Any], *, resend: bool = False) -> None:
        """Send the beacon ``content`` (connecting first when need be); never raises.

        ``resend``: only when the connection had to be made again (the agent forgot us).
        Then the resolution is asked for when due.
        """
        line = self._line(content)
        if line is None:
            return
        if self._sock is not None and self._closed_by_agent():
            self._drop()
        fresh = False
        if self._sock is None:
            if not self._connect():
                return
            fresh = True
        try:
            if fresh or not resend:
                self._sock.sendall(line)
                self._registered(self._answer(MAX_LINE, TIMEOUT_S))
            self._resolution_when_due()
        except OSError as error:
            self._once("send", f"jax_nbmem: the node agent's connection failed: {error}")
            _said(_failure(self.source, error))
            self._drop()

    def ask_resolution(self) -> bool:
        """Ask for the node's resolution now and keep it; whether one came. Never raises."""
        if self._sock is None:
            return False
        request = {"request": "resolution", "since": self.written_at}
        try:
            self._asked_at = time.monotonic()
            self._sock.sendall(json.dumps(request).encode() + b"\n")
            line = self._answer(_MAX_ANSWER, _ANSWER_TIMEOUT_S)
        except OSError as error:
            self._once("resolution", f"jax_nbmem: the node agent's connection failed: {error}")
            _said(_failure(self.source, error))
            self._drop()
            return False
        notice, rest = _without_notice(line)
        written_at, data = _split(rest)
        if data is None:
            try:
                answer = json.loads(line)
            except ValueError:
                answer = None
            notice = answer.get("notice") if isinstance(answer, dict) else None
            if isinstance(answer, dict) and answer.get("unchanged") is True:
                self.resolution_reason = None
                _said(None)
                _relayed(notice)
                return True  # the one it has is the newest
            if not isinstance(answer, dict) or not isinstance(answer.get("resolution"), dict):
                why = answer.get("reason") if isinstance(answer, dict) else None
                self.resolution_reason = str(why or "the agent's answer is no resolution")[:500]
                _said(f"{self.source} sent no resolution: {self.resolution_reason}")
                return False
            written_at, data = answer.get("written_at"), json.dumps(answer["resolution"]).encode()
        self.resolution_reason, self.written_at = None, written_at
        _keep(data, self.source)
        _relayed(notice)
        return True

    def _resolution_when_due(self) -> None:
        if time.monotonic() - self._asked_at >= self.resolution_every_s:
            self.ask_resolution()

    def _connect(self) -> bool:
        now = time.monotonic()
        if now - self._last_attempt < RECONNECT_S:
            return False
        self._last_attempt = now
        try:
            sock = socket.create_connection(self.address, timeout=TIMEOUT_S)
        except OSError as error:
            why = f"cannot reach {self.source}: {error.strerror or error}"
            self._once("connect", f"jax_nbmem: {why}")
            _said(why)
            return False
        self._sock, self._pending = sock, b""
        return True

    def _drop(self) -> None:
        super()._drop()
        _relayed(None)  # the agent relays notices to a proven connection only
