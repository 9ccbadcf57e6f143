"""JAX's counters on jax_nbmem's simulated GPU, where JAX itself runs on the CPU.

In the demo (``--simulated-gpu``) a kernel's JAX runs on the CPU, whose devices keep no
counters, and the simulated GPU's mirror (:mod:`jax_nbmem.simgpu.mirror`, started by the demo's
IPython startup file) holds what JAX's allocator would on each GPU. At the cells' boundaries
(the quick readings a cell's record is made of) its counters stand for JAX's, as the kernel's
beacon already takes them: ``bytes_in_use`` is the live arrays on that GPU at the mirror's last
look (each cell's end, and every 0.25 s), ``peak_bytes_in_use`` their high-water mark at those
looks. So a cell's "JAX peak" there is the live arrays at the cells' boundaries (and the looks
between), never what a real pool reaches with a computation's temporaries: the table says so
(:data:`jax_nbmem.record.table.SIMULATED_PEAK_NOTE`). The samples between (the panel's lines)
keep JAX's own counters, which the CPU does not have.

The mirror's module is looked up in ``sys.modules``, never imported: outside the demo this
adds nothing but a lookup.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from jax_nbmem.gpu.jaxstats import GPU_PLATFORMS, DeviceStats

__all__ = ["SIMULATED_KIND", "mirror_running", "simulated_stats", "with_simulated"]

# The ``kind`` of a device that stands for JAX on the simulated GPU.
SIMULATED_KIND = "simulated (the mirror's live arrays)"
_MIRROR = "jax_nbmem.simgpu.mirror"


def mirror_running() -> bool:
    """Whether this process runs the simulated GPU's mirror (the demo's kernels do)."""
    mirror = sys.modules.get(_MIRROR)
    try:
        return mirror is not None and bool(mirror.running())
    except Exception:  # a demo aid: never a reason for a reading to fail
        return False


def simulated_stats() -> list[DeviceStats]:
    """The mirror's counters as JAX's GPU devices, JAX's device 0 first; empty without them."""
    mirror = sys.modules.get(_MIRROR)
    if mirror is None:
        return []
    try:
        counters = mirror.gpu_counters()
    except Exception:  # a demo aid: never a reason for a reading to fail
        return []
    return [
        DeviceStats(
            id=k,
            platform="gpu",
            kind=SIMULATED_KIND,
            bytes_in_use=values.get("bytes_in_use"),
            peak_bytes_in_use=values.get("peak_bytes_in_use"),
            bytes_reserved=None,
            bytes_limit=values.get("bytes_limit"),
            largest_free_block_bytes=None,
            pool_bytes=values.get("pool_bytes"),
        )  # fmt: skip
        for k, values in enumerate(counters.values())
    ]


def with_simulated(read: Callable[[], Sequence[Any]]) -> Callable[[], list[Any]]:
    """*read* (JAX's device stats), with the mirror's counters where JAX has no GPU device."""

    def read_or_simulated() -> list[Any]:
        found = list(read())
        if any(getattr(s, "platform", None) in GPU_PLATFORMS for s in found):
            return found
        return [*found, *simulated_stats()]

    return read_or_simulated
