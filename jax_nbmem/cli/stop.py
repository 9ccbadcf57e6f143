"""``jax-nbmem shutdown PID``: stop a kernel, another user's too for an administrator.

Whose it is comes first: the hub user's where both the kernel's (its beacon or environment)
and the caller's (``$JUPYTERHUB_USER``) are known, else the Unix user's. Who may: the
kernel's owner; root; anyone with a hub API token whose scopes reach the owner's server
(:data:`~jax_nbmem.cli.hubapi.SCOPES`). How: through the kernel's Jupyter server when it is
known (the kernel's id from its beacon or its command line; the server: a hub user's own, from
the environment JupyterHub gives its servers' processes; another user's, from the hub; for
root, the kernel's parent server's runtime file), so that the server does not restart it;
otherwise, for root or the owner, SIGTERM then SIGKILL. It then says what came free on the
GPUs, and logs each stop of another user's kernel (who, which kernel, whose, bytes, when) as a
JSON line in the administrators' log.

A kernel in a container (a PID namespace of its own), seen from the host: its kernel id and
hub user come only from what the node agent proved (:mod:`jax_nbmem.agent.hostproof`),
never from a beacon file, its command line or its environment (any container can write those
for another's kernel); without that proof the hub is not asked, and root stops the very host
PID it named with signals. Its ``JPY_PARENT_PID`` is an in-container PID: it never names a
host process.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from jax_nbmem.agent.hostproof import HostProof, host_proof, public_container
from jax_nbmem.cli.hubapi import SCOPES_TEXT, Hub, HubError, OwnServer
from jax_nbmem.tenants.attribution import inspect_process
from jax_nbmem.tenants.beacons import beacon_dirs, read_beacons
from jax_nbmem.tenants.owners import hub_user_of, may_stop_others
from jax_nbmem.tenants.servers import (
    _terminate,
    current_user,
    find_servers,
)
from jax_nbmem.units import format_bytes

__all__ = ["ENV_ADMIN_LOG", "Kernel", "StopError", "Stopped", "admin_log_path", "find", "stop"]

ENV_ADMIN_LOG = "JAX_NBMEM_ADMIN_LOG"
_EXIT_WAIT_S = 15.0


class StopError(RuntimeError):
    """Nothing was stopped; the message says why."""


@dataclass
class Kernel:
    """The kernel behind a PID, as far as it can be found out."""

    pid: int
    started_at: float | None
    user: str | None
    hub_user: str | None
    kernel_id: str | None
    notebook: str | None
    server_pid: int | None = None
    gpu_bytes: dict[int, int] = field(default_factory=dict)  # GPU index -> bytes (NVML)
    pid_in_container: int | None = None  # its PID in its container (None: the host's)
    container: dict | None = None  # name, id, pod, namespace (None: none)
    proven: bool | None = None  # in a container: whether the node agent proved it

    @property
    def owner(self) -> str:
        """Whose it is, as people know them."""
        if self.hub_user and self.hub_user != self.user:
            return f"hub user {self.hub_user} (Unix user {self.user})"
        return f"user {self.user}"

    def label(self) -> str:
        """``kernel PID 123 (id 1a2b3c4d, notebook ~alice/x.ipynb, user alice)``."""
        parts = [f"id {self.kernel_id[:8]}"] if self.kernel_id else []
        if self.notebook:
            parts.append(f"notebook {self.notebook}")
        parts.append(self.owner)
        if self.container:
            name = self.container.get("name") or (self.container.get("id") or "")[:12]
            parts.append(f"container {name}")
        return f"kernel PID {self.pid} ({', '.join(parts)})"


@dataclass
class Stopped:
    """What ``stop`` did: how, through which server, and what came free per GPU."""

    kernel: Kernel
    how: str  # "server" or "signal"
    server: str | None
    freed: dict[int, int | None]  # GPU index -> bytes free after minus before (None: unread)
    free_after: dict[int, int | None]
    message: str


def _gpu_free() -> dict[int, int | None]:
    from jax_nbmem.gpu import nvml

    return {gpu.index: gpu.free_bytes for gpu in nvml.gpus()}


def _gpu_names() -> dict[int, str]:
    """Each GPU's name for people: "GPU 0", "MIG 3g.71gb instance 1 of GPU 0"."""
    from jax_nbmem.gpu import nvml

    return {gpu.index: gpu.label for gpu in nvml.gpus()}


def _gpu_bytes(pid: int) -> dict[int, int]:
    from jax_nbmem.gpu import nvml

    held: dict[int, int] = {}
    for listing in nvml.process_lists(None):
        for process in listing.processes or ():
            if process.pid == pid and process.used_bytes is not None:
                held[process.gpu] = held.get(process.gpu, 0) + process.used_bytes
    return held


def find(pid: int, share_dir: str | None = None, host: HostProof | None = None) -> Kernel:
    """The kernel behind ``pid``; StopError when there is none (or it is no kernel).

    ``host`` (default: :func:`host_proof`; None off the host) tells whether ``pid`` runs in a
    container and what the node agent proved of it (see the module).
    """
    host = host_proof(share_dir) if host is None else host
    view = host.view(pid) if host is not None else None
    if view is not None and view.namespaced:
        return _find_contained(pid, share_dir, host)
    info = inspect_process(pid, own_pid=os.getpid(), server_sessions={})
    if info.kind == "self":
        raise StopError(f"PID {pid} is this very command; nothing done.")
    if info.kind == "unknown":
        raise StopError(f"PID {pid}: {info.reason}; nothing done.")
    if info.kind != "kernel":
        raise StopError(
            f"PID {pid} is not a Jupyter kernel ({info.cmdline}); jax-nbmem shutdown stops "
            "kernels only; nothing done."
        )
    beacon = read_beacons(beacon_dirs(share_dir)).get(pid)
    kernel_id = (beacon.kernel_id if beacon else None) or info.kernel_id
    hub_user = (beacon.hub_user if beacon else None) or info.hub_user
    server_pid = None
    try:
        environ = psutil.Process(pid).environ()
        hub_user = hub_user or hub_user_of(environ)
        parent = environ.get("JPY_PARENT_PID", "")
        server_pid = int(parent) if parent.isdigit() else None
    except (psutil.Error, OSError):
        pass  # another user's environment: the beacon and the hub must do
    return Kernel(
        pid=pid,
        started_at=info.started_at,
        user=info.user,
        hub_user=hub_user,
        kernel_id=kernel_id,
        notebook=info.notebook_shown or info.notebook or (beacon.notebook if beacon else None),
        server_pid=server_pid,
        gpu_bytes=_gpu_bytes(pid),
    )


def _find_contained(pid: int, share_dir: str | None, host: HostProof) -> Kernel:
    """A kernel in a container: only the node agent's proof names it (see the module)."""
    info = inspect_process(pid, own_pid=os.getpid(), server_sessions={})
    if info.kind == "unknown":
        raise StopError(f"PID {pid}: {info.reason}; nothing done.")
    view = host.view(pid)
    proven = host.is_proven(pid)
    beacon = host.proven[pid].beacon if proven else None
    if beacon is None and info.kind != "kernel":
        raise StopError(
            f"PID {pid} is not a Jupyter kernel ({info.cmdline}); jax-nbmem shutdown stops "
            "kernels only; nothing done."
        )
    return Kernel(
        pid=pid,
        started_at=info.started_at,
        user=info.user,
        hub_user=beacon.hub_user if beacon else None,
        kernel_id=beacon.kernel_id if beacon else None,
        notebook=beacon.notebook if beacon else None,
        gpu_bytes=_gpu_bytes(pid),
        pid_in_container=view.pid_in_container,
        container=public_container(view),
        proven=proven,
    )


def _own_server(kernel: Kernel):
    """The kernel's parent server from its runtime file (readable by its owner and root)."""
    if kernel.server_pid is None:
        return None
    folders = []
    try:
        environ = psutil.Process(kernel.server_pid).environ()
        if environ.get("JUPYTER_RUNTIME_DIR"):
            folders.append(environ["JUPYTER_RUNTIME_DIR"])
        home = environ.get("HOME") or os.path.expanduser(f"~{kernel.user}")
        folders.append(os.path.join(home, ".local", "share", "jupyter", "runtime"))
    except (psutil.Error, OSError):
        return None
    for folder in folders:
        for server in find_servers(folder):
            if server.pid == kernel.server_pid and server.token and not server.refused:
                return server
    return None


def _wait_gone(kernel: Kernel, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            process = psutil.Process(kernel.pid)
            if kernel.started_at is not None and abs(process.create_time() - kernel.started_at) > 1:
                return True  # the PID is another process's now
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def whose(kernel: Kernel, own_server: OwnServer | None = None) -> tuple[bool, str]:
    """Whether ``kernel`` is the caller's, and who the caller is, in the words of a refusal.

    The hub user decides where both sides' are known (the kernel's from its beacon or
    environment, the caller's own server's or ``$JUPYTERHUB_USER``): in a hub whose servers
    run in containers every Unix user may be ``jovyan``. Else the Unix user does.
    """
    me = current_user()
    own_hub = own_server.user if own_server is not None else hub_user_of(os.environ)
    if kernel.hub_user and own_hub:
        unix = f" (Unix user {me})" if me and me != own_hub else ""
        return kernel.hub_user == own_hub, f"you are hub user {own_hub}{unix}"
    return kernel.user is not None and kernel.user == me, f"you are user {me}"


def _known_id(kernel: Kernel) -> str:
    if not kernel.kernel_id:
        raise StopError(
            f"{kernel.label()}: its kernel id is unknown (no beacon, and its command line "
            "names no kernel-<id>.json), so its server cannot be asked; nothing done."
        )
    return kernel.kernel_id


def plan(
    kernel: Kernel, hub: Hub | None, own_server: OwnServer | None = None
) -> tuple[str, str | None, str]:
    """How ``kernel`` would be stopped: ("server", its URL, by) or ("signal", None, "signal").

    ``by`` says whose word the server takes: "own" (the caller's own hub server and its
    token), "hub" (an administrator's hub token), "runtime" (the server's own runtime file).
    StopError when this caller may not stop it, or the hub refuses.
    """
    mine, you = whose(kernel, own_server)
    if mine and own_server is not None:
        _known_id(kernel)
        return "server", own_server.url, "own"
    if hub is not None:
        if kernel.proven is False:
            raise StopError(
                f"{kernel.label()} runs in a container and the node agent has not proven "
                "which kernel it is (its kernel id and hub user would be its own claims), so "
                "its server is not asked; root can stop this very PID without --hub-url; "
                "nothing done."
            )
        _known_id(kernel)
        name = kernel.hub_user or kernel.user
        if not name:
            raise StopError(f"{kernel.label()}: its hub user is unknown; nothing done.")
        try:
            return "server", hub.server_url(name), "hub"
        except HubError as error:
            if mine:
                raise StopError(f"{error}; nothing done.") from None
            raise StopError(
                f"PID {kernel.pid} is a kernel of {kernel.owner}, not yours ({you}), and the "
                f"hub refused this token: {error}; nothing done."
            ) from None
    if not (mine or may_stop_others()):
        raise StopError(
            f"PID {kernel.pid} is a kernel of {kernel.owner}, not yours ({you}): only its owner "
            f"or an administrator (root, or a hub API token with {SCOPES_TEXT}: --hub-url and "
            "$JUPYTERHUB_API_TOKEN) can stop it; nothing done."
        )
    server = _own_server(kernel)
    if server is not None:
        return "server", server.url, "runtime"
    return "signal", None, "signal"


def stop(
    kernel: Kernel,
    hub: Hub | None,
    *,
    dry_run: bool = False,
    log_path: Path | None = None,
    own_server: OwnServer | None = None,
) -> Stopped:
    """Stop ``kernel`` (see the module); StopError when nothing could be stopped.

    ``own_server``: the caller's own hub server (its own kernels go through it).
    """
    how, server_url, by = plan(kernel, hub, own_server)
    via = f"through its Jupyter server {server_url}" if how == "server" else "with SIGTERM"
    if dry_run:
        names = _gpu_names()
        held = ", ".join(
            f"{format_bytes(b)} on {names.get(g, f'GPU {g}')}" for g, b in kernel.gpu_bytes.items()
        )
        message = f"Would stop {kernel.label()} {via}" + (f"; it holds {held}" if held else "")
        return Stopped(kernel, how, server_url, {}, {}, message + ". Nothing done (--dry-run).")
    before = _gpu_free()
    if not psutil.pid_exists(kernel.pid):
        raise StopError(f"{kernel.label()} exited meanwhile; nothing done.")
    message = f"Stopped {kernel.label()} {via}."
    if how == "server":
        try:
            if by == "own":
                own_server.shutdown_kernel(kernel.kernel_id)
            elif by == "hub":
                hub.shutdown_kernel(server_url, kernel.kernel_id)
            else:
                _own_server(kernel).request("DELETE", f"api/kernels/{kernel.kernel_id}", 15.0)
        except (HubError, OSError) as error:
            raise StopError(f"{error}; nothing done.") from None
        if not _wait_gone(kernel, _EXIT_WAIT_S):
            raise StopError(
                f"{server_url} accepted the shutdown of {kernel.label()}, but the process was "
                f"still running {_EXIT_WAIT_S:g} s later"
            )
    else:
        result = _terminate(kernel.pid, kernel.started_at, 5.0, kernel.label())
        if not result.done:
            raise StopError(result.message)
        message = result.message
    after = _gpu_free()
    freed = {
        g: None if after.get(g) is None or before.get(g) is None else after[g] - before[g]
        for g in kernel.gpu_bytes
    }
    names = _gpu_names()
    for gpu in sorted(freed):
        came = freed[gpu]
        message += (
            f" {names.get(gpu, f'GPU {gpu}')}: it held {format_bytes(kernel.gpu_bytes[gpu])}; "
            + (f"{format_bytes(max(came, 0))} came free" if came is not None else "free unread")
            + (f", {format_bytes(after[gpu])} free now." if after.get(gpu) is not None else ".")
        )
    if not kernel.gpu_bytes:
        message += " It held no GPU memory."
    if how == "signal":
        message += " Its Jupyter server may restart it, without its memory until it runs JAX."
    stopped = Stopped(kernel, how, server_url, freed, after, message)
    if by == "hub" or not whose(kernel, own_server)[0]:
        _log(stopped, hub if by == "hub" else None, log_path)
    return stopped


def admin_log_path() -> Path:
    """``$JAX_NBMEM_ADMIN_LOG``, else /var/log/jax_nbmem/admin.log for root, else the user's."""
    if os.environ.get(ENV_ADMIN_LOG):
        return Path(os.environ[ENV_ADMIN_LOG])
    if may_stop_others():
        return Path("/var/log/jax_nbmem/admin.log")
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "jax_nbmem" / "admin.log"


def _log(stopped: Stopped, hub: Hub | None, log_path: Path | None) -> None:
    """One JSON line per administrator's stop; a log that cannot be written is said."""
    kernel = stopped.kernel
    entry = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "by": current_user(),
        "by_hub": hub.url if hub is not None else None,
        "action": "shutdown",
        "how": stopped.how,
        "server": stopped.server,
        "freed_bytes": {str(g): b for g, b in stopped.freed.items()},
        **{k: v for k, v in asdict(kernel).items() if k != "gpu_bytes"},
        "gpu_bytes": {str(g): b for g, b in kernel.gpu_bytes.items()},
    }
    path = log_path or admin_log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")
        stopped.message += f" Logged in {path}."
    except OSError as error:
        stopped.message += f" (Not logged: cannot write {path}: {error.strerror or error}.)"
