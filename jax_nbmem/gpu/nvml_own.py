"""NVML's process lists read raw: one process's own entries, or all without pynvml's objects.

Part of :mod:`jax_nbmem.gpu.nvml`; imports no pynvml (the functions take it as ``nv``). NVML
tells a process's bytes on a GPU only inside that GPU's whole process list. pynvml's list calls
turn every entry into a Python object of its own, field by field (on a node with hundreds of
processes, most of a cell's boundary went there, and most of the sampler thread's time), so
this reads the compute and graphics lists through pynvml's own function pointers (``_v3``,
stepping down to ``_v2`` as :mod:`~jax_nbmem.gpu.nvml_processes` does, sharing its memory of
what the driver has) into a buffer each thread keeps. :func:`own_process_list` finds the
entries of one PID by searching the raw bytes: no object is made for another process's entry.
:func:`whole_process_list` takes every entry's PID and bytes out as two columns of ints (a
:class:`~jax_nbmem.gpu.nvml_processes.ProcessTable`), the list
:func:`~jax_nbmem.gpu.nvml_processes.one_process_list` gives, without an object an entry.

The entries and their meaning are pynvml's: a PID as NVML sees it (the host's), bytes ``None``
when NVML cannot say, impossible bytes left out and said.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable
from typing import Any

from jax_nbmem.gpu.nvml_memory import MAX_PLAUSIBLE_BYTES, gil_holding, plausible
from jax_nbmem.gpu.nvml_processes import (
    GpuProcesses,
    ProcessTable,
    merged_list,
    newest_process_call,
)
from jax_nbmem.gpu.nvml_session import Device, Session

__all__ = ["own_process_list", "whole_process_list"]

_KINDS = ("Compute", "Graphics")
_FIRST_CAPACITY = 64  # entries; the buffer grows to what a GPU's list needs, and stays
_NOT_AVAILABLE = (1 << 64) - 1  # NVML's "no figure" for a process's bytes


class _Buffers(threading.local):
    """Each thread's list buffer (two threads read at once: the cell's and the sampler's)."""

    def __init__(self) -> None:
        self.entry: Any = None  # the pynvml struct the buffer holds
        self.capacity = 0
        self.array: Any = None
        self.count = ctypes.c_uint(0)


_buffers = _Buffers()


def _entry_struct(nv: Any) -> Any:
    return getattr(nv, "c_nvmlProcessInfo_v3_t", None) or nv.c_nvmlProcessInfo_v2_t


def _buffer(nv: Any, capacity: int) -> Any:
    struct = _entry_struct(nv)
    if _buffers.entry is not struct or _buffers.capacity < capacity:
        _buffers.entry, _buffers.capacity = struct, capacity
        _buffers.array = (struct * capacity)()
    return _buffers.array


def _list_call(nv: Any, session: Session, kind: str, log_once: Callable[[str, str], None]) -> Any:
    """The function pointer of this kind's newest list call (see newest_process_call)."""
    return newest_process_call(nv, session, kind, log_once, nv._nvmlGetFunctionPointer)


def _held_on_main_thread(nv: Any, function: Any) -> Any:
    """*function*, called holding the GIL when this is the main thread (a cell's boundary).

    As the memory call there (:func:`~jax_nbmem.gpu.nvml_memory.read_memory`): released for
    the call, the GIL goes to a thread waiting for it (IPython's history writer), and the cell
    waits to take it back, many times what the call costs; a boundary reads only while readings
    are quick. Other threads (the sampler's) release it: a hang there never holds up a cell.
    """
    if threading.get_ident() != _MAIN_THREAD:
        return function
    return gil_holding(nv, function) or function


_MAIN_THREAD = threading.main_thread().ident


def _raw_list(nv: Any, device: Device, function: Any) -> tuple[bytes, int]:
    """The list's entries as bytes, and the size of one; grows the buffer when NVML says so."""
    for _attempt in range(3):
        array = _buffer(nv, max(_FIRST_CAPACITY, _buffers.capacity))
        count = _buffers.count
        count.value = _buffers.capacity
        result = function(device.handle, ctypes.byref(count), array)
        if result == nv.NVML_ERROR_INSUFFICIENT_SIZE:
            _buffer(nv, count.value * 2 + 5)  # room for processes that start meanwhile
            continue
        nv._nvmlCheckReturn(result)
        size = ctypes.sizeof(_buffers.entry)
        return ctypes.string_at(array, count.value * size), size
    raise nv.NVMLError(nv.NVML_ERROR_INSUFFICIENT_SIZE)


def _entries_of(data: bytes, size: int, entry: Any, pid: int) -> list[int]:
    """Raw bytes of every entry of *pid* in *data* (entries of *size* bytes): by search."""
    pid_at, used_at = entry.pid.offset, entry.usedGpuMemory.offset
    key = pid.to_bytes(ctypes.sizeof(ctypes.c_uint), sys.byteorder)
    found = []
    start = data.find(key)
    while start >= 0:
        if start % size == pid_at:  # a match inside another entry's bytes is not a PID
            at = start - pid_at + used_at
            found.append(int.from_bytes(data[at : at + 8], sys.byteorder))
        start = data.find(key, start + 1)
    return found


def own_process_list(
    nv: Any, session: Session, device: Device, log_once: Callable[[str, str], None], pid: int
) -> GpuProcesses:
    """One GPU's list holding only *pid*'s entry (none when NVML does not list it).

    As :func:`~jax_nbmem.gpu.nvml_processes.one_process_list` would give it, less everyone
    else: a PID on both lists appears once, with the first figure known (so the graphics list
    is read only when the compute list gave no figure of *pid*'s). Raises pynvml's
    errors, and :class:`~jax_nbmem.gpu.nvml_processes.NoProcessList`; ``log_once(key, message)``
    tells of a step down.
    """
    entries: list[tuple[int, int | None]] = []
    for kind in _KINDS:
        function = _held_on_main_thread(nv, _list_call(nv, session, kind, log_once))
        data, size = _raw_list(nv, device, function)
        entries += [(pid, _figure(raw)) for raw in _entries_of(data, size, _buffers.entry, pid)]
        if any(plausible(figure) is not None for _pid, figure in entries):
            # The first figure known is the one kept: a CUDA process (JAX's) is on the compute
            # list, read first, and its graphics entry, if any, could not change it.
            break
    return merged_list(device.index, entries)


def _figure(raw: int) -> int | None:
    """An entry's bytes as pynvml gives them: None for NVML's "not available"."""
    return None if raw == _NOT_AVAILABLE else raw


def _columns(data: bytes, entry: Any) -> tuple[list[int], list[int]]:
    """Every entry's PID and bytes in *data*, as two lists of ints: no object an entry.

    Read through strided views of the raw bytes: ctypes puts a struct's fields at their own
    alignment, so in pynvml's entries the PID falls on 4 bytes and the figure on 8.
    """
    pid_at, used_at, size = entry.pid.offset, entry.usedGpuMemory.offset, ctypes.sizeof(entry)
    view = memoryview(data)
    pids = view.cast("I")[pid_at // 4 :: size // 4]
    used = view.cast("Q")[used_at // 8 :: size // 8]
    return pids.tolist(), used.tolist()


def whole_process_list(
    nv: Any, session: Session, device: Device, log_once: Callable[[str, str], None]
) -> GpuProcesses:
    """One GPU's whole list, as :func:`~jax_nbmem.gpu.nvml_processes.one_process_list` gives it.

    A PID on both lists appears once, with the first figure known; impossible bytes are left
    out and said in ``problem``. Raises pynvml's errors, and
    :class:`~jax_nbmem.gpu.nvml_processes.NoProcessList`.
    """
    pids: list[int] = []
    used: list[int] = []
    for kind in _KINDS:
        data, _size = _raw_list(nv, device, _list_call(nv, session, kind, log_once))
        more_pids, more_used = _columns(data, _buffers.entry)
        pids += more_pids
        used += more_used
    index = device.index
    if not pids or (max(used) <= MAX_PLAUSIBLE_BYTES and len(set(pids)) == len(pids)):
        # The common case, each PID once with its bytes: the columns are the list.
        return GpuProcesses(index, ProcessTable(index, pids, used))
    # A PID on both lists, or bytes NVML cannot say or no GPU could hold: merged as pynvml's.
    return merged_list(index, [(p, _figure(raw)) for p, raw in zip(pids, used, strict=True)])
