"""One GPU's memory as NVML reports it, and the checks that keep impossible numbers out.

Part of :mod:`jax_nbmem.gpu.nvml`; imports no pynvml (the functions take it as ``nv``).
Numbers NVML cannot mean (used above total, 2**64 - 1, a petabyte card) are dropped to ``None``
with a ``problem`` rather than passed on. The v2 memory call is made through pynvml's own
function pointer, so another tool's replacement of ``nvmlDeviceGetMemoryInfo`` costs nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jax_nbmem.gpu.mig import MigInstance, gpu_label
from jax_nbmem.gpu.nvml_errors import error_name
from jax_nbmem.gpu.nvml_session import Device, Session

__all__ = [
    "MAX_PLAUSIBLE_BYTES",
    "GpuMemory",
    "plausible",
    "gil_holding",
    "read_memories",
    "read_memory",
    "unreadable",
]

_log = logging.getLogger("jax_nbmem.gpu.nvml")
_MAIN_THREAD = threading.main_thread().ident

# No GPU has a petabyte; NVML's "not available" (2**64 - 1) and garbage land above it.
MAX_PLAUSIBLE_BYTES = 1 << 50
# used + reserved + free may exceed total by rounding in the driver; more than this is not.
_SUM_SLACK_BYTES = 64 << 20


@dataclass(frozen=True)
class GpuMemory:
    """Memory of one GPU, by NVML index. Any number is ``None`` when NVML could not say.

    ``used_bytes`` is NVML's v2 ``used``, as nvidia-smi, nvitop and gpustat show it; the
    memory the driver reserves for itself is apart, in ``reserved_bytes``, so that
    ``used + reserved + free == total``. Where only the v1 call answers (an old driver or
    pynvml), ``reserved_bytes`` is ``None`` and ``used_bytes`` includes the reserved part.
    ``uuid`` and ``name`` are ``None`` only for a GPU that failed before NVML ever named it.
    ``problem`` says, in one line, why numbers are missing. A MIG instance has ``mig`` (where
    it lives, see :mod:`jax_nbmem.gpu.mig`) and its own memory; a GPU split into instances has
    ``mig_mode`` True.
    """

    index: int
    uuid: str | None
    name: str | None
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    reserved_bytes: int | None = None
    problem: str | None = None
    mig: MigInstance | None = None
    mig_mode: bool = False

    @property
    def label(self) -> str:
        """How a person reads it: "GPU 0", or "MIG 3g.71gb instance 1 of GPU 0"."""
        return gpu_label(self)


def plausible(value: Any, limit: int = MAX_PLAUSIBLE_BYTES) -> int | None:
    """``value`` as bytes if a GPU could report it, else None."""
    return value if isinstance(value, int) and 0 <= value <= limit else None


def read_memory(
    nv: Any, session: Session, device: Device, log_once: Callable[[str, str], None]
) -> GpuMemory:
    """One GPU's memory: v2 (reserved apart) where driver and pynvml have it, else v1.

    Raises pynvml's errors; ``log_once(key, message)`` tells of a step down to v1, once.
    """
    if session.memory_v2:
        try:
            raw = _raw_v2(nv, session, device.handle, log_once)
        except nv.NVMLError as error:
            if error_name(nv, error) not in ("FUNCTION_NOT_FOUND", "NOT_SUPPORTED"):
                raise
            raw = None
            log_once("memory_v2", "NVML has no v2 memory info; using v1 (no reserved)")
        if raw is not None:
            return _reading_of(device, raw)
        session.memory_v2 = False
    info = nv.nvmlDeviceGetMemoryInfo(device.handle)
    # A replacement of pynvml's function (gpustat's) may itself have asked for v2.
    reserved = getattr(info, "reserved", None)
    return _checked_memory(device, info.total, info.used, info.free, reserved)


def read_memories(nv: Any, session: Session, devices: Sequence[Device]) -> list[GpuMemory] | None:
    """Every device's reading in one pass: :func:`read_memory`'s v2 case, resolved once a pass.

    A cell's boundary reads each of the kernel's GPUs (eight, on a node); per GPU this is the
    call and a comparison with the figures it gave last, which give that reading again. None
    where a device is not that case (no handle, a problem of its own, no v2 call resolved yet,
    an error): then :func:`read_memory`, device by device, says what there is.
    """
    fast = session.memory_v2_call
    if not fast or not session.memory_v2:
        return None
    function, memory, ref = _v2_call(fast)
    readings = []
    for device in devices:
        handle = device.handle
        if handle is None or device.problem or function(handle, ref):
            return None
        raw = (memory.total, memory.used, memory.free, memory.reserved)
        readings.append(_reading_of(device, raw))
    return readings


def _reading_of(device: Device, raw: tuple[Any, Any, Any, Any]) -> GpuMemory:
    """The reading of NVML's v2 figures *raw*: the same figures as last time, the same reading."""
    seen = device.memory_seen
    if seen is not None and seen[0] == raw:
        return seen[1]  # a cell's boundary's case: nothing moved
    reading = _checked_memory(device, *raw)
    device.memory_seen = (raw, reading)  # one attribute: a reader sees both or neither
    return reading


def _v2_call(fast: tuple[Any, ...]) -> tuple[Any, Any, Any]:
    """What a v2 reading passes NVML: the call for this thread, and this thread's struct.

    The call holds the GIL on the main thread (see _fast_v2); the struct has its version set,
    and comes with its reference.
    """
    function, held, _check, layout, version = fast
    if held is not None and threading.get_ident() == _MAIN_THREAD:
        function = held  # a cell's boundary: see _fast_v2
    structs = _structs
    if structs.layout is not layout:
        _memory_struct(layout)
    memory = structs.memory
    memory.version = version  # NVML reads it and never writes it
    return function, memory, structs.ref


def _raw_v2(
    nv: Any, session: Session, handle: Any, log_once: Callable[[str, str], None]
) -> tuple[Any, Any, Any, Any] | None:
    """NVML's v2 figures (total, used, free, reserved), or None if pynvml cannot ask for them.

    Every cell's boundary reads each of the kernel's GPUs: the call is resolved once per
    session (pynvml's function pointer, its check, the struct's layout and version) and made
    into a struct each thread keeps, with its reference, so that a reading costs the call.
    """
    fast = session.memory_v2_call
    if fast is None:
        fast = session.memory_v2_call = _fast_v2(nv)
    if not fast:
        info = _memory_v2(nv, handle, log_once)
        return None if info is None else (info.total, info.used, info.free, info.reserved)
    function, memory, ref = _v2_call(fast)
    result = function(handle, ref)
    if result:
        fast[2](result)  # pynvml's check: raises NVML's error
    return (memory.total, memory.used, memory.free, memory.reserved)


def _fast_v2(nv: Any) -> tuple[Any, ...]:
    """The v2 call (and one that holds the GIL, or None), its check, struct and version.

    () where pynvml lacks one of them.

    Raises NVML's FUNCTION_NOT_FOUND where the driver has no v2 call.
    """
    struct = getattr(nv, "c_nvmlMemory_v2_t", None)
    version = getattr(nv, "nvmlMemory_v2", None)
    pointer = getattr(nv, "_nvmlGetFunctionPointer", None)
    check = getattr(nv, "_nvmlCheckReturn", None)
    if struct is None or version is None or pointer is None or check is None:
        return ()
    function = pointer("nvmlDeviceGetMemoryInfo_v2")
    # On the main thread (IPython's, where cells and their boundaries run) the same function
    # of the same library is called holding the GIL. Released for the call, the GIL goes to
    # a thread waiting for it (IPython's history writer, woken by every cell), and the cell
    # waits to take it back: many times what the call costs. A cell's boundary reads only
    # while the last readings were quick (the sampler's budget); a hung call blocks the main
    # thread either way. Other threads (the sampler's) release it: a hang there never holds
    # up a cell.
    return (function, gil_holding(nv, function), check, struct, version)


def gil_holding(nv: Any, function: Any) -> Any | None:
    """The same NVML call as pynvml's *function*, made holding the GIL; None where it cannot be.

    For a cell's boundary, on the main thread (see _fast_v2). None for a pynvml without its
    library's name or the call's: then the call is made as pynvml makes it. Made once per
    library and call.
    """
    key = (getattr(getattr(nv, "nvmlLib", None), "_name", None), getattr(function, "__name__", ""))
    if key not in _gil_holding:
        try:
            if not key[0] or not key[1]:  # never the process's own symbols (a None name's)
                raise LookupError("no library or call name")
            held = getattr(ctypes.PyDLL(key[0]), key[1])
            held.restype = function.restype
        except Exception:
            _log.debug("NVML's %s is called releasing the GIL", key[1], exc_info=True)
            held = None
        _gil_holding[key] = held
    return _gil_holding[key]


_gil_holding: dict[tuple[Any, str], Any] = {}  # (library, call): the call holding the GIL


def _memory_v2(nv: Any, handle: Any, log_once: Callable[[str, str], None]) -> Any:
    """NVML's v2 memory info (``reserved`` apart from ``used``), or None if pynvml cannot ask.

    Asked through pynvml's own function pointer and struct, not ``nvmlDeviceGetMemoryInfo(
    handle, version=)``: other tools in the process replace that function (gpustat with one
    that takes only the handle), and their replacement must not cost us the readings.
    """
    struct = getattr(nv, "c_nvmlMemory_v2_t", None)
    version = getattr(nv, "nvmlMemory_v2", None)
    function = getattr(nv, "_nvmlGetFunctionPointer", None)
    check = getattr(nv, "_nvmlCheckReturn", None)
    if version is None:
        log_once("memory_v2", "this pynvml has no v2 memory info; using v1 (no reserved)")
        return None
    if struct is None or function is None or check is None:
        try:  # a pynvml without these private names: its public call, if not replaced
            return nv.nvmlDeviceGetMemoryInfo(handle, version=version)
        except TypeError:
            log_once(
                "memory_v2",
                "pynvml.nvmlDeviceGetMemoryInfo was replaced by one that takes no version; "
                "using v1 (no reserved)",
            )
            return None
    memory = _memory_struct(struct)
    memory.version = version
    check(function("nvmlDeviceGetMemoryInfo_v2")(handle, ctypes.byref(memory)))
    return memory


class _Structs(threading.local):
    """Each thread's reused struct for the v2 memory call (two threads read at once)."""

    def __init__(self) -> None:
        self.layout: Any = None
        self.memory: Any = None
        self.ref: Any = None  # ctypes.byref(memory), made once


_structs = _Structs()


def _memory_struct(struct: Any) -> Any:
    """A reused struct with the fields of pynvml's *struct*, read plain.

    pynvml's own struct wraps every attribute read in Python code of its own, which each
    reading at a cell's boundary would pay.
    """
    if _structs.layout is not struct:
        plain = type("PlainMemoryV2", (ctypes.Structure,), {"_fields_": struct._fields_})
        memory = plain()
        _structs.layout, _structs.memory, _structs.ref = struct, memory, ctypes.byref(memory)
    return _structs.memory


def _checked_memory(
    device: Device, total: Any, used: Any, free: Any, reserved: Any | None
) -> GpuMemory:
    """The reading as GpuMemory, with figures that cannot be true dropped and said.

    ``reserved`` is None for NVML's v1 reading, whose ``used`` includes the reserved memory.
    """
    reading = functools.partial(
        GpuMemory, device.index, device.uuid, device.name, mig=device.mig, mig_mode=device.mig_mode
    )
    good_total = plausible(total)
    if not good_total:
        problem = f"{gpu_label(device)}: NVML reported an impossible total ({total!r} bytes)"
        return reading(None, None, None, None, problem=problem + "; not shown")
    good_reserved = None if reserved is None else plausible(reserved, good_total)
    good_used = plausible(used, good_total)
    good_free = plausible(free, good_total)
    problems = []
    if good_used is None:
        problems.append(f"used {used!r}")
    if reserved is not None and good_reserved is None:
        problems.append(f"reserved {reserved!r}")
    if good_free is None:
        problems.append(f"free {free!r}")
    parts = [good_used, good_free] + ([] if reserved is None else [good_reserved])
    if None not in parts and sum(parts) > good_total + _SUM_SLACK_BYTES:
        named = f"used {used!r}" + ("" if reserved is None else f", reserved {reserved!r}")
        problems.append(f"{named} and free {free!r} exceed the total")
        good_used = good_free = good_reserved = None
    if problems:
        problem = (
            f"{gpu_label(device)}: NVML reported {'; '.join(problems)} of {good_total} bytes in "
            "all, which cannot be; those figures are not shown"
        )
        return reading(good_total, good_used, good_free, good_reserved, problem=problem)
    return reading(good_total, good_used, good_free, good_reserved)


def unreadable(device: Device, problem: str | None) -> GpuMemory:
    """The reading of a GPU NVML could not read: every number ``None``, and why."""
    return GpuMemory(
        device.index, device.uuid, device.name, None, None, None, problem=problem,
        mig=device.mig, mig_mode=device.mig_mode,
    )  # fmt: skip
