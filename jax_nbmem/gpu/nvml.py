"""GPU memory and GPU processes as NVML reports them; the only module that imports pynvml.

Every failure comes back as a value: an empty list, ``None`` fields, and a one-line reason from
``status()`` that a person can act on. Nothing here raises to the caller. NVML is initialized
lazily, once, under a lock; device handles, UUIDs and names are cached for that session, so
``memory()`` costs only the memory calls. When a GPU is lost or the driver stops answering,
calls keep answering politely and the session is rebuilt after a short, growing pause, so the
numbers come back by themselves when NVML does.

Numbers NVML cannot mean (used above total, 2**64 - 1, a petabyte card) are dropped to ``None``
with a ``problem`` rather than passed on, and a name that is not valid UTF-8 is shown with
backslash escapes. Each call's duration is kept: a call slower than ``SLOW_CALL_S`` makes
``status()`` say that NVML is slow, and :func:`last_status` answers without touching NVML at
all, for callers that must never wait.

Other tools in the process (gpustat) replace pynvml's functions; the v2 memory call is made
through pynvml's own function pointer, so a replaced ``nvmlDeviceGetMemoryInfo`` costs nothing.

Safe to call from a sampler thread and the main thread at once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "SLOW_CALL_S",
    "GpuMemory",
    "GpuProcess",
    "GpuProcesses",
    "NvmlStatus",
    "driver_version",
    "gpu_problem",
    "gpus",
    "last_status",
    "memory",
    "process_lists",
    "processes",
    "shutdown",
    "status",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

# First pause before retrying a failed NVML; it doubles up to the maximum while NVML stays away.
_RETRY_FIRST_S = 1.0
_RETRY_MAX_S = 30.0

# NVML errors (names after NVML_ERROR_) that stop NVML as a whole, and what to tell users.
_GLOBAL_ERRORS = {
    "LIBRARY_NOT_FOUND": (
        "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine"
    ),
    "DRIVER_NOT_LOADED": "the NVIDIA driver is not loaded, so NVML cannot read the GPUs",
    "NO_PERMISSION": "no permission to read the GPUs through NVML",
    "LIB_RM_VERSION_MISMATCH": (
        "the NVML library and the NVIDIA kernel driver differ in version "
        "(driver updated without a reboot?)"
    ),
    "UNINITIALIZED": "NVML was shut down underneath jax_nbmem; reconnecting",
}
# Of those, the ones that end a running session (a device call refused for lack of permission,
# say, does not: the other calls still work).
_SESSION_ENDING = frozenset(_GLOBAL_ERRORS) - {"NO_PERMISSION"}
# Errors on one device after which its handle is no good until NVML is set up again.
_DEVICE_GONE_ERRORS = {
    "GPU_IS_LOST": (
        "GPU {index} is lost (fell off the bus or needs a reset); its memory cannot be read"
    ),
    "RESET_REQUIRED": "GPU {index} needs a reset before NVML can read it",
    "GPU_NOT_FOUND": "GPU {index} is no longer there",
    "INVALID_ARGUMENT": "GPU {index} is no longer known to NVML",
}
_PYNVML_MISSING = "nvidia-ml-py (pynvml) is not installed, so GPU memory cannot be read"
_PROCESS_VERSIONS = ("_v3", "_v2")
# A call slower than this is worth telling users about: a healthy driver answers in ms.
SLOW_CALL_S = 0.5
# No GPU has a petabyte; NVML's "not available" (2**64 - 1) and garbage land above it.
_MAX_PLAUSIBLE_BYTES = 1 << 50
# used + free may exceed total by rounding in the driver; more than this is not rounding.
_SUM_SLACK_BYTES = 64 << 20


@dataclass(frozen=True)
class GpuMemory:
    """Memory of one GPU, by NVML index. Any number is ``None`` when NVML could not say.

    ``used_bytes`` is NVML's v2 ``used``, as nvidia-smi, nvitop and gpustat show it; the
    memory the driver reserves for itself is apart, in ``reserved_bytes``, so that
    ``used + reserved + free == total``. Where only the v1 call answers (an old driver or
    pynvml), ``reserved_bytes`` is ``None`` and ``used_bytes`` includes the reserved part.
    ``uuid`` and ``name`` are ``None`` only for a GPU that failed before NVML ever named it.
    ``problem`` says, in one line, why numbers are missing.
    """

    index: int
    uuid: str | None
    name: str | None
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    reserved_bytes: int | None = None
    problem: str | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on GPU ``gpu`` (NVML index); ``used_bytes`` None if unknown.

    ``pid`` is as NVML sees it: the host's pid, which differs from the pid inside a container.
    """

    pid: int
    gpu: int
    used_bytes: int | None


@dataclass(frozen=True)
class GpuProcesses:
    """NVML's process list for GPU ``gpu``: ``processes``, or None with ``problem`` saying why.

    A list that could not be read is not an empty list: who holds memory there is unknown.
    ``problem`` may also be set beside a list, for entries whose bytes made no sense.
    """

    gpu: int
    processes: tuple[GpuProcess, ...] | None
    problem: str | None = None


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML answers, and the latest problem in one line for users (``None`` if none)."""

    available: bool
    reason: str | None


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str | None = None
    name: str | None = None
    problem: str | None = None


@dataclass
class _Session:
    """One ``nvmlInit`` worth of handles, and what this driver turned out to support."""

    devices: list[_Device]
    driver: str | None
    memory_v2: bool = True
    process_version: dict[str, int] = field(default_factory=lambda: {"Compute": 0, "Graphics": 0})


def _error_name(nv: Any, error: BaseException) -> str | None:
    """Return the NVML_ERROR_ name (without prefix) of a pynvml error, if it is one."""
    value = getattr(error, "value", None)
    for name in (*_GLOBAL_ERRORS, *_DEVICE_GONE_ERRORS, "FUNCTION_NOT_FOUND", "NOT_SUPPORTED"):
        if value is not None and getattr(nv, f"NVML_ERROR_{name}", object()) == value:
            return name
    return None


def _error_text(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # pynvml formats some codes by calling into the library again
        return f"NVML error {getattr(error, 'value', '?')}"


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


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def _device_string(nv: Any, handle: Any, function: str, getter: Callable[[Any], Any]) -> str:
    """A device's name or UUID; one that is not UTF-8 is read again raw and shown escaped.

    pynvml decodes the driver's bytes strictly, so a single bad byte would raise out of it.
    """
    try:
        return _text(getter(handle))
    except UnicodeDecodeError:
        import ctypes

        buffer = ctypes.create_string_buffer(256)
        nv._nvmlCheckReturn(
            nv._nvmlGetFunctionPointer(function)(handle, buffer, ctypes.c_uint(256))
        )
        return _text(buffer.value)


def _plausible(value: Any, limit: int = _MAX_PLAUSIBLE_BYTES) -> int | None:
    """``value`` as bytes if a GPU could report it, else None."""
    return value if isinstance(value, int) and 0 <= value <= limit else None


class _Nvml:
    """Lazily initialized NVML with cached handles; rebuilds itself after failures."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pynvml: Any = None
        self._session: _Session | None = None
        self.reason: str | None = None
        self._retry_at = 0.0
        self._backoff = _RETRY_FIRST_S
        self._refresh_wanted = False
        self._logged: set[str] = set()
        self.slow: str | None = None  # the latest slow call, in words; None once calls are fast

    def timed(self, what: str, seconds: float) -> None:
        """Remember how long a call took; a slow one is said until a call is fast again."""
        if seconds >= SLOW_CALL_S:
            self.slow = f"NVML is slow: {what} took {seconds:.1f} s (a healthy driver takes ms)"
        elif self.slow is not None and what in self.slow:
            self.slow = None

    def log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            _log.info(message)

    def session(self) -> tuple[Any, _Session | None]:
        """Return pynvml and the current session, (re)initializing when due."""
        with self._lock:
            due = time.monotonic() >= self._retry_at
            if due and (self._session is None or self._refresh_wanted):
                self._start()
            return self._pynvml, self._session

    def _start(self) -> None:
        nv = self._pynvml = self._pynvml or _import_pynvml()
        if nv is None:
            self._fail(_PYNVML_MISSING)
            return
        old = self._session
        try:
            nv.nvmlInit()
            try:
                session = self._open(nv, old)
            except Exception:
                self._shutdown_quietly()  # the reference nvmlInit just took
                raise
        except Exception as error:
            self._close()
            name = _error_name(nv, error) or ""
            self._fail(_GLOBAL_ERRORS.get(name, f"NVML: {_error_text(error)}"))
            return
        if old is not None:
            # Drop the old session's reference only now, so calls still running on its
            # handles were never left without an initialized NVML.
            self._shutdown_quietly()
        self._session = session
        problems = [device.problem for device in session.devices if device.problem]
        self.reason = "; ".join(problems) or None
        self._refresh_wanted = bool(problems)
        if problems:
            self._schedule_retry()
        else:
            self._backoff = _RETRY_FIRST_S

    def _open(self, nv: Any, old: _Session | None) -> _Session:
        devices = []
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _device_string(nv, handle, "nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID)
                name = _device_string(nv, handle, "nvmlDeviceGetName", nv.nvmlDeviceGetName)
                devices.append(_Device(index, handle, uuid, name))
            except nv.NVMLError as error:
                if _error_name(nv, error) in _SESSION_ENDING:
                    raise
                # A GPU lost since the last session keeps the identity NVML gave it then.
                known = old.devices[index] if old and index < len(old.devices) else None
                uuid, name = (known.uuid, known.name) if known else (None, None)
                problem = _device_problem(nv, index, error)
                devices.append(_Device(index, None, uuid, name, problem))
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            driver = None
        return _Session(devices, driver)

    def _fail(self, reason: str) -> None:
        self.reason = reason
        self._schedule_retry()

    def _schedule_retry(self) -> None:
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, _RETRY_MAX_S)

    def _shutdown_quietly(self) -> None:
        try:
            self._pynvml.nvmlShutdown()
        except Exception:  # NVML may already be gone; nothing is left to release then
            pass

    def _close(self) -> None:
        if self._session is not None:
            self._session = None
            self._shutdown_quietly()

    def device_failed(self, nv: Any, session: _Session, device: _Device, error: Exception) -> str:
        """Record a failed call on ``device``; return the problem to show for it."""
        name = _error_name(nv, error)
        problem = _device_problem(nv, device.index, error)
        with self._lock:
            if self._session is not session:
                return problem  # another thread has already rebuilt the session
            if name in _SESSION_ENDING:
                self._close()
                self._fail(_GLOBAL_ERRORS[name])
                return self.reason or problem
            if name in _DEVICE_GONE_ERRORS:
                device.handle, device.problem = None, problem
                self.reason = problem
                if not self._refresh_wanted:
                    self._refresh_wanted = True
                    self._schedule_retry()
        return problem

    def shutdown(self) -> None:
        with self._lock:
            self._close()
            self._retry_at, self._backoff = 0.0, _RETRY_FIRST_S
            self._refresh_wanted = False


def _device_problem(nv: Any, index: int, error: BaseException) -> str:
    name = _error_name(nv, error)
    if name in _DEVICE_GONE_ERRORS:
        return _DEVICE_GONE_ERRORS[name].format(index=index)
    if name in _SESSION_ENDING:
        return _GLOBAL_ERRORS[name]
    return f"GPU {index}: NVML says {_error_text(error)}"


_nvml = _Nvml()


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


def _selected(session: _Session, indices: Iterable[int] | None) -> list[_Device]:
    if indices is None:
        return list(session.devices)
    count = len(session.devices)
    return [session.devices[index] for index in indices if 0 <= index < count]


def _read_memory(nv: Any, session: _Session, device: _Device) -> GpuMemory:
    if session.memory_v2:
        try:
            info = _memory_v2(nv, device.handle)
        except nv.NVMLError as error:
            if _error_name(nv, error) not in ("FUNCTION_NOT_FOUND", "NOT_SUPPORTED"):
                raise
            info = None
            _nvml.log_once("memory_v2", "NVML has no v2 memory info; using v1 (no reserved)")
        if info is not None:
            return _checked_memory(device, info.total, info.used, info.free, info.reserved)
        session.memory_v2 = False
    info = nv.nvmlDeviceGetMemoryInfo(device.handle)
    # A replacement of pynvml's function (gpustat's) may itself have asked for v2.
    reserved = getattr(info, "reserved", None)
    return _checked_memory(device, info.total, info.used, info.free, reserved)


def _memory_v2(nv: Any, handle: Any) -> Any:
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
        _nvml.log_once("memory_v2", "this pynvml has no v2 memory info; using v1 (no reserved)")
        return None
    if struct is None or function is None or check is None:
        try:  # a pynvml without these private names: its public call, if not replaced
            return nv.nvmlDeviceGetMemoryInfo(handle, version=version)
        except TypeError:
            _nvml.log_once(
                "memory_v2",
                "pynvml.nvmlDeviceGetMemoryInfo was replaced by one that takes no version; "
                "using v1 (no reserved)",
            )
            return None
    import ctypes

    memory = struct()
    memory.version = version
    check(function("nvmlDeviceGetMemoryInfo_v2")(handle, ctypes.byref(memory)))
    return memory


def _checked_memory(
    device: _Device, total: Any, used: Any, free: Any, reserved: Any | None
) -> GpuMemory:
    """The reading as GpuMemory, with figures that cannot be true dropped and said.

    ``reserved`` is None for NVML's v1 reading, whose ``used`` includes the reserved memory.
    """
    reading = functools.partial(GpuMemory, device.index, device.uuid, device.name)
    good_total = _plausible(total)
    if not good_total:
        problem = f"GPU {device.index}: NVML reported an impossible total ({total!r} bytes)"
        return reading(None, None, None, None, problem=problem + "; not shown")
    good_reserved = None if reserved is None else _plausible(reserved, good_total)
    good_used = _plausible(used, good_total)
    good_free = _plausible(free, good_total)
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
            f"GPU {device.index}: NVML reported {'; '.join(problems)} of {good_total} bytes in "
            "all, which cannot be; those figures are not shown"
        )
        return reading(good_total, good_used, good_free, good_reserved, problem=problem)
    return reading(good_total, good_used, good_free, good_reserved)


def _unreadable(device: _Device, problem: str | None) -> GpuMemory:
    return GpuMemory(device.index, device.uuid, device.name, None, None, None, problem=problem)


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
    if session is None:
        return []
    result = []
    for device in _selected(session, indices):
        if device.handle is None:
            result.append(_unreadable(device, device.problem))
            continue
        try:
            result.append(_read_memory(nv, session, device))
        except nv.NVMLError as error:
            result.append(_unreadable(device, _nvml.device_failed(nv, session, device, error)))
    return result


def gpus() -> list[GpuMemory]:
    """Return every GPU NVML knows, with its memory; ``[]`` when NVML is unavailable."""
    return memory(None)


class _NoProcessList(Exception):
    """Neither the driver nor pynvml offers a process-list call both of them know."""


def _read_processes(nv: Any, session: _Session, device: _Device, kind: str) -> list[Any]:
    """Return NVML's process list of one kind, stepping down to older calls the driver has.

    Raises _NoProcessList when none is left: an old driver (no _v3) with an nvidia-ml-py that
    has no _v2 call. That is "cannot tell", never "no processes".
    """
    while session.process_version[kind] < len(_PROCESS_VERSIONS):
        suffix = _PROCESS_VERSIONS[session.process_version[kind]]
        function = getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses{suffix}", None)
        try:
            if function is not None:
                return function(device.handle)
        except nv.NVMLError as error:
            if _error_name(nv, error) != "FUNCTION_NOT_FOUND":
                raise
        session.process_version[kind] += 1
        _nvml.log_once(f"{kind}{suffix}", f"NVML has no {kind.lower()} process list {suffix}")
    raise _NoProcessList


@_never_raise(list)
def process_lists(indices: Iterable[int] | None = None) -> list[GpuProcesses]:
    """Return each GPU's compute and graphics processes (all GPUs by default), in that order.

    A process on both lists of one GPU appears once. A GPU whose list cannot be read (the GPU
    is lost, NVML refuses, the list keeps changing size) has ``processes=None`` and a
    ``problem``: unknown, never an empty list. Returns ``[]`` when NVML is unavailable.
    """
    started = time.monotonic()
    try:
        return _process_lists(indices)
    finally:
        _nvml.timed("listing processes", time.monotonic() - started)


def processes(indices: Iterable[int] | None = None) -> list[GpuProcess]:
    """The processes of :func:`process_lists` as one list; GPUs whose list failed add none."""
    return [p for listing in process_lists(indices) for p in listing.processes or ()]


def _process_lists(indices: Iterable[int] | None) -> list[GpuProcesses]:
    nv, session = _nvml.session()
    if session is None:
        return []
    result: list[GpuProcesses] = []
    for device in _selected(session, indices):
        if device.handle is None:
            result.append(GpuProcesses(device.index, None, _unlisted(device.problem)))
            continue
        try:
            result.append(_one_process_list(nv, session, device))
        except _NoProcessList:
            problem = (
                f"GPU {device.index}: process list unreadable: this driver and this "
                "nvidia-ml-py share no process-list call (an old driver needs nvidia-ml-py "
                "with the _v2 calls)"
            )
            result.append(GpuProcesses(device.index, None, problem))
        except nv.NVMLError as error:
            problem = _device_problem(nv, device.index, error)
            if _error_name(nv, error) not in ("NOT_SUPPORTED", "NO_PERMISSION"):
                problem = _nvml.device_failed(nv, session, device, error)
            result.append(GpuProcesses(device.index, None, _unlisted(problem)))
    return result


_UNLISTED = "process list unreadable"


def _unlisted(problem: str | None) -> str:
    return f"{_UNLISTED}: {problem}" if problem else _UNLISTED


def gpu_problem(memory_problem: str | None, list_problem: str | None) -> str | None:
    """One GPU's problem in one line, from its :func:`memory` reading's and its process list's.

    A cause both share (a lost GPU fails both) is said once: "GPU 1 is lost ...; process list
    unreadable". ``None`` when neither has a problem.
    """
    if memory_problem and list_problem and memory_problem in list_problem:
        list_problem = list_problem.replace(memory_problem, "").strip(" :;") or None
    return "; ".join(dict.fromkeys(filter(None, [memory_problem, list_problem]))) or None


def _one_process_list(nv: Any, session: _Session, device: _Device) -> GpuProcesses:
    """One GPU's list; a list that changed size between NVML's two calls is asked once more."""
    for attempt in range(2):
        seen: dict[int, GpuProcess] = {}
        odd: list[str] = []
        try:
            for kind in ("Compute", "Graphics"):
                for info in _read_processes(nv, session, device, kind):
                    raw = info.usedGpuMemory
                    used = _plausible(raw)
                    if raw is not None and used is None:
                        odd.append(f"PID {info.pid} {raw!r}")
                    earlier = seen.get(info.pid)
                    if earlier is None or (earlier.used_bytes is None and used is not None):
                        seen[info.pid] = GpuProcess(info.pid, device.index, used)
        except nv.NVMLError as error:
            if attempt == 0 and _error_name(nv, error) == "INSUFFICIENT_SIZE":
                continue
            raise
        problem = None
        if odd:
            problem = f"GPU {device.index}: impossible process bytes, not shown: {', '.join(odd)}"
        return GpuProcesses(device.index, tuple(seen.values()), problem)
    raise AssertionError("unreachable")  # pragma: no cover


@_never_raise(lambda: NvmlStatus(False, _nvml.reason))
def status() -> NvmlStatus:
    """Say whether NVML answers, and the latest problem; tries (re)initializing when due.

    May wait while another thread initializes NVML; :func:`last_status` never does.
    """
    _, session = _nvml.session()
    return _status_now(session is not None)


def last_status() -> NvmlStatus:
    """What :func:`status` said last, without calling NVML or waiting for a lock."""
    return _status_now(_nvml._session is not None)


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


def _reset_for_tests(retry_first_s: float = _RETRY_FIRST_S) -> None:
    """Shut down and forget all state (cached handles, reasons, pauses); tests only."""
    global _nvml, _RETRY_FIRST_S
    _nvml.shutdown()
    _RETRY_FIRST_S = retry_first_s
    _nvml = _Nvml()
