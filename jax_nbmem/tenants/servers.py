"""Running Jupyter servers: which kernel serves which notebook, how idle it is, shutting it down.

Servers are found through the runtime files they write (``jpserver-*.json``; ``nbserver-*.json``
from the classic notebook server) and asked over HTTP with the standard library only. A server's
token travels only in the ``Authorization`` header: it is kept out of every repr, message and
exception this module makes. A slow or dead server costs at most the query's time budget.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

import psutil
from jupyter_core.paths import jupyter_runtime_dir

__all__ = [
    "JupyterServer",
    "ServerKernel",
    "SessionIndex",
    "ShutdownResult",
    "current_user",
    "find_servers",
    "kernel_sessions",
    "shutdown_kernel",
]

# The sampler may ask every second or so; a server's sessions change far less often than that.
_CACHE_SECONDS = 3.0
# Jupyter's own proxies do not apply to its loopback servers; an http_proxy variable would
# otherwise route the token through a proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class JupyterServer:
    """A Jupyter server found through its runtime file; ``token`` never shows in its repr."""

    url: str
    root_dir: str | None
    pid: int | None
    runtime_file: str
    token: str = field(default="", repr=False, compare=False)

    def request(self, method: str, endpoint: str, timeout: float) -> object:
        """Send one API request with the token as a header; return the decoded JSON (or None)."""
        headers = {"Authorization": f"token {self.token}"} if self.token else {}
        req = urllib.request.Request(self.url + endpoint, headers=headers, method=method)
        with _OPENER.open(req, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def describe_error(self, exc: BaseException) -> str:
        """Say why a request failed, with the token (should any library echo it) blotted out."""
        text = f"{self.url} did not answer: {type(exc).__name__}: {exc}"
        return text.replace(self.token, "***") if self.token else text


@dataclass(frozen=True)
class ServerKernel:
    """One kernel as its Jupyter server sees it; ``notebook`` is None unless it serves one."""

    kernel_id: str
    server_url: str
    notebook: str | None
    execution_state: str | None
    last_activity: float | None  # seconds since the epoch; None when the server did not say

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

    def get(self, kernel_id: str | None) -> ServerKernel | None:
        """The kernel's session, or None when no server answered for it."""
        return self.kernels.get(kernel_id) if kernel_id else None


@dataclass(frozen=True)
class ShutdownResult:
    """What ``shutdown_kernel`` did or would do; ``how``: "server", "signal" or None (refused)."""

    done: bool
    how: str | None
    message: str


def find_servers(runtime_dir: str | None = None) -> list[JupyterServer]:
    """Jupyter servers whose runtime files are in ``runtime_dir`` (default: Jupyter's own).

    Files whose server process is gone, that cannot be read, or that describe a server on a
    UNIX socket (which ``urllib`` cannot reach) are skipped.
    """
    runtime_dir = runtime_dir or _default_runtime_dir()
    servers = []
    for pattern in ("jpserver-*.json", "nbserver-*.json"):
        for path in sorted(glob.glob(os.path.join(runtime_dir, pattern))):
            server = _read_runtime_file(path)
            if server is not None:
                servers.append(server)
    return servers


def _default_runtime_dir() -> str:
    # Resolved on every call: $JUPYTER_RUNTIME_DIR may change, and answers are cached per folder.
    return jupyter_runtime_dir()


def _read_runtime_file(path: str) -> JupyterServer | None:
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        pid = info.get("pid")
        if info.get("sock") or (isinstance(pid, int) and not psutil.pid_exists(pid)):
            return None
        url = info.get("url") or "http://{}:{}{}".format(
            info.get("hostname", "localhost"), info["port"], info.get("base_url", "/")
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    # Keep scheme, host and base path only: a query string could carry a token.
    parts = urllib.parse.urlsplit(url)
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    return JupyterServer(
        url=base if base.endswith("/") else base + "/",
        root_dir=info.get("root_dir") or info.get("notebook_dir"),
        pid=pid if isinstance(pid, int) else None,
        runtime_file=path,
        token=str(info.get("token") or ""),
    )


_cache_lock = threading.Lock()
_cache: dict[str, tuple[float, SessionIndex]] = {}


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
        thread = threading.Thread(
            target=_ask_server, args=(server, deadline, answers), daemon=True, name="jax-nbmem-jpy"
        )
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
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
        timed_out = isinstance(exc, TimeoutError) or isinstance(
            getattr(exc, "reason", None), TimeoutError
        )
        answers[server.runtime_file] = None if timed_out else server.describe_error(exc)


def _sessions_from(server: JupyterServer, kernels: object, sessions: object) -> dict:
    notebooks = {}
    for session in sessions if isinstance(sessions, list) else []:
        kernel = session.get("kernel") or {}
        path = session.get("path") or ""
        if kernel.get("id") and (session.get("type") == "notebook" or path.endswith(".ipynb")):
            if server.root_dir and not os.path.isabs(path):
                path = os.path.join(server.root_dir, path)
            notebooks[kernel["id"]] = path
    found = {}
    for kernel in kernels if isinstance(kernels, list) else []:
        kernel_id = kernel.get("id")
        if kernel_id:
            found[kernel_id] = ServerKernel(
                kernel_id=kernel_id,
                server_url=server.url,
                notebook=notebooks.get(kernel_id),
                execution_state=kernel.get("execution_state"),
                last_activity=_epoch_seconds(kernel.get("last_activity")),
            )
    return found


def _epoch_seconds(stamp: object) -> float | None:
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
    """
    tenant = next((t for t in tenants if t.pid == pid), None)
    refusal = _refusal(pid, tenant)
    if refusal:
        return ShutdownResult(False, None, refusal)
    label = f"kernel PID {pid}" + (f" ({tenant.notebook})" if tenant.notebook else "")
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
            result = _terminate(pid, tenant.started_at, grace_s, label)
            return ShutdownResult(result.done, result.how, f"{failure}. {result.message}")
    return _terminate(pid, tenant.started_at, grace_s, label)


def _refusal(pid: int, tenant) -> str | None:
    if tenant is None:
        return f"PID {pid} is not among the processes using the GPU; nothing done."
    if tenant.kind == "self":
        return f"PID {pid} is this kernel; restart or shut it down from the Kernel menu."
    if tenant.kind == "unknown":
        return f"PID {pid} could not be inspected ({tenant.reason}); nothing done."
    me = current_user()
    if tenant.user is not None and me is not None and tenant.user != me:
        return f"PID {pid} belongs to user {tenant.user}; only its owner can shut it down."
    if tenant.kind != "kernel":
        return f"PID {pid} is not a Jupyter kernel ({tenant.cmdline}); stop it yourself if need be."
    return None


def _terminate(pid: int, started_at: float | None, grace_s: float, label: str) -> ShutdownResult:
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
