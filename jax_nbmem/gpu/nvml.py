"""GPU memory and GPU processes as NVML reports them; the only module that imports pynvml.

Every failure comes back as a value: an empty list, ``None`` fields, and a one-line reason from
``status()`` that a person can act on. Nothing here raises to the caller. NVML is initialized
lazily, once, under a lock; device handles, UUIDs and names are cached for that session, so
``memory()`` costs only the memory calls (and, every few seconds, a look whether a GPU was
split anew into MIG instances, which lists them again). When a GPU is lost or the driver stops
answering, calls keep answering politely and the session is rebuilt after a short, growing
pause, so the numbers come back by themselves when NVML does.

Numbers NVML cannot mean (used above total, 2**64 - 1, a petabyte card) are dropped to ``None``
with a ``problem`` rather than passed on, and a name that is not valid UTF-8 is shown with
backslash escapes. Each call's duration is kept: a call slower than ``SLOW_CALL_S`` makes
``status()`` say that NVML is slow, and :func:`last_status` answers without touching NVML at
all, for callers that must never wait.

Other tools in the process (gpustat) replace pynvml's functions; the v2 memory call is made
through pynvml's own function pointer, so a replaced ``nvmlDeviceGetMemoryInfo`` costs nothing.

Safe to call from a sampler thread and the main thread at once.

This module is the public face, and the one that imports pynvml; the parts it is made of are
handed the pynvml module and import none: :mod:`~jax_nbmem.gpu.nvml_session` (the session's
lifecycle: init, cached handles, retries; :mod:`~jax_nbmem.gpu.nvml_mig` lists a GPU's MIG
instances, each a GPU of its own, see :mod:`~jax_nbmem.gpu.mig`),
:mod:`~jax_nbmem.gpu.nvml_memory` (readings and their plausibility),
:mod:`~jax_nbmem.gpu.nvml_processes` (process lists), :mod:`~jax_nbmem.gpu.nvml_own` (this
process's entries in them, read raw) and :mod:`~jax_nbmem.gpu.nvml_errors`
(what NVML's errors mean for users).
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from jax_nbmem.gpu.mig import NO_ROOT_NOTE
from jax_nbmem.gpu.nvml_errors import device_problem, error_name, gpu_problem, unlisted
from jax_nbmem.gpu.nvml_memory import GpuMemory, read_memories, read_memory, unreadable
from jax_nbmem.gpu.nvml_own import own_process_list, whole_process_list
from jax_nbmem.gpu.nvml_processes import (
    GpuProcess,
    GpuProcesses,
    NoProcessList,
    ProcessTable,
    one_process_list,
)
from jax_nbmem.gpu.nvml_session import (
    LAYOUT_CHECK_S,
    RETRY_FIRST_S,
    SLOW_CALL_S,
    Device,
    Nvml,
    Session,
)

__all__ = [
    "SLOW_CALL_S",
    "GpuMemory",
    "GpuProcess",
    "ProcessTable",
    "GpuProcesses",
    "NvmlStatus",
    "driver_version",
    "gpu_problem",
    "gpus",
    "last_status",
    "memory",
    "own_process_lists",
    "process_lists",
    "processes",
    "shutdown",
    "status",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML answers, and the latest problem in one line for users (``None`` if none)."""

    available: bool
    reason: str | None


def _import_pynvml() -> Any:
    """Return the pynvml module, or None when it is not installed."""
    try:
        with warnings.catch_warnings():
            # The old "pynvml" package warns on import that it is deprecated.
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml
    except ImportError:
        return None
    return pynvml


_nvml = Nvml(_import_pynvml)


def _never_raise(default: Callable[[], _T]) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """Turn any unexpected exception into ``default()`` and a reason, for our callers' sake."""

    def decorate(function: Callable[..., _T]) -> Callable[..., _T]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> _T:
            try:
                return function(*args, **kwargs)
            except Exception as error:
                _log.debug("NVML query %s failed", function.__name__, exc_info=True)
                _nvml.reason = f"unexpected NVML failure: {type(error).__name__}: {error}"
                return default()

        return wrapper

    return decorate


@_never_raise(list)
def memory(indices: Iterable[int] | None = None) -> list[GpuMemory]:
    """Return the memory of the GPUs with these NVML indices (all by default), in that order.

    Unknown indices are skipped. A GPU that cannot be read is still listed, with ``None``
    numbers and a ``problem``. Returns ``[]`` when NVML is unavailable (``status()`` says why).
    """
    started = time.monotonic()
    try:
        return _memory(indices)
    finally:
        _nvml.timed("reading memory", time.monotonic() - started)


def _memory(indices: Iterable[int] | None) -> list[GpuMemory]:
    nv, session = _nvml.session()
    if session is not None and _nvml.layout_changed(nv, session):
        nv, session = _nvml.session()  # a GPU was split anew: list its instances again
    if session is None:
        return []
    devices = session.select(indices)
    readings = read_memories(nv, session, devices)  # the common case, in one pass
    if readings is not None:
        return readings
    result = []
    for device in devices:
        if device.handle is None:
            result.append(unreadable(device, device.problem))
            continue
        try:
            reading = read_memory(nv, session, device, _nvml.log_once)
        except nv.NVMLError as error:
            if device.mig_mode and error_name(nv, error) == "NO_PERMISSION":
                problem = gpu_problem(_split_gpu_problem(device.index), device.problem)
                result.append(unreadable(device, problem))
                continue
            result.append(unreadable(device, _nvml.device_failed(nv, session, device, error)))
            continue
        if device.problem:  # a GPU in MIG mode with an instance that could not be read
            reading = replace(reading, problem=gpu_problem(reading.problem, device.problem))
        result.append(reading)
    return result


def gpus() -> list[GpuMemory]:
    """Return every GPU NVML knows, with its memory; ``[]`` when NVML is unavailable."""
    return memory(None)


@_never_raise(list)
def process_lists(indices: Iterable[int] | None = None) -> list[GpuProcesses]:
    """Return each GPU's compute and graphics processes (all GPUs by default), in that order.

    A process on both lists of one GPU appears once. A GPU whose list cannot be read (the GPU
    is lost, NVML refuses, the list keeps changing size) has ``processes=None`` and a
    ``problem``: unknown, never an empty list. Returns ``[]`` when NVML is unavailable.
    A process on a MIG instance is on the instance's list; a GPU in MIG mode lists none (its
    processes are its instances'). Read raw (:func:`~jax_nbmem.gpu.nvml_own.whole_process_list`):
    no pynvml object per entry, so a node's hundreds of processes cost microseconds each.
    """
    started = time.monotonic()
    try:
        return _process_lists(indices, _whole_list)
    finally:
        _nvml.timed("listing processes", time.monotonic() - started)


@_never_raise(list)
def own_process_lists(indices: Iterable[int] | None, pid: int) -> list[GpuProcesses]:
    """:func:`process_lists` holding only *pid*'s entries: what a cell's boundary needs.

    Each GPU's ``processes`` is ``()`` when NVML does not list *pid* there, else *pid*'s one
    entry; ``None`` (with a ``problem``) when the list could not be read, as there. The lists
    are read into a reused buffer and searched for *pid* without making an object for anyone
    else's entry (:mod:`~jax_nbmem.gpu.nvml_own`), so the cost hardly grows with the
    processes on the GPU. *pid* is as NVML sees it: the host's.
    """
    started = time.monotonic()
    try:
        return _process_lists(indices, functools.partial(_own_list, pid=pid))
    finally:
        _nvml.timed("listing this process", time.monotonic() - started)


def _own_list(
    nv: Any, session: Session, device: Device, log_once: Callable[[str, str], None], pid: int
) -> GpuProcesses:
    if getattr(nv, "_nvmlGetFunctionPointer", None) is None:  # a pynvml without its pointers
        listing = one_process_list(nv, session, device, log_once)
        mine = tuple(p for p in listing.processes or () if p.pid == pid)
        return GpuProcesses(listing.gpu, mine, listing.problem)
    return own_process_list(nv, session, device, log_once, pid)


def _whole_list(
    nv: Any, session: Session, device: Device, log_once: Callable[[str, str], None]
) -> GpuProcesses:
    if getattr(nv, "_nvmlGetFunctionPointer", None) is None:  # a pynvml without its pointers
        return one_process_list(nv, session, device, log_once)
    return whole_process_list(nv, session, device, log_once)


def processes(indices: Iterable[int] | None = None) -> list[GpuProcess]:
    """The processes of :func:`process_lists` as one list; GPUs whose list failed add none."""
    return [p for listing in process_lists(indices) for p in listing.processes or ()]


def _process_lists(
    indices: Iterable[int] | None, read: Callable[..., GpuProcesses] = one_process_list
) -> list[GpuProcesses]:
    nv, session = _nvml.session()
    if session is None:
        return []
    result: list[GpuProcesses] = []
    for device in session.select(indices):
        if device.handle is None:
            result.append(GpuProcesses(device.index, None, unlisted(device.problem)))
            continue
        if device.mig_mode:  # its processes are its instances', each listed there once
            result.append(GpuProcesses(device.index, ()))
            continue
        try:
            result.append(read(nv, session, device, _nvml.log_once))
        except NoProcessList:
            problem = (
                f"GPU {device.index}: process list unreadable: this driver and this "
                "nvidia-ml-py share no process-list call (_v3 or _v2, read through "
                "nvidia-ml-py's function pointers or its own calls)"
            )
            result.append(GpuProcesses(device.index, None, problem))
        except nv.NVMLError as error:
            problem = device_problem(nv, device.index, error)
            if error_name(nv, error) not in ("NOT_SUPPORTED", "NO_PERMISSION"):
                problem = _nvml.device_failed(nv, session, device, error)
            result.append(GpuProcesses(device.index, None, unlisted(problem)))
    return result


def _split_gpu_problem(index: int) -> str:
    """What a user other than root is told of a GPU in MIG mode (NVML: NO_PERMISSION)."""
    return f"GPU {index} is in MIG mode: {NO_ROOT_NOTE}"


@_never_raise(lambda: NvmlStatus(False, _nvml.reason))
def status() -> NvmlStatus:
    """Say whether NVML answers, and the latest problem; tries (re)initializing when due.

    May wait while another thread initializes NVML; :func:`last_status` never does.
    """
    _, session = _nvml.session()
    return _status_now(session is not None)


def last_status() -> NvmlStatus:
    """What :func:`status` said last, without calling NVML or waiting for a lock."""
    return _status_now(_nvml.started)


def _status_now(available: bool) -> NvmlStatus:
    reasons = [r for r in (_nvml.reason, _nvml.slow if available else None) if r]
    return NvmlStatus(available, "; ".join(dict.fromkeys(reasons)) or None)


@_never_raise(lambda: None)
def driver_version() -> str | None:
    """Return the NVIDIA driver version, or ``None`` when NVML is unavailable."""
    _, session = _nvml.session()
    return session.driver if session is not None else None


@_never_raise(lambda: None)
def shutdown() -> None:
    """Release NVML; the next query initializes it again."""
    _nvml.shutdown()


def _reset_for_tests(
    retry_first_s: float = RETRY_FIRST_S, layout_check_s: float = LAYOUT_CHECK_S
) -> None:
    """Shut down and forget all state (cached handles, reasons, pauses); tests only."""
    global _nvml
    _nvml.shutdown()
    _nvml = Nvml(_import_pynvml, retry_first_s, layout_check_s)
