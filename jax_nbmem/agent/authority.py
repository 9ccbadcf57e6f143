"""A kernel's Jupyter server and its kernel id, from host facts (see :mod:`.facts`).

The server of a kernel on the host is found from its *real* ancestors (``/proc``'s parent
links, never ``$JPY_PARENT_PID``): the nearest one of the same UID and PID namespace whose
runtime file (``jpserver-<its PID>.json``, in that user's runtime folder) is the user's own
regular file (opened without blocking or following links, of bounded size), names that PID,
and names an address the ancestor itself listens on, compared whole in its own network
namespace (:mod:`.listeners`); the server is then asked at that proven address. The
runtime file's token then speaks to that server only. A kernel id, whatever its source,
is used only with that server, and only once the server's own ``api/kernels`` lists it.
"""

from __future__ import annotations

import os
import pwd
import stat

import psutil

from jax_nbmem.agent.facts import (
    FactError,
    ProvenKernelId,
    ProvenProcess,
    ProvenServer,
    parent_pid,
    prove_process,
)
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.agent.listeners import proven_address
from jax_nbmem.node.servers import JupyterServer, ServerError, read_runtime_file

__all__ = ["ancestors", "listed_by", "parent_server"]

_MAX_DEPTH = 8  # a kernel under a launcher or a shell under its server: a few levels at most
_ASK_TIMEOUT_S = 10.0


def ancestors(process: ProvenProcess, proc: str = "/proc") -> tuple[int, ...]:
    """The host PIDs of ``process``'s real ancestors, nearest first (init and 0 excluded)."""
    found: list[int] = []
    pid = process.parent_pid
    while pid is not None and pid > 1 and pid not in found and len(found) < _MAX_DEPTH:
        found.append(pid)
        pid = parent_pid(pid, proc)
    return tuple(found)


def parent_server(process: ProvenProcess, viewer: HostViewer | None = None) -> ProvenServer:
    """The Jupyter server ``process`` runs under, from host facts; FactError when none is.

    Walks the real ancestors while they are of the kernel's UID and PID namespace (another
    user's or namespace's ancestor is no server of this kernel's).
    """
    if process.namespaced:
        raise FactError(
            f"PID {process.pid} runs in a container: its server's runtime file would name "
            "PIDs of its own namespace, so none is taken from there"
        )
    viewer = viewer or HostViewer()
    tried = []
    for pid in ancestors(process, viewer.proc):
        try:
            above = prove_process(pid, viewer)
        except FactError:
            break
        if above.uid != process.uid or above.pid_ns != process.pid_ns:
            break
        server, why = _runtime_server(above)
        if server is not None:
            return server
        tried.append(f"PID {pid}: {why}")
    said = "; ".join(tried) or "it has no ancestor of its own user"
    raise FactError(f"no real ancestor of PID {process.pid} is a Jupyter server ({said})")


def _runtime_server(process: ProvenProcess) -> tuple[ProvenServer | None, str]:
    """``process`` as a Jupyter server (its runtime file, checked), or (None, why not)."""
    names = (f"jpserver-{process.pid}.json", f"nbserver-{process.pid}.json")
    for folder in _runtime_folders(process):
        for name in names:
            path = os.path.join(folder, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode) or info.st_uid != process.uid:
                return None, f"{path} is not its user's own regular file"
            found = read_runtime_file(path, process.uid)  # never blocks, never follows a link
            if found is None or found.pid != process.pid or found.refused:
                why = found.refused if found is not None and found.refused else (
                    "unreadable, too big, or names another PID")  # fmt: skip
                return None, f"{path}: {why}"
            asked, why = proven_address(process.pid, process.uid, found)
            if asked is None:
                return None, f"{path}: {why}"
            return ProvenServer(process.pid, asked.url, asked), ""
    return None, "no runtime file of its PID"


def _runtime_folders(process: ProvenProcess) -> list[str]:
    """Where its user's Jupyter keeps runtime files: its ``$JUPYTER_RUNTIME_DIR``, its home's.

    The process's own environment only says where to look: what is found there is checked.
    """
    folders = []
    try:
        environ = psutil.Process(process.pid).environ()
    except (psutil.Error, OSError):
        environ = {}
    if environ.get("JUPYTER_RUNTIME_DIR"):
        folders.append(environ["JUPYTER_RUNTIME_DIR"])
    if environ.get("XDG_DATA_HOME"):
        folders.append(os.path.join(environ["XDG_DATA_HOME"], "jupyter", "runtime"))
    try:
        home = pwd.getpwuid(process.uid).pw_dir
        folders.append(os.path.join(home, ".local", "share", "jupyter", "runtime"))
    except KeyError:
        pass
    return list(dict.fromkeys(folders))


def listed_by(server: ProvenServer, kernel_id: str | None) -> ProvenKernelId:
    """``kernel_id`` once ``server``'s own ``api/kernels`` lists it; FactError otherwise."""
    if not kernel_id:
        raise FactError("its kernel id is unknown (no beacon, no kernel-<id>.json)")
    jupyter: JupyterServer = server.server  # type: ignore[assignment]
    try:
        kernels = jupyter.request("GET", "api/kernels", _ASK_TIMEOUT_S)
    except (ServerError, TimeoutError, OSError, ValueError) as error:
        raise FactError(f"its server {server.url} did not list its kernels: "
                        f"{jupyter.describe_error(error)}") from None  # fmt: skip
    ids = {k.get("id") for k in kernels if isinstance(k, dict)} if isinstance(kernels, list) else ()
    if kernel_id not in ids:
        raise FactError(f"kernel {kernel_id} is not on the list of its server {server.url}")
    return ProvenKernelId(kernel_id, server.url)
