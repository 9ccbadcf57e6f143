"""Running Jupyter servers: which kernel serves which notebook, how idle it is, shutting it down.

Servers are found through the runtime files they write (``jpserver-*.json``; ``nbserver-*.json``
from the classic notebook server) and asked over HTTP with the standard library only. A server's
token travels only in the ``Authorization`` header, and only to this machine: a server is asked
through loopback (or its unix socket), never at another address, where the token would cross
the network. It is kept out of every repr, message and exception this module makes.

A slow, dead or trickling server costs at most the query's time budget, whatever it does: each
request runs against one deadline (a watchdog closes its socket when the deadline passes, so a
server that sends a byte now and then cannot stretch it), each server has at most one request
in flight, and no thread or socket outlives the query.
"""

from __future__ import annotations

import glob
import http.client
import ipaddress
import json
import os
import signal
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import psutil
from jupyter_core.paths import jupyter_runtime_dir

from jax_nbmem.node.beacons import read_small_file
from jax_nbmem.node.exchange import exchange
from jax_nbmem.node.unix_names import unix_user_text, who_text

__all__ = [
    "JupyterServer",
    "ServerKernel",
    "SessionIndex",
    "ShutdownResult",
    "current_user",
    "epoch_seconds",
    "find_servers",
    "kernel_sessions",
    "notebook_path",
    "read_runtime_file",
    "shutdown_kernel",
    "terminate",
]

# The sampler may ask every second or so; a server's sessions change far less often than that.
_CACHE_SECONDS = 3.0
# An answer bigger than this is not a list of kernels: it is cut off, not read to the end.
_MAX_BODY_BYTES = 8 << 20
_WILDCARDS = ("", "0.0.0.0", "::", "*")
# A runtime file is a few hundred bytes of JSON; a bigger one is not read at all.
MAX_RUNTIME_FILE_BYTES = 64 << 10


class ServerError(OSError):
    """A request to a Jupyter server that failed or was refused; the message says why."""


@dataclass(frozen=True)
class JupyterServer:
    """A Jupyter server found through its runtime file; ``token`` never shows in its repr.

    ``url`` is what the runtime file says (for messages); requests go to ``connect_host`` and
    ``port`` on loopback, or through the unix socket ``sock``. ``refused`` says why the server
    is not asked at all (it listens at an address that is not this machine's loopback).
    """

    url: str
    root_dir: str | None
    pid: int | None
    runtime_file: str
    token: str = field(default="", repr=False, compare=False)
    connect_host: str | None = None
    port: int | None = None
    sock: str | None = None
    secure: bool = False
    base_path: str = "/"
    refused: str | None = None
    host: str = ""  # the address or name its runtime file says it listens at, as written

    def request(self, method: str, endpoint: str, timeout: float) -> object:
        """Send one API request with the token as a header; return the decoded JSON (or None).

        The whole request, connection and every byte of the answer included, ends within
        ``timeout`` seconds or raises TimeoutError. Raises ServerError for a refused server
        or an HTTP error status.
        """
        if self.refused:
            raise ServerError(self.refused)
        headers = {"Authorization": f"token {self.token}"} if self.token else {}
        try:
            answer = exchange(self._connection(timeout), method, self.base_path + endpoint,
                              headers, timeout, max_body=_MAX_BODY_BYTES)  # fmt: skip
        except TimeoutError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise ServerError(f"{type(exc).__name__}: {exc}") from None
        if answer.status >= 300:  # a redirect is not followed: the token goes nowhere else
            raise ServerError(f"HTTP {answer.status} {answer.reason}")
        return json.loads(answer.body) if answer.body else None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.sock:
            return _UnixConnection(self.sock, timeout)
        if self.secure:  # loopback only: the certificate is the server's own, not checked
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            return http.client.HTTPSConnection(
                self.connect_host, self.port, timeout=timeout, context=context
            )
        return http.client.HTTPConnection(self.connect_host, self.port, timeout=timeout)

    def describe_error(self, exc: BaseException) -> str:
        """Say why a request failed, with the token (should any library echo it) blotted out."""
        if self.refused:
            return f"{self.url} not asked: {self.refused}"
        text = f"{self.url} did not answer: {type(exc).__name__}: {exc}"
        return text.replace(self.token, "***") if self.token else text


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Jupyter server's unix socket (``--ServerApp.sock``)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _loopback_host(host: str) -> tuple[str | None, str | None]:
    """Where to reach a server that says it listens at ``host``: (address, None) or (None, why).

    Loopback names and addresses are asked as they are; a server listening on every address
    is asked through loopback; any other address is not asked.
    """
    name = host.strip("[]").lower()
    if name in _WILDCARDS:
        return ("::1" if name == "::" else "127.0.0.1"), None
    if name in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return "127.0.0.1", None
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    if address is not None and address.is_loopback:
        return str(address), None
    return None, (
        f"it listens at {host}, not on this machine's loopback, and its token would cross the "
        "network in the request"
    )


@dataclass(frozen=True)
class ServerKernel:
    """One kernel as its Jupyter server sees it; ``notebook`` is None unless it serves one.

    ``notebook`` is the notebook's full path; ``path`` the path as the server shows it
    (relative to its root directory). ``pid`` is its process where the server itself says so
    (its provisioner: the server extension's own view); None from the HTTP API, which does not.
    """

    kernel_id: str
    server_url: str
    notebook: str | None
    execution_state: str | None
    last_activity: float | None  # seconds since the epoch; None when the server did not say
    path: str | None = None
    pid: int | None = None

    def idle_s(self, now: float | None = None) -> float | None:
        """Seconds since the kernel's last activity; 0 while busy; None when unknown."""
        if self.execution_state == "busy":
            return 0.0
        if self.last_activity is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.last_activity)


@dataclass(frozen=True)
class SessionIndex:
    """Kernels known to the running Jupyter servers, by kernel id, and the servers that failed."""

    kernels: Mapping[str, ServerKernel]
    unreachable: tuple[str, ...] = ()
    _by_pid: Mapping[int, ServerKernel] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_pid = {k.pid: k for k in self.kernels.values() if k.pid is not None}
        object.__setattr__(self, "_by_pid", by_pid)

    def get(self, kernel_id: str | None) -> ServerKernel | None:
        """The kernel's session, or None when no server answered for it."""
        return self.kernels.get(kernel_id) if kernel_id else None

    def for_pid(self, pid: int) -> ServerKernel | None:
        """The kernel whose process is ``pid``, where its server said its PID; else None.

        A kernel's command line names its id only when it is ipykernel given its connection
        file; its server knows it whatever runs it (another language, a wrapper script).
        """
        return self._by_pid.get(pid)


@dataclass(frozen=True)
class ShutdownResult:
    """What ``shutdown_kernel`` did or would do; ``how``: "server", "signal" or None (refused)."""

    done: bool
    how: str | None
    message: str


def find_servers(
    runtime_dir: str | None = None, owner_uid: int | None = None
) -> list[JupyterServer]:
    """Jupyter servers whose runtime files are in ``runtime_dir`` (default: Jupyter's own).

    Only regular files of ``owner_uid`` (default: this process's user) are read, each as
    :func:`read_runtime_file` says; files whose server process is gone or that cannot be read
    are skipped; a server on a unix socket is reached through it; one at a non-loopback
    address is listed with ``refused`` set and never asked.
    """
    runtime_dir = runtime_dir or _default_runtime_dir()
    servers = []
    for pattern in ("jpserver-*.json", "nbserver-*.json"):
        for path in sorted(glob.glob(os.path.join(runtime_dir, pattern))):
            server = read_runtime_file(path, owner_uid)
            if server is not None:
                servers.append(server)
    return servers


def _default_runtime_dir() -> str:
    # Resolved on every call: $JUPYTER_RUNTIME_DIR may change, and answers are cached per folder.
    return jupyter_runtime_dir()


def read_runtime_file(path: str, owner_uid: int | None = None) -> JupyterServer | None:
    """The server a runtime file describes; None unless it is a regular file of ``owner_uid``.

    ``owner_uid`` defaults to this process's user. The file is opened without following a
    link and without blocking (a FIFO or a device under that name is never waited on), and
    read up to :data:`MAX_RUNTIME_FILE_BYTES`; anything else, or a file whose server process
    is gone, gives None.
    """
    owner_uid = os.geteuid() if owner_uid is None else owner_uid
    read = read_small_file(path, MAX_RUNTIME_FILE_BYTES)
    if read is None or read[1].st_uid != owner_uid:
        return None
    return _server_from(path, read[0])


def _server_from(path: str, data: bytes) -> JupyterServer | None:
    try:
        info = json.loads(data)
        pid = info.get("pid")
        if isinstance(pid, int) and not psutil.pid_exists(pid):
            return None
        sock = info.get("sock") or None
        url = info.get("url") or "http://{}:{}{}".format(
            info.get("hostname", "localhost"), info.get("port", ""), info.get("base_url", "/")
        )
        # Keep scheme, host and base path only: a query string could carry a token.
        parts = urllib.parse.urlsplit(url)
        port = info.get("port") or parts.port
        host = info.get("hostname") or parts.hostname or ""
        base_path = parts.path if parts.path.endswith("/") else parts.path + "/"
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    connect_host, refused = (None, None) if sock else _loopback_host(str(host))
    if not sock and not isinstance(port, int):
        refused = refused or "its runtime file names no port"
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, base_path, "", ""))
    return JupyterServer(
        url=f"http+unix://{sock}{base_path}" if sock else base,
        root_dir=info.get("root_dir") or info.get("notebook_dir"),
        pid=pid if isinstance(pid, int) else None,
        runtime_file=path,
        token=str(info.get("token") or ""),
        connect_host=connect_host,
        port=port if isinstance(port, int) else None,
        sock=str(sock) if sock else None,
        secure=parts.scheme == "https" or bool(info.get("secure")),
        base_path=base_path,
        refused=refused,
        host="" if sock else str(host),
    )


_cache_lock = threading.Lock()
_cache: dict[str, tuple[float, SessionIndex]] = {}
# Runtime files whose server is being asked right now: never a second request to one of them.
_in_flight: set[str] = set()


def kernel_sessions(
    *, runtime_dir: str | None = None, timeout: float = 1.0, max_age: float = _CACHE_SECONDS
) -> SessionIndex:
    """Ask every running Jupyter server for its kernels and notebook sessions.

    All servers are asked at once; whatever has not answered within ``timeout`` seconds in
    total is listed in ``unreachable``. Answers younger than ``max_age`` seconds are reused.
    Never raises.
    """
    try:
        runtime_dir = runtime_dir or _default_runtime_dir()
        now = time.monotonic()
        with _cache_lock:
            cached = _cache.get(runtime_dir)
            if cached is not None and now - cached[0] < max_age:
                return cached[1]
        servers = find_servers(runtime_dir)
    except Exception as exc:  # a broken Jupyter install must not break the panel
        return SessionIndex({}, (f"Jupyter runtime files unreadable: {type(exc).__name__}",))
    answers: dict[str, dict | str | None] = {}
    deadline = time.monotonic() + timeout
    threads = []
    for server in servers:
        if server.refused:
            answers[server.runtime_file] = server.describe_error(ServerError(server.refused))
            continue
        with _cache_lock:
            if server.runtime_file in _in_flight:
                answers[server.runtime_file] = f"{server.url} is still answering an earlier query"
                continue
            _in_flight.add(server.runtime_file)
        thread = threading.Thread(
            target=_ask_server, args=(server, deadline, answers), daemon=True, name="jax-nbmem-jpy"
        )
        thread.start()
        threads.append(thread)
    for thread in threads:
        # Each request ends at the deadline by itself (its watchdog): the grace is for that.
        thread.join(max(0.0, deadline - time.monotonic()) + 0.2)
    kernels: dict[str, ServerKernel] = {}
    unreachable = []
    for server in servers:
        answer = answers.get(server.runtime_file)
        if answer is None:  # still waiting, or its own socket timed out
            unreachable.append(f"{server.url} did not answer within {timeout:g} s")
        elif isinstance(answer, str):
            unreachable.append(answer)
        else:
            kernels.update(answer)
    index = SessionIndex(kernels, tuple(unreachable))
    with _cache_lock:
        _cache[runtime_dir] = (time.monotonic(), index)
    return index


def _ask_server(server: JupyterServer, deadline: float, answers: dict) -> None:
    try:
        kernels = server.request("GET", "api/kernels", max(0.01, deadline - time.monotonic()))
        sessions = server.request("GET", "api/sessions", max(0.01, deadline - time.monotonic()))
        answers[server.runtime_file] = _sessions_from(server, kernels, sessions)
    except Exception as exc:  # any failure, a malformed answer too, is said in the index
        timed_out = isinstance(exc, (TimeoutError, socket.timeout))
        answers[server.runtime_file] = None if timed_out else server.describe_error(exc)
    finally:
        with _cache_lock:
            _in_flight.discard(server.runtime_file)


def notebook_path(root_dir: str | None, path: str) -> str:
    """A notebook's full path from the path its server shows (relative to ``root_dir``)."""
    return os.path.join(root_dir, path) if root_dir and not os.path.isabs(path) else path


def _sessions_from(server: JupyterServer, kernels: object, sessions: object) -> dict:
    notebooks, shown = {}, {}
    for session in sessions if isinstance(sessions, list) else []:
        kernel = session.get("kernel") or {}
        path = session.get("path") or ""
        if kernel.get("id") and (session.get("type") == "notebook" or path.endswith(".ipynb")):
            shown[kernel["id"]] = path
            notebooks[kernel["id"]] = notebook_path(server.root_dir, path)
    found = {}
    for kernel in kernels if isinstance(kernels, list) else []:
        kernel_id = kernel.get("id")
        if kernel_id:
            found[kernel_id] = ServerKernel(
                kernel_id=kernel_id,
                server_url=server.url,
                notebook=notebooks.get(kernel_id),
                path=shown.get(kernel_id),
                execution_state=kernel.get("execution_state"),
                last_activity=epoch_seconds(kernel.get("last_activity")),
            )
    return found


def epoch_seconds(stamp: object) -> float | None:
    """A server's time stamp (ISO 8601 text, or a datetime) as seconds since the epoch."""
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    if not isinstance(stamp, str):
        return None
    try:  # Python 3.10's fromisoformat does not take the trailing "Z" servers write
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def shutdown_kernel(
    pid: int,
    tenants: list,
    *,
    confirm: bool,
    runtime_dir: str | None = None,
    grace_s: float = 3.0,
) -> ShutdownResult:
    """Shut down another kernel of ours on the GPU (``%jaxmem shutdown PID``).

    ``tenants`` are the ``Tenant`` records the PID was chosen from. Refuses this kernel, other
    users' processes, processes that are not Jupyter kernels and PIDs not in ``tenants``.
    Goes through the kernel's Jupyter server (``DELETE /api/kernels/<id>``) when one knows it,
    since a server restarts a kernel that dies under it; otherwise sends SIGTERM, then SIGKILL
    after ``grace_s`` seconds. Without ``confirm`` it only says what it would do.

    ``pid`` is a host PID, as the status shows it. In a container, a process of this very
    container is signalled under its PID here (``pid_here``, from the node agent); one in
    another container, or one no agent resolved, is refused: nothing here may signal
    whatever local process happens to carry that number.
    """
    tenant = next((t for t in tenants if t.pid == pid), None)
    refusal = _refusal(pid, tenant)
    if refusal:
        return ShutdownResult(False, None, refusal)
    local = getattr(tenant, "pid_here", None) or pid
    notebook = tenant.notebook_shown or tenant.notebook
    label = f"kernel PID {pid}" + (f" ({notebook})" if notebook else "")
    if local != pid:
        label += f", PID {local} in this container"
    server = None
    if tenant.kernel_id and tenant.server_url:
        server = next((s for s in find_servers(runtime_dir) if s.url == tenant.server_url), None)
    how = "server" if server else "signal"
    via = f"through its Jupyter server at {server.url}" if server else "with SIGTERM, then SIGKILL"
    if not confirm:
        return ShutdownResult(False, how, f"Would shut down {label} {via}; nothing done yet.")
    if server is not None:
        try:
            server.request("DELETE", f"api/kernels/{tenant.kernel_id}", timeout=10.0)
            return ShutdownResult(True, "server", f"Shut down {label} {via}.")
        except Exception as exc:  # fall back to signals, and say why
            failure = server.describe_error(exc)
            result = terminate(local, tenant.started_at, grace_s, label)
            return ShutdownResult(result.done, result.how, f"{failure}. {result.message}")
    return terminate(local, tenant.started_at, grace_s, label)


def _refusal(pid: int, tenant) -> str | None:
    if tenant is None:
        return f"PID {pid} is not among the processes using the GPU; nothing done."
    if tenant.kind == "self":
        return f"PID {pid} is this kernel; restart or shut it down from the Kernel menu."
    if getattr(tenant, "elsewhere", False):
        return _elsewhere(pid, tenant)
    if tenant.kind == "unknown":
        return f"PID {pid} could not be inspected ({tenant.reason}); nothing done."
    me = current_user()
    source = getattr(tenant, "user_source", None)  # in a container: never the host's name
    if tenant.user is not None and me is not None and (tenant.user != me or source):
        who = unix_user_text(tenant.user, source)
        return f"PID {pid} belongs to user {who}; only its owner can shut it down."
    if tenant.kind != "kernel":
        return f"PID {pid} is not a Jupyter kernel ({tenant.cmdline}); stop it yourself if need be."
    return None


def _elsewhere(pid: int, tenant) -> str:
    """Why a process outside this kernel's PID namespace is not stopped from here."""
    host = f"an administrator on the host can, with `jax-nbmem shutdown {pid} --yes`"
    if tenant.kind == "unknown" or getattr(tenant, "source", None) == "inferred":
        return (
            f"PID {pid} is a host PID that no node agent resolves for this container, so it "
            "cannot be told which process it is here (a process here with that number is "
            f"another one); nothing done. {host[0].upper()}{host[1:]}."
        )
    container = (tenant.container or {}).get("name") or (tenant.container or {}).get("id")
    where = f"another container ({container})" if container else "another PID namespace"
    owner = who_text(tenant.user, tenant.hub_user, getattr(tenant, "user_source", None))
    whose = f"its owner ({owner})" if owner else "its owner"
    return (
        f"PID {pid} runs in {where}, which nothing in this container can stop; nothing done. "
        f"{whose[0].upper()}{whose[1:]} can shut it down from its own notebook, or {host}."
    )


def terminate(pid: int, started_at: float | None, grace_s: float, label: str) -> ShutdownResult:
    """SIGTERM ``pid`` (named ``label``), then SIGKILL after ``grace_s``; never a reused PID."""
    try:
        proc = psutil.Process(pid)
        # A PID reused by a newer process must not be killed in the old one's place.
        if started_at is not None and abs(proc.create_time() - started_at) > 0.5:
            return ShutdownResult(False, None, f"PID {pid} is now another process; nothing done.")
        proc.send_signal(signal.SIGTERM)
        if _ended(proc, grace_s):
            return ShutdownResult(True, "signal", f"Stopped {label} with SIGTERM.")
        proc.kill()
        if _ended(proc, grace_s):
            return ShutdownResult(True, "signal", f"Killed {label} (SIGTERM was ignored).")
        return ShutdownResult(False, "signal", f"Could not stop {label}: still running.")
    except psutil.NoSuchProcess:
        return ShutdownResult(True, "signal", f"{label} had already exited.")
    except psutil.AccessDenied as exc:
        return ShutdownResult(False, "signal", f"Could not stop {label}: {type(exc).__name__}.")


def _ended(proc: psutil.Process, timeout: float) -> bool:
    """Whether ``proc`` exits within ``timeout``.

    A zombie counts as ended: only its parent (usually the Jupyter server, not us) can reap
    it, so waiting for its PID to vanish would wait for someone else.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def current_user() -> str | None:
    """The user this process runs as, or None when the system cannot name it."""
    try:
        return psutil.Process().username()
    except (psutil.Error, KeyError):
        return None
