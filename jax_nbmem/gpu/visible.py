"""Which GPUs are ours: the NVML GPUs this process's CUDA (and so JAX) can see.

NVML numbers every GPU on the machine by PCI bus id. CUDA numbers only the GPUs that
``CUDA_VISIBLE_DEVICES`` lets through, in the order it lists them, and numbers integer entries
by ``CUDA_DEVICE_ORDER``: ``PCI_BUS_ID`` (the same order as NVML) or the default
``FASTEST_FIRST``, which agrees with NVML only when every GPU is the same model. This module
turns the environment into NVML indices in CUDA ordinal order, and says when that mapping is
uncertain or the variable is invalid. It reads only what it is given: no NVML, no JAX.

MIG: a GPU in MIG mode runs nothing itself; CUDA sees its instances. An instance is named by
its ``MIG-`` UUID (or a unique prefix), or the older ``MIG-GPU-<uuid>/<GI>/<CI>``; a GPU in MIG
mode named by number or ``GPU-`` UUID (or every GPU, with the variable unset) stands for its
instances, and the note says so. Instances are the "GPUs" jax_nbmem numbers after the whole
GPUs (see :mod:`jax_nbmem.gpu.mig`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from jax_nbmem.gpu.mig import MigInstance

__all__ = ["VisibleGpus", "visible_gpus"]


class _NamedGpu(Protocol):
    """What we need of a GPU (``jax_nbmem.gpu.nvml.GpuMemory`` fits)."""

    @property
    def index(self) -> int: ...  # noqa: D102
    @property
    def uuid(self) -> str | None: ...  # noqa: D102
    @property
    def name(self) -> str | None: ...  # noqa: D102


@dataclass(frozen=True)
class VisibleGpus:
    """NVML indices of the GPUs CUDA sees, CUDA device 0 first.

    ``note`` is one or more sentences for users when the mapping is uncertain or
    ``CUDA_VISIBLE_DEVICES`` holds something CUDA will not use; ``None`` when all is clear.
    """

    indices: tuple[int, ...]
    note: str | None = None


def _integer_order_note(devices: Sequence[_NamedGpu], environ: Mapping[str, str]) -> str | None:
    """Say why CUDA's integer numbering may differ from NVML's, or None when it cannot."""
    order = environ.get("CUDA_DEVICE_ORDER")
    if order == "PCI_BUS_ID":
        return None
    notes = []
    if order not in (None, "FASTEST_FIRST"):
        notes.append(
            f"CUDA_DEVICE_ORDER={order!r} is neither PCI_BUS_ID nor FASTEST_FIRST, "
            "so CUDA uses its default, FASTEST_FIRST"
        )
    names = {device.name for device in devices}
    if len(devices) > 1 and (len(names) > 1 or None in names):
        notes.append(
            "CUDA numbers GPUs fastest first and these are not all the same model, so which "
            "CUDA device is which GPU is a guess (PCI bus order); set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID to make it certain"
        )
    return "; ".join(notes) or None


def _mig(device: _NamedGpu) -> MigInstance | None:
    mig = getattr(device, "mig", None)
    return mig if isinstance(mig, MigInstance) else None


def _instances_of(parent: _NamedGpu, instances: Sequence[_NamedGpu]) -> list[_NamedGpu]:
    return [i for i in instances if _mig(i).parent_index == parent.index]  # type: ignore[union-attr]


def _by_mig_uuid(
    entry: str, whole: Sequence[_NamedGpu], instances: Sequence[_NamedGpu]
) -> tuple[_NamedGpu | None, str | None]:
    """Find the instance ``entry`` names: ``MIG-<uuid>`` (or a prefix), or ``MIG-GPU-.../GI/CI``."""
    parts = entry.split("/")
    if entry.startswith("MIG-GPU-") and len(parts) == 3 and all(p.isdigit() for p in parts[1:]):
        parent_uuid, gi, ci = parts[0].removeprefix("MIG-"), int(parts[1]), int(parts[2])
        parents = [d for d in whole if d.uuid and d.uuid.startswith(parent_uuid)]
        if len(parents) > 1:
            return None, f"matches {len(parents)} GPUs (a UUID prefix must name one)"
        matches = [
            i for i in instances
            if parents and _mig(i).parent_index == parents[0].index  # type: ignore[union-attr]
            and (_mig(i).gpu_instance_id, _mig(i).compute_instance_id or 0) == (gi, ci)  # type: ignore[union-attr]
        ]  # fmt: skip
    else:
        matches = [i for i in instances if i.uuid and i.uuid.startswith(entry)]
    if len(matches) == 1:
        return matches[0], None
    if matches:
        return None, f"matches {len(matches)} MIG instances (a UUID prefix must name one)"
    return None, "matches no MIG instance on this machine"


def _by_uuid(entry: str, devices: Sequence[_NamedGpu]) -> tuple[_NamedGpu | None, str | None]:
    """Find the GPU whose UUID starts with ``entry``; else say why not."""
    matches = [device for device in devices if device.uuid and device.uuid.startswith(entry)]
    if len(matches) == 1:
        return matches[0], None
    if matches:
        return None, f"matches {len(matches)} GPUs (a UUID prefix must name one)"
    if any(device.uuid is None for device in devices):
        return None, "matches no GPU whose UUID NVML could read"
    return None, "matches no GPU on this machine"


def _mig_note(parents: Sequence[_NamedGpu]) -> str | None:
    """Say that GPUs in MIG mode stand for their instances, and what is uncertain about that."""
    if not parents:
        return None
    named = ", ".join(f"GPU {p.index}" for p in parents)
    return (
        f"{named} {'is' if len(parents) == 1 else 'are'} in MIG mode: CUDA sees MIG instances, "
        "not the GPU, and all of them are shown as this process's (CUDA before 12 uses only the "
        "first); name one with CUDA_VISIBLE_DEVICES=MIG-<its UUID> to make it certain"
    )


def _device_for(
    entry: str, devices: list[_NamedGpu], instances: list[_NamedGpu]
) -> tuple[_NamedGpu | None, str | None]:
    """The device one ``CUDA_VISIBLE_DEVICES`` entry names, or why CUDA stops at it."""
    if entry.startswith("MIG-"):
        return _by_mig_uuid(entry, devices, instances)
    if entry.startswith("GPU-"):
        return _by_uuid(entry, devices)
    if entry.isdigit():
        ordinal = int(entry)
        if ordinal < len(devices):
            return devices[ordinal], None
        return None, f"is beyond the {len(devices)} GPU(s) on this machine"
    if entry.startswith("-") and entry[1:].isdigit():
        return None, "is negative (a common way to hide every GPU)"
    return None, "is neither a GPU number nor a GPU-... or MIG-... UUID"


def visible_gpus(nvml_gpus: Sequence[_NamedGpu], environ: Mapping[str, str]) -> VisibleGpus:
    """Return the NVML indices CUDA sees under ``environ``, CUDA device 0 first.

    Follows CUDA's rules for ``CUDA_VISIBLE_DEVICES``: unset means every GPU, empty means
    none, entries are integers, ``GPU-`` UUIDs or ``MIG-`` UUIDs (or a unique prefix of one),
    and CUDA stops at the first invalid entry. A GPU in MIG mode stands for its instances (see
    the module's docstring). With no GPUs from NVML the answer is empty and the note is ``None``.
    """
    every = sorted(nvml_gpus, key=lambda device: device.index)
    devices = [device for device in every if _mig(device) is None]
    instances = [device for device in every if _mig(device) is not None]
    if not devices:
        return VisibleGpus(())
    order_note = _integer_order_note(devices, environ)
    setting = environ.get("CUDA_VISIBLE_DEVICES")
    if setting is None:
        chosen_all: list[int] = []
        split = [d for d in devices if getattr(d, "mig_mode", False)]
        for device in devices:
            inside = _instances_of(device, instances) if device in split else [device]
            chosen_all.extend(d.index for d in inside)
        notes = [n for n in (order_note, _mig_note(split)) if n]
        return VisibleGpus(tuple(chosen_all), "; ".join(notes) or None)

    entries = [entry.strip() for entry in setting.split(",")]
    if entries and entries[-1] == "":
        entries.pop()  # "", or a trailing comma: nothing more to see either way
    chosen: list[int] = []
    notes: list[str] = []
    split_named: list[_NamedGpu] = []
    used_integer = False
    for entry in entries:
        device, problem = _device_for(entry, devices, instances)
        used_integer = used_integer or (device is not None and entry.isdigit())
        inside = [device] if device is not None else []
        if device is not None and getattr(device, "mig_mode", False):
            inside = _instances_of(device, instances)
            split_named.append(device)
        if any(d.index in chosen for d in inside):
            problem = "repeats a GPU listed earlier (how CUDA treats that is undocumented)"
        if problem is not None:
            notes.append(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} {problem}; "
                "CUDA ignores it and every entry after it"
            )
            break
        chosen.extend(d.index for d in inside)
    mig_note = _mig_note(split_named)
    if mig_note:
        notes.insert(0, mig_note)
    if used_integer and order_note:
        notes.insert(0, order_note)
    return VisibleGpus(tuple(chosen), "; ".join(notes) or None)
