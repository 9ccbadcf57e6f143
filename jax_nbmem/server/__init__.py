"""The server face: a Jupyter server extension that shows every kernel's GPU memory.

``jax_nbmem.server`` is enabled on install (``jupyter_server_config.d/jax_nbmem.json``). It
keeps one snapshot of the GPUs, their processes joined to this server's kernels, notebooks and
users, and the kernels' beacons, refreshed by a thread of its own (see :mod:`.monitor`); the
routes (:mod:`.handlers`) only read it: ``/jax-nbmem/api/status``, ``/jax-nbmem/api/history``,
``POST /jax-nbmem/api/kernels/<id>/shutdown``, the GPU board at ``/jax-nbmem/``, and gauges on
the server's own ``/metrics``.

It may import the core (``allocator``, ``gpu``, ``record``, ``node``, ``agent``, ``tenants``,
``metrics``, ``tools`` and the shared modules), jupyter_server, tornado and prometheus_client;
never IPython, widgets, plotly or another face.
"""

from __future__ import annotations

# `jupyter server extension list` shows the version of the module it enables (this one).
from jax_nbmem._version import __version__

__all__ = [
    "__version__",
    "_jupyter_server_extension_points",
    "_load_jupyter_server_extension",
    "_unload_jupyter_server_extension",
]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jax_nbmem.server"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from jax_nbmem.server.extension import load

    load(serverapp)


async def _unload_jupyter_server_extension(serverapp) -> None:
    from jax_nbmem.server.extension import unload

    await unload(serverapp)
