"""Which GPUs are ours: the NVML GPUs this process's CUDA (and so JAX) can see.

NVML numbers every GPU on the machine by PCI bus id. CUDA numbers only the GPUs that
``CUDA_VISIBLE_DEVICES`` lets through, in the order it lists them, and numbers integer entries
by ``CUDA_DEVICE_ORDER``: ``PCI_BUS_ID`` (the same order as NVML) or the default
``FASTEST_FIRST``, which agrees with NVML only when every GPU is the same model. This module
turns the environment into NVML indices in CUDA ordinal order, and says when that mapping is
uncertain or the variable is invalid. It reads only what it is given: no NVML, no JAX.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

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


def visible_gpus(nvml_gpus: Sequence[_NamedGpu], environ: Mapping[str, str]) -> VisibleGpus:
    """Return the NVML indices CUDA sees under ``environ``, CUDA device 0 first.

    Follows CUDA's rules for ``CUDA_VISIBLE_DEVICES``: unset means every GPU, empty means
    none, entries are integers or ``GPU-`` UUIDs (or a unique prefix of one), and CUDA stops at
    the first invalid entry. MIG devices are not supported: they are left out and the note
    says so. With no GPUs from NVML the answer is empty and the note is ``None``.
    """
    devices = sorted(nvml_gpus, key=lambda device: device.index)
    if not devices:
        return VisibleGpus(())
    order_note = _integer_order_note(devices, environ)
    setting = environ.get("CUDA_VISIBLE_DEVICES")
    if setting is None:
        return VisibleGpus(tuple(device.index for device in devices), order_note)

    entries = [entry.strip() for entry in setting.split(",")]
    if entries and entries[-1] == "":
        entries.pop()  # "", or a trailing comma: nothing more to see either way
    chosen: list[int] = []
    notes: list[str] = []
    used_integer = False
    for entry in entries:
        problem = None
        device: _NamedGpu | None = None
        if entry.startswith("MIG-"):
            notes.append(f"MIG device {entry} is not supported by jax_nbmem; it is not shown")
            continue
        if entry.startswith("GPU-"):
            device, problem = _by_uuid(entry, devices)
        elif entry.isdigit():
            ordinal = int(entry)
            if ordinal < len(devices):
                device, used_integer = devices[ordinal], True
            else:
                problem = f"is beyond the {len(devices)} GPU(s) on this machine"
        elif entry.startswith("-") and entry[1:].isdigit():
            problem = "is negative (a common way to hide every GPU)"
        else:
            problem = "is neither a GPU number nor a GPU-... UUID"
        if device is not None and device.index in chosen:
            problem = "repeats a GPU listed earlier (how CUDA treats that is undocumented)"
        if problem is not None:
            notes.append(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} {problem}; "
                "CUDA ignores it and every entry after it"
            )
            break
        assert device is not None
        chosen.append(device.index)
    if used_integer and order_note:
        notes.insert(0, order_note)
    return VisibleGpus(tuple(chosen), "; ".join(notes) or None)
