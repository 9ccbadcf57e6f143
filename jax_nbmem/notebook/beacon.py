"""This kernel's beacon: what it says of itself to the other kernels, the CLI and the server.

The facts come from the session's memory (the allocator control, the ledger, the sampler's
latest sample, the status watch's last report); gathering them reads no file and asks neither
NVML nor JAX. :class:`~jax_nbmem.node.beacons.BeaconWriter` writes them at most once a
second, off every cell's path.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from functools import lru_cache
from typing import Any

import psutil

from jax_nbmem.allocator.extras import jax_pool_devices
from jax_nbmem.node.agent_client import socket_path
from jax_nbmem.node.beacons import SCHEMA, Beacon, BeaconWriter, beacon_dirs
from jax_nbmem.node.identity import own_identity
from jax_nbmem.node.servers import current_user
from jax_nbmem.node.sharedir import find_share_dir
from jax_nbmem.tenants.attribution import kernel_id_of, own_kernel_id

__all__ = ["beacon_facts", "beacon_writer", "own_beacon", "share_dir"]


@lru_cache(maxsize=1)
def _constant_facts() -> dict[str, Any]:
    """What does not change while the kernel runs."""
    try:
        started_at = psutil.Process().create_time()
    except psutil.Error:
        started_at = None

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "schema": SCHEMA,
        "pid": os.getpid(),
        "started_at": started_at,
        "user": current_user(),
        "hub_user": os.environ.get("JUPYTERHUB_USER") or None,
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "jax_nbmem": version("jax_nbmem"),
        # Its PID namespace, PID there, start ticks, boot and host name: claims the node
        # agent can prove, and what tells containers apart (jax_nbmem.node.identity).
        "identity": own_identity(),
    }


_kernel_id: str | None = None


def _own_kernel_id() -> str | None:
    """This kernel's id, from what stays put while it runs; None while not known.

    ipykernel's app holds the connection file it was started with; the interpreter's own
    arguments (``sys.orig_argv``) name it too. ``sys.argv`` comes last: IPython swaps it while
    startup files and ``exec_files`` run. Only a found id is kept: a miss is asked again.
    """
    global _kernel_id
    if _kernel_id is None:
        found = None
        app = getattr(sys.modules.get("ipykernel.kernelapp"), "IPKernelApp", None)
        try:
            if app is not None and app.initialized():  # instance() would make one
                found = kernel_id_of(getattr(app.instance(), "connection_file", None))
        except Exception:  # an odd ipykernel: the command line still tells
            found = None
        orig = getattr(sys, "orig_argv", None) or []
        _kernel_id = found or own_kernel_id(orig[1:]) or own_kernel_id(sys.argv)
    return _kernel_id


def _vscode_notebook(session: Any) -> str | None:
    """The notebook VS Code says this kernel runs (``__vsc_ipynb_file__``), else None."""
    value = (getattr(session, "user_namespace", None) or {}).get("__vsc_ipynb_file__")
    return value if isinstance(value, str) and value else None


def _notebook(session: Any) -> str | None:
    """This kernel's notebook, only as sources about this very kernel tell it, asked anew.

    Its Jupyter server's session (the last status: found by this kernel's id, so it follows
    renames), VS Code's ``__vsc_ipynb_file__``, then ``$JPY_SESSION_NAME`` (its name at the
    kernel's start). Never a beacon, not even its own read back: a name taken once would be
    kept for good, and a file that claims this PID need not be this kernel's.
    """
    report = session.watcher.latest()
    if report is not None:
        own = next((t for t in report.tenants() if t.kind == "self"), None)
        if own is not None and own.source == "session" and own.notebook:
            return own.notebook
    return _vscode_notebook(session) or os.environ.get("JPY_SESSION_NAME") or None


def _memory_caps(session: Any) -> dict[str, int]:
    """This kernel's MPS or HAMi cap by GPU UUID, from its last status (its own environment)."""
    report = session.watcher.latest()
    gpus = report.get("gpus", []) if report is not None else []
    return {g["uuid"]: g["memory_cap_bytes"] for g in gpus
            if g.get("uuid") and g.get("memory_cap_bytes")}  # fmt: skip


def _simulated_gpu_counters() -> dict[str, dict[str, Any]]:
    """JAX's counters on the simulated GPU where this kernel mirrors its arrays onto it.

    The demo's and the tests' kernels run JAX on the CPU; the mirror (started by the demo's
    IPython startup file) holds their pool on the simulated GPU, and its counters stand for
    JAX's, so that their beacons say what a real GPU kernel's would. Looked up, never
    imported: nothing here starts it, and without it there is nothing to say.
    """
    mirror = sys.modules.get("jax_nbmem.simgpu.mirror")
    try:
        return mirror.gpu_counters() if mirror is not None else {}
    except Exception:  # a demo aid: never a reason for a beacon to fail
        return {}


# The holders besides JAX's pool a beacon's GPU entry counts (status's own_split parts), each
# as "<holder>_bytes"; "other" is CUDA's contexts and what no counter reports.
HOLDER_KEYS = ("jax_collective", "torch", "cupy", "tensorflow", "other")


def _add_holders(gpus: dict[str, dict[str, Any]], session: Any) -> None:
    """Add what else this kernel holds on each GPU JAX counts (the watcher's last split)."""
    watcher = getattr(session, "watcher", None)
    try:
        report = watcher.latest() if watcher is not None else None
    except Exception:
        return
    if not isinstance(report, dict) or not report.get("own_split"):
        return
    uuids = {g["index"]: g.get("uuid") for g in report.get("gpus", [])}
    for row in report["own_split"]:
        counters = gpus.get(uuids.get(row["gpu"]) or "")
        if counters is None:  # only beside JAX's own counters: a GPU JAX does not use has none
            continue
        parts = {**row["parts"], "other": row.get("other_bytes")}
        for holder in HOLDER_KEYS:
            if parts.get(holder) is not None:
                counters[f"{holder}_bytes"] = parts[holder]


def _pool_gpus(latest: Any) -> list[str] | None:
    """The UUIDs of the GPUs this kernel's JAX will make its pool on when it starts, or None.

    The sampler's GPUs are those CUDA lets this process see, in CUDA's order (JAX's device
    ordinals); ``jax_cuda_visible_devices`` may narrow them. Lets the server say "will not fit"
    only of a GPU this kernel will use. None: not known (no reading yet, a GPU without UUID).
    """
    gpus = list(getattr(latest, "gpus", ()))
    if not gpus:
        return None
    uuids = [gpu.uuid for gpu in jax_pool_devices(gpus)]
    return uuids if all(uuids) else None


def beacon_facts(session: Any) -> dict[str, Any]:
    """The beacon's content now (everything but ``written_at``)."""
    control = session.control
    backend = control.backend
    settings = backend.effective if backend is not None else control.pending()
    latest = session.sampler.latest() if session.sampler is not None else None
    gpus = {}
    for gpu in getattr(latest, "gpus", ()):
        if gpu.uuid and gpu.jax_in_use is not None:
            gpus[gpu.uuid] = {
                "bytes_in_use": gpu.jax_in_use,
                "pool_bytes": gpu.jax_reserved,
                "bytes_limit": gpu.jax_limit,
                "peak_bytes_in_use": gpu.jax_peak,
            }
    if not gpus:  # JAX on the CPU: the simulated GPU's mirror, if it runs, says as JAX would
        gpus = _simulated_gpu_counters()
    _add_holders(gpus, session)
    return {
        **_constant_facts(),
        "kernel_id": _own_kernel_id(),
        "notebook": _notebook(session),
        "mode_requested": str(control.requested) if control.requested is not None else None,
        # Why `%jaxalloc auto` chose that mode, in one line (None when the user chose it).
        "mode_reason": getattr(getattr(session, "auto_choice", None), "reason", None),
        "mode_in_effect": backend.effective.mode_name if backend is not None else None,
        "variables": dict(backend.variables) if backend is not None else {},
        "pool_fraction": settings.pool_fraction,
        "pool_gpus": _pool_gpus(latest) if backend is None else None,
        "gpus": gpus,
        "cell_running": session.ledger.cell_running,
        "last_cell_finished_at": session.ledger.last_finished_at,
        "memory_caps": _memory_caps(session),
    }


def own_beacon(session: Any) -> Beacon:
    """What this kernel's session knows of it, in a beacon's shape, for its own status row.

    From memory, as the beacon's facts, never from its file; after ``control.report()`` so a
    start of JAX in the running cell counts. No idleness (the kernel is running the cell that
    asks), and a notebook only from VS Code (the server's session and ``$JPY_SESSION_NAME``
    come with the process's inspection). Before JAX starts, its mode is the one it will start
    with (the variables as they are now).
    """
    control = session.control
    report = control.report()
    facts = beacon_facts(session)
    requested = facts["mode_requested"]
    if report.backend is None:
        requested = report.pending.mode_name
    return Beacon(
        pid=facts["pid"],
        started_at=facts["started_at"] or 0.0,
        user=facts["user"],
        kernel_id=facts["kernel_id"],
        notebook=_vscode_notebook(session),
        mode_requested=requested,
        mode_in_effect=facts["mode_in_effect"],
        pool_fraction=facts["pool_fraction"],
        gpus=facts["gpus"],
        cell_running=False,
        last_cell_finished_at=None,
        written_at=time.time(),
        jax=facts["jax"],
        jaxlib=facts["jaxlib"],
        jax_nbmem=facts["jax_nbmem"],
        variables=facts["variables"],
        mode_reason=facts["mode_reason"],
        identity=facts["identity"],
        memory_caps=facts["memory_caps"],
    )


def share_dir(session: Any) -> str:
    """The shared beacon directory: ``$JAX_NBMEM_SHARE_DIR``, else ``c.JaxNbMem.share_dir``.

    The one rule of every face (:func:`~jax_nbmem.node.sharedir.find_share_dir`); a kernel has
    no default: unless told, its beacon stays in the user's Jupyter runtime directory.
    """
    setting = getattr(session.settings, "share_dir", "")
    return find_share_dir(setting=setting, default=None).path or ""


def beacon_writer(session: Any) -> BeaconWriter | None:
    """A writer for this kernel's beacon, or None when beacons are off or have nowhere to go.

    It writes to the user's runtime directory and, when one is set, the shared directory,
    and sends each beacon to the node agent there (``S/agent/agent.sock``), when it listens.
    """
    if not getattr(session.settings, "beacon", True):
        return None
    shared = share_dir(session)
    directories = beacon_dirs(shared, environ={})
    if not directories:
        return None
    agent = socket_path(shared) if shared else None
    return BeaconWriter(lambda: beacon_facts(session), directories, agent_socket=agent)
