"""A GPU's MIG instances as NVML lists them, for :mod:`jax_nbmem.gpu.nvml_session`.

Imports no pynvml (the functions take it as ``nv``). A GPU in MIG mode has instances that are
NVML devices of their own (``nvmlDeviceGetMigDeviceHandleByIndex``); each is read here once per
session: its UUID, name, GPU and compute instance ids and its profile. A driver or pynvml
without the MIG calls has no MIG GPU; an instance that cannot be read is left out and said.
:func:`mig_layout` is the cheap look that tells a session its GPU was split anew.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax_nbmem.gpu.mig import MigInstance, profile_from_name
from jax_nbmem.gpu.nvml_errors import error_name, error_text

__all__ = ["MigDevice", "in_mig_mode", "mig_devices", "mig_layout"]


class MigDevice:
    """One instance as the session needs it: handle, UUID, name and where it lives."""

    __slots__ = ("handle", "mig", "name", "uuid")

    def __init__(self, handle: Any, uuid: str, name: str, mig: MigInstance) -> None:
        self.handle, self.uuid, self.name, self.mig = handle, uuid, name, mig


def in_mig_mode(nv: Any, handle: Any) -> bool:
    """Whether the GPU is in MIG mode now; False where the driver or pynvml has no MIG."""
    getter = getattr(nv, "nvmlDeviceGetMigMode", None)
    if getter is None:
        return False
    try:
        current, _pending = getter(handle)
    except nv.NVMLError as error:
        if error_name(nv, error) in ("LIBRARY_NOT_FOUND", "DRIVER_NOT_LOADED", "UNINITIALIZED"):
            raise
        return False  # NOT_SUPPORTED (no MIG on this GPU), FUNCTION_NOT_FOUND (old driver)
    return int(getattr(current, "value", current)) == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)


def _number(value: Any) -> int:
    return int(getattr(value, "value", value))


def mig_devices(
    nv: Any,
    parent_index: int,
    parent_uuid: str | None,
    handle: Any,
    read_string: Callable[[Any, str, Callable[[Any], Any]], str],
) -> tuple[list[MigDevice], list[str]]:
    """The instances of the GPU at ``handle`` (in MIG mode), and problems met on the way.

    ``read_string(handle, function_name, getter)`` reads a UUID or name (see
    :func:`~jax_nbmem.gpu.nvml_session.device_string`). Positions without an instance (NVML's
    NOT_FOUND) are skipped; NVML numbers the positions, not the instances.
    """
    found: list[MigDevice] = []
    problems: list[str] = []
    try:
        positions = _number(nv.nvmlDeviceGetMaxMigDeviceCount(handle))
    except nv.NVMLError as error:
        return [], [f"GPU {parent_index}: its MIG instances cannot be listed: {error_text(error)}"]
    for position in range(positions):
        try:
            mig_handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, position)
        except nv.NVMLError:
            continue  # no instance at this position
        try:
            uuid = read_string(mig_handle, "nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID)
            name = read_string(mig_handle, "nvmlDeviceGetName", nv.nvmlDeviceGetName)
            gpu_instance = _number(nv.nvmlDeviceGetGpuInstanceId(mig_handle))
        except nv.NVMLError as error:
            problems.append(
                f"GPU {parent_index}: MIG instance at position {position} cannot be read: "
                f"{error_text(error)}"
            )
            continue
        try:
            compute_instance: int | None = _number(nv.nvmlDeviceGetComputeInstanceId(mig_handle))
        except nv.NVMLError:
            compute_instance = None
        place = MigInstance(
            parent_index, parent_uuid, gpu_instance, compute_instance, profile_from_name(name)
        )
        found.append(MigDevice(mig_handle, uuid, name, place))
    found.sort(key=lambda device: (device.mig.gpu_instance_id, device.mig.compute_instance_id or 0))
    return found, problems


def mig_layout(nv: Any, handle: Any) -> tuple[int, ...] | None:
    """The GPU instance ids the GPU at ``handle`` has now, by position; ``None`` out of MIG mode.

    A GPU in MIG mode whose positions cannot be counted is ``()``; an instance whose id cannot
    be read is ``-1``. Costs one call, and on a GPU in MIG mode one per position (seven on an
    H100) and one per instance: no name or UUID is read.
    """
    if not in_mig_mode(nv, handle):
        return None
    try:
        positions = _number(nv.nvmlDeviceGetMaxMigDeviceCount(handle))
    except nv.NVMLError:
        return ()
    found = []
    for position in range(positions):
        try:
            mig_handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, position)
        except nv.NVMLError:
            continue
        try:
            found.append(_number(nv.nvmlDeviceGetGpuInstanceId(mig_handle)))
        except nv.NVMLError:
            found.append(-1)
    return tuple(found)
