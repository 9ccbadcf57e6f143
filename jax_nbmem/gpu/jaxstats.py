"""JAX's own view of memory: allocator stats, live arrays, host RSS, out-of-memory errors.

Everything here reads JAX only through ``sys.modules``: if the user has not imported JAX, we
do not import it, and if the user has not started the JAX backend, we do not start it
(``jax.devices()``, ``jax.live_arrays()`` and any array operation would). JAX's private
``jax._src.xla_bridge`` tells us whether the backend is up; it may move between releases, so
every attribute is looked up defensively and a miss means "not initialized".

No function here raises: a value that cannot be read is ``None`` and a list that cannot be
read is empty.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GPU_PLATFORMS",
    "DeviceStats",
    "backend_initialized",
    "device_stats",
    "gpu_stats_now",
    "host_rss_bytes",
    "initialized_platforms",
    "is_resource_exhausted",
    "held_of",
    "live_array_bytes",
    "note_limit_held",
]

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# Exception classes JAX raises for a failed XLA operation: JaxRuntimeError in recent
# releases, XlaRuntimeError in older ones. Matched by name so this module needs no jax import.
_RUNTIME_ERROR_NAMES = frozenset({"JaxRuntimeError", "XlaRuntimeError"})
# The platform names of JAX's GPU backends (every other one is the CPU or a TPU).
GPU_PLATFORMS = frozenset({"gpu", "cuda", "rocm"})
_OOM_MARKER = "RESOURCE_EXHAUSTED"

_process_handle: Any = None
# Whether a bytes_limit without pool_bytes (cuda_async's counters) is memory the allocator
# holds: only when it took its pool when the backend started. Told by the allocator's control
# when it records the start; None: not told (then read from the environment, see held_of).
_limit_held: bool | None = None
# jax.local_devices() takes JAX's backend lock; the devices do not change once the backend is
# up, so they are listed once and kept, with the backends table they came from (a new table,
# after jax.extend.backend.clear_backends(), means new devices).
_devices_of: tuple[Any, list[Any], list[Any]] | None = None  # (table, all, GPUs)


@dataclass(frozen=True)
class DeviceStats:
    """One local JAX device and its allocator counters.

    The byte counts come from ``Device.memory_stats()`` and are ``None`` where the backend
    does not report them (the CPU backend reports none, and XLA's -1 means unavailable).
    ``peak_bytes_in_use`` is the highest ``bytes_in_use`` since the backend started (it is
    never reset). ``pool_bytes`` is what the BFC pool holds from the GPU (its whole size once
    preallocated), ``largest_free_block_bytes`` the largest free block *inside* that pool.
    ``bytes_reserved`` is always 0 on a GPU (XLA never fills it): :attr:`held_bytes` is the
    figure for what JAX's allocator holds.
    """

    id: int | None
    platform: str | None
    kind: str | None
    bytes_in_use: int | None
    peak_bytes_in_use: int | None
    bytes_reserved: int | None
    bytes_limit: int | None
    largest_free_block_bytes: int | None
    pool_bytes: int | None = None
    peak_pool_bytes: int | None = None

    @property
    def held_bytes(self) -> int | None:
        """What JAX's allocator holds from the GPU (see :func:`held_of`); None: not known."""
        return held_of(self.pool_bytes, self.bytes_limit)

    @property
    def pool_free_bytes(self) -> int | None:
        """Free space inside the pool (what ``largest_free_block_bytes`` is a part of)."""
        if self.pool_bytes is None or self.bytes_in_use is None:
            return None
        return max(0, self.pool_bytes - self.bytes_in_use)


def note_limit_held(held: bool | None) -> None:
    """Say whether ``bytes_limit`` alone (no ``pool_bytes``) is held memory in this process.

    True for ``cuda_async`` when it took its pool at the backend's start (preallocation on, or
    ``TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC=-1``); False with preallocation off, where
    ``bytes_limit`` is only the pool's release threshold and nothing was taken up front.
    """
    global _limit_held
    _limit_held = held


def held_of(pool_bytes: int | None, bytes_limit: int | None) -> int | None:
    """What JAX's allocator holds from the GPU, from its counters.

    ``pool_bytes`` where BFC reports it. Without it (``cuda_async``), ``bytes_limit`` only when
    that pool was taken up front; with preallocation off XLA still sets ``bytes_limit`` (older
    versions) but takes nothing, and what it keeps after freeing depends on the XLA version:
    None (not known), never the limit. Never ``bytes_reserved``, which XLA leaves at 0.
    """
    if pool_bytes is not None:
        return pool_bytes
    if bytes_limit is None:
        return None
    held = _limit_held
    if held is None:  # not told how the backend started: the environment as it is now
        held = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "") not in ("false", "False", "0")
        held = held or os.environ.get("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "") == "-1"
    return bytes_limit if held else None


def backend_bridge() -> Any:
    """JAX's bridge module when JAX is imported and the module keeps its backends in a dict.

    ``None`` otherwise (JAX not imported, still importing, or its internals moved). The table
    is replaced by ``jax.extend.backend.clear_backends()`` (``jax.clear_backends()`` before
    jax 0.4.36): a caller reads ``bridge._backends`` each time.
    """
    modules = sys.modules
    if "jax" not in modules:
        return None
    bridge = modules.get("jax._src.xla_bridge")
    if bridge is None or not isinstance(getattr(bridge, "_backends", None), dict):
        return None
    return bridge


def backend_initialized() -> bool:
    """Say whether the user's code has started JAX's backend, without starting or importing it.

    ``False`` when JAX is not imported or JAX's internals cannot be found. Never waits: JAX's
    table of backends is read without its lock (a dict's length is read atomically), so a
    thread that holds the lock (the sampler listing devices, or a backend starting up, which
    fills the table one platform at a time) cannot make the answer wrong or slow.
    """
    try:
        if "jax" not in sys.modules:
            return False
        bridge = sys.modules.get("jax._src.xla_bridge")
        if bridge is None:
            return False
        backends = getattr(bridge, "_backends", None)
        if isinstance(backends, dict):
            return len(backends) != 0
        public_check = getattr(bridge, "backends_are_initialized", None)
        return bool(public_check()) if callable(public_check) else False
    except Exception:
        return False


def initialized_platforms() -> tuple[str, ...]:
    """The platforms of the started backends (``('cpu',)``, ``('cpu', 'cuda')``...), or ()."""
    if not backend_initialized():
        return ()
    try:
        return tuple(sorted(sys.modules["jax._src.xla_bridge"]._backends))
    except Exception:  # private API: if it moves, the platforms are simply not known
        return ()


def device_stats(*, may_wait: bool = True, gpus_only: bool = False) -> list[DeviceStats]:
    """List the local JAX devices with their allocator counters, in device-id order.

    Empty when the backend is not initialized (we never start it) or cannot be read. The
    devices are listed once (``jax.local_devices()``, which takes JAX's backend lock) and
    kept; with ``may_wait=False`` (a cell hook) they are never listed here, so before the
    sampler's thread has listed them this returns nothing rather than wait for the lock.
    ``memory_stats()`` itself asks the allocator and takes no Python lock. ``gpus_only``
    leaves out the devices that keep no counters (the CPU's).
    """
    devices = _local_devices(may_wait, gpus_only)
    if not devices:
        return []
    stats = []
    for device in devices:
        try:
            stats.append(_stats_of(device))
        except Exception:
            continue
    return sorted(stats, key=lambda s: (s.id is None, s.id if s.id is not None else 0))


def gpu_stats_now() -> list[DeviceStats]:
    """JAX's GPU devices and their counters, for a cell hook: never waits, never lists devices.

    Empty before the backend starts, before the sampler's thread has listed the devices, and
    on the CPU (whose devices keep no counters).
    """
    cached = _devices_of
    if cached is None or not cached[2]:
        # Nothing listed yet, or no GPU among what was: the answer is empty whatever the
        # backend's state (a hook never lists devices). The CPU's case, found in two steps.
        return []
    return device_stats(may_wait=False, gpus_only=True)


def live_array_bytes() -> int | None:
    """Sum ``nbytes`` over ``jax.live_arrays()``; ``None`` when the backend is not up.

    Costs time in proportion to the number of live arrays; call it seldom.
    """
    jax = _jax_if_initialized()
    if jax is None:
        return None
    try:
        arrays = jax.live_arrays()
    except Exception:
        return None
    total = 0
    for array in arrays:
        try:
            total += int(array.nbytes)
        except Exception:
            # An array deleted between listing and reading is no longer live: skip it.
            continue
    return total


def host_rss_bytes() -> int | None:
    """Resident set size of this process in bytes; ``None`` if unreadable.

    Linux's /proc/self/statm first, read with ``pread`` on a file kept open (about a
    microsecond: this runs at both ends of every cell; opening it each time costs ten times
    that); psutil elsewhere.
    """
    global _process_handle
    try:
        return int(_read_statm(_statm_fd()).split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        pass
    try:
        if _process_handle is None:
            import psutil

            _process_handle = psutil.Process()
        return int(_process_handle.memory_info().rss)
    except Exception:
        return None


_statm: tuple[int, int] | None = None  # (pid, fd): a forked child must open its own


class _StatmBuffer(threading.local):
    """Each thread's buffer for libc's pread (two threads read at once)."""

    def __init__(self) -> None:
        self.buffer = ctypes.create_string_buffer(_STATM_BYTES)


_STATM_BYTES = 128


def _libc_pread() -> Any:
    """The C library's pread, called holding the GIL; None where it cannot be had."""
    try:
        function = ctypes.PyDLL(None, use_errno=True).pread
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long)
    function.restype = ctypes.c_ssize_t
    return function


def _read_statm(fd: int) -> bytes:
    """/proc/self/statm's text, read without letting another thread take the GIL.

    ``os.pread`` releases it for the system call; a cell's boundary reads this, and another
    thread waiting for the GIL (IPython's history writer, woken by every cell) would run there
    and make the cell wait to take the GIL back, many times what the read itself costs. A
    read of statm takes a microsecond and never blocks for long.
    """
    if _pread is None:
        return os.pread(fd, _STATM_BYTES, 0)
    buffer = _buffers.buffer
    count = _pread(fd, buffer, _STATM_BYTES, 0)
    if count < 0:
        raise OSError(ctypes.get_errno(), "pread of /proc/self/statm failed")
    return buffer.raw[:count]


_pread = _libc_pread()
_buffers = _StatmBuffer()


def _statm_fd() -> int:
    global _statm
    pid = os.getpid()
    if _statm is None or _statm[0] != pid:
        _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
    return _statm[1]


def is_resource_exhausted(exc: BaseException | None) -> bool:
    """Say whether *exc*, or an exception it was raised from, is JAX's RESOURCE_EXHAUSTED.

    Matches JAX's runtime errors (``JaxRuntimeError``/``XlaRuntimeError``) whose message
    mentions ``RESOURCE_EXHAUSTED``, and any exception whose message starts with it (XLA's
    status format, kept when a library re-raises it as another type).
    """
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        try:
            message = str(current)
        except Exception:
            message = ""
        class_names = {cls.__name__ for cls in type(current).__mro__}
        if message.lstrip().startswith(_OOM_MARKER):
            return True
        if class_names & _RUNTIME_ERROR_NAMES and _OOM_MARKER in message:
            return True
        pending.append(current.__cause__)
        pending.append(current.__context__)
    return False


def _local_devices(may_wait: bool, gpus_only: bool = False) -> list[Any] | None:
    global _devices_of
    if not backend_initialized():
        return None
    try:
        table = sys.modules["jax._src.xla_bridge"]._backends
    except Exception:
        table = None
    cached = _devices_of
    if cached is None or cached[0] is not table or table is None:
        if not may_wait:
            return None
        jax = sys.modules.get("jax")
        try:
            devices = list(jax.local_devices())
        except Exception:
            return None
        gpus = [d for d in devices if getattr(d, "platform", None) in GPU_PLATFORMS]
        cached = _devices_of = (table, devices, gpus)
    return cached[2] if gpus_only else cached[1]


def _jax_if_initialized() -> Any:
    """Return the already-imported ``jax`` module if its backend is up, else ``None``."""
    if not backend_initialized():
        return None
    return sys.modules.get("jax")


def _stats_of(device: Any) -> DeviceStats:
    """Read one device's identity and allocator counters, leaving unknowns as ``None``."""
    try:
        memory = device.memory_stats()
    except Exception:
        memory = None
    if not isinstance(memory, dict):
        memory = {}
    seen = _stats_seen.get(id(device))
    if seen is not None and seen[0] is device and seen[1] == memory:
        return seen[2]  # the same counters: the same stats (a cell's boundary's case)
    stats = DeviceStats(
        id=_int_or_none(getattr(device, "id", None)),
        platform=_str_or_none(getattr(device, "platform", None)),
        kind=_str_or_none(getattr(device, "device_kind", None)),
        bytes_in_use=_int_or_none(memory.get("bytes_in_use")),
        peak_bytes_in_use=_int_or_none(memory.get("peak_bytes_in_use")),
        bytes_reserved=_int_or_none(memory.get("bytes_reserved")),
        bytes_limit=_int_or_none(memory.get("bytes_limit")),
        largest_free_block_bytes=_int_or_none(memory.get("largest_free_block_bytes")),
        pool_bytes=_int_or_none(memory.get("pool_bytes")),
        peak_pool_bytes=_int_or_none(memory.get("peak_pool_bytes")),
    )
    if len(_stats_seen) < _STATS_SEEN_MAX or id(device) in _stats_seen:
        _stats_seen[id(device)] = (device, dict(memory), stats)  # a copy: a dict may be reused
    return stats


# Each device's last counters and the stats made of them, by id (the device kept with them,
# so a reused id is not taken for it): unchanged counters give the same DeviceStats again,
# which a sampler compares by identity. A process has few devices; never grows past this.
_STATS_SEEN_MAX = 64
_stats_seen: dict[int, tuple[Any, dict, DeviceStats]] = {}


def _int_or_none(value: Any) -> int | None:
    """Convert a counter to ``int``; anything that is not a count (XLA's -1) becomes ``None``."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def _str_or_none(value: Any) -> str | None:
    """Convert an identity attribute to ``str``, keeping ``None`` as ``None``."""
    return None if value is None else str(value)
