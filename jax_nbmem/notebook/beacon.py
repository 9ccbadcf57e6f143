"""This kernel's beacon: what it says of itself to the other kernels, the CLI and the server.

The facts come from the session's memory (the allocator control, the ledger, the sampler's
latest sample, the status watch's last report); gathering them reads no file and asks neither
NVML nor JAX. :class:`~jax_nbmem.tenants.beacons.BeaconWriter` writes them at most once a
second, off every cell's path.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from functools import lru_cache
from typing import Any

import psutil

from jax_nbmem.tenants.attribution import kernel_id_of, own_kernel_id
from jax_nbmem.tenants.beacons import ENV_SHARE_DIR, SCHEMA, BeaconWriter, beacon_dirs
from jax_nbmem.tenants.servers import current_user

__all__ = ["beacon_facts", "beacon_writer", "share_dir"]


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
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "jax_nbmem": version("jax_nbmem"),
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


def _notebook(session: Any) -> str | None:
    """The notebook as its Jupyter server names it (from the last status), else at start."""
    report = session.watcher.latest()
    if report is not None:
        own = next((t for t in report.tenants() if t.kind == "self" and t.notebook), None)
        if own is not None:
            return own.notebook
    return os.environ.get("JPY_SESSION_NAME") or None


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
        "gpus": gpus,
        "cell_running": session.ledger.cell_running,
        "last_cell_finished_at": session.ledger.last_finished_at,
    }


def share_dir(session: Any) -> str:
    """The shared beacon directory: ``$JAX_NBMEM_SHARE_DIR``, else ``c.JaxNbMem.share_dir``."""
    return os.environ.get(ENV_SHARE_DIR, "") or getattr(session.settings, "share_dir", "")


def beacon_writer(session: Any) -> BeaconWriter | None:
    """A writer for this kernel's beacon, or None when beacons are off or have nowhere to go.

    It writes to the user's runtime directory and, when one is set, the shared directory.
    """
    if not getattr(session.settings, "beacon", True):
        return None
    directories = beacon_dirs(share_dir(session), environ={})
    if not directories:
        return None
    return BeaconWriter(lambda: beacon_facts(session), directories)
