"""MIG: a GPU split into instances, each shown by jax_nbmem as a GPU of its own.

A MIG instance is, to NVML and to CUDA, a device of its own: its own ``MIG-`` UUID, memory
and process list. jax_nbmem lists it beside the whole GPUs, under a number of its own (after
the whole GPUs' NVML indices), and says where it lives with a :class:`MigInstance`: its parent
GPU (NVML index and UUID), its GPU and compute instance ids and its profile ("3g.71gb"). A
person reads it as its :func:`gpu_label`, "MIG 3g.71gb instance 1 of GPU 0"; Prometheus as
dcgm-exporter labels it (the parent's ``UUID`` and ``gpu``, ``GPU_I_ID``, ``GPU_I_PROFILE``).

Pure: no NVML, no JAX. :mod:`jax_nbmem.gpu.nvml_session` fills these in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "NO_ROOT_NOTE",
    "MigInstance",
    "gpu_label",
    "mig_dict",
    "profile_from_name",
    "shown_order",
]

# What a user other than root is told about a GPU in MIG mode (NVML: NO_PERMISSION).
NO_ROOT_NOTE = (
    "MIG instances other than yours cannot be read without root; the GPU's own memory and "
    "process list are root's"
)
# "NVIDIA H200 MIG 3g.71gb", "NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb", "MIG 2g.20gb"
_PROFILE = re.compile(r"(?:^|\s)MIG\s+((?:\d+c\.)?\d+g\.\d+gb(?:\+\w+)*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class MigInstance:
    """Where a MIG instance lives: its parent GPU, its instance ids and its profile.

    ``parent_uuid`` is ``None`` when NVML could not name the parent; ``profile`` is ``None``
    when the instance's name carries none (``gpu_label`` then says "MIG instance 1 of GPU 0").
    ``compute_instance_id`` is ``None`` when NVML could not say it.
    """

    parent_index: int
    parent_uuid: str | None
    gpu_instance_id: int
    compute_instance_id: int | None
    profile: str | None


def profile_from_name(name: str | None) -> str | None:
    """The MIG profile in an instance's NVML name ("NVIDIA H200 MIG 3g.71gb" → "3g.71gb")."""
    if not name:
        return None
    found = _PROFILE.search(name)
    return found.group(1) if found else None


def gpu_label(gpu: Any) -> str:
    """How a person reads a GPU: "GPU 0", or "MIG 3g.71gb instance 1 of GPU 0".

    A second compute instance of a GPU instance is "MIG 1c.3g.40gb instance 1 compute
    instance 1 of GPU 0" (compute instance 0 goes unsaid).

    ``gpu`` is anything with an ``index`` and, for an instance, a ``mig`` (:class:`MigInstance`).
    """
    mig = getattr(gpu, "mig", None)
    if not isinstance(mig, MigInstance):
        return f"GPU {gpu.index}"
    profile = f"MIG {mig.profile}" if mig.profile else "MIG"
    # A GPU instance split further into compute instances: each is a device; say which.
    compute = f" compute instance {mig.compute_instance_id}" if mig.compute_instance_id else ""
    return f"{profile} instance {mig.gpu_instance_id}{compute} of GPU {mig.parent_index}"


def report_label(gpu: Mapping[str, Any]) -> str:
    """The label of a GPU entry of a status report (JSON): its ``label``, else "GPU N"."""
    return gpu.get("label") or f"GPU {gpu.get('index')}"


def shown_order(index: int, parent_index: int | None) -> tuple[int, int]:
    """Where a GPU is listed: a MIG instance right after the GPU it splits, in its own order.

    ``parent_index`` is the instance's parent GPU's NVML index, ``None`` for a whole GPU.
    """
    return (index, -1) if parent_index is None else (parent_index, index)


def mig_dict(mig: MigInstance | None) -> dict[str, Any] | None:
    """The JSON form of a :class:`MigInstance` (None for a whole GPU)."""
    return None if mig is None else asdict(mig)
