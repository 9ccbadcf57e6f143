"""Where a kernel's JAX would hold memory on the simulated GPUs: every device it can see.

A real JAX starts a client, and so an allocator and its pool, on every GPU its CUDA sees
(``CUDA_VISIBLE_DEVICES``, read by CUDA's rules), narrowed by JAX's own
``jax_cuda_visible_devices`` flag (CUDA device numbers; looked up in the user's JAX, never
imported). The mirror (:mod:`.mirror`) puts its entry on each of those, and each JAX device's
live arrays on the GPU that device stands for: on the CPU, where the demo's JAX runs, device
``k`` (``jax.devices()[k]``) stands for JAX's ``k``-th GPU (modulo their number, when the CPU
was given more devices than there are GPUs).

The rules kept from CUDA (as :mod:`jax_nbmem.gpu.visible` reads them; the simulated GPU stands
alone, so they are restated here, briefly): unset is every GPU, empty is none; an entry is a
number (the GPUs in index order), a ``GPU-`` UUID or a ``MIG-`` UUID (or a unique prefix of
either); CUDA stops at the first entry it cannot use, and at a repeated one. A GPU in MIG
mode stands for its instances.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Place", "cuda_places", "jax_places", "live_bytes_by_device"]

Place = tuple[int, "int | None"]  # (GPU index, MIG instance or None)


def _entry_places(entry: str, state: Any) -> list[Place] | None:
    """The devices one ``CUDA_VISIBLE_DEVICES`` entry names; None where CUDA stops at it."""
    devices = state.devices()
    gpus = state.gpu_indices()
    if entry.isdigit():
        if int(entry) >= len(gpus):
            return None
        index = gpus[int(entry)]
        return [(gpu, mig) for gpu, mig, _ in devices if gpu == index] or None
    if entry.startswith("GPU-"):
        named = [index for index in gpus if (state.uuid_of(index) or "").startswith(entry)]
        if len(named) != 1:
            return None
        return [(gpu, mig) for gpu, mig, _ in devices if gpu == named[0]] or None
    if entry.startswith("MIG-"):
        found = state.mig_instance(entry)
        return [found] if found is not None else None
    return None


def cuda_places(state: Any, environ: Mapping[str, str] | os._Environ) -> list[Place]:
    """The devices this process's CUDA sees under *environ*, CUDA device 0 first."""
    setting = environ.get("CUDA_VISIBLE_DEVICES")
    if setting is None:
        return [(gpu, mig) for gpu, mig, _ in state.devices()]
    places: list[Place] = []
    for entry in (part.strip() for part in setting.split(",")):
        found = _entry_places(entry, state) if entry else None
        if found is None or any(place in places for place in found):
            break  # CUDA ignores this entry and every one after it
        places.extend(found)
    return places


def _jax_cuda_visible_devices() -> tuple[int, ...] | None:
    """``jax_cuda_visible_devices`` as the user's JAX holds it; None: all (or no JAX).

    :func:`jax_nbmem.allocator.extras.cuda_visible_devices` reads it so for the extension; the
    simulated GPU imports nothing of the package, so it is read again here.
    """
    bridge = sys.modules.get("jax._src.xla_bridge")
    try:
        value = bridge.CUDA_VISIBLE_DEVICES.value  # type: ignore[union-attr]
        if not isinstance(value, str) or value == "all":
            return None
        return tuple(int(part) for part in value.split(","))
    except Exception:
        return None


def jax_places(places: Sequence[Place]) -> list[Place]:
    """The devices of *places* (CUDA's, in order) JAX makes a client on, JAX's device 0 first."""
    chosen = _jax_cuda_visible_devices()
    if chosen is None:
        return list(places)
    return [places[ordinal] for ordinal in chosen if 0 <= ordinal < len(places)]


def live_bytes_by_device() -> dict[int, int]:
    """The live JAX arrays' bytes by JAX device (its position in ``jax.devices()``).

    An array on one device counts there whole; a sharded one counts each of its shards where
    that shard lives. Never imports JAX: empty when the user has not.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return {}
    position = {device: k for k, device in enumerate(jax.devices())}
    found: dict[int, int] = {}
    for array in jax.live_arrays():
        devices = array.devices()
        if len(devices) == 1:
            (device,) = devices
            k = position.get(device, 0)
            found[k] = found.get(k, 0) + int(array.nbytes)
            continue
        for shard in array.addressable_shards:
            k = position.get(shard.device, 0)
            found[k] = found.get(k, 0) + int(shard.data.nbytes)
    return found
