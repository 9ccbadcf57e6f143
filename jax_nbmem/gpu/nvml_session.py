"""NVML's lifecycle for :mod:`jax_nbmem.gpu.nvml`: one session of handles, rebuilt on failure.

NVML is initialized lazily, once, under a lock; device handles, UUIDs and names are cached for
that session. When a GPU is lost or the driver stops answering, the session is rebuilt after a
short, growing pause; when a GPU is split anew into MIG instances (its mode, or which instances
it has, changed since the session opened: looked at every ``LAYOUT_CHECK_S`` by the readings),
at once. A MIG instance keeps its number across rebuilds; a new one gets a number never used
before in this process. Imports no pynvml: :class:`Nvml` is handed the function that imports it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jax_nbmem.gpu.mig import MigInstance
from jax_nbmem.gpu.nvml_errors import (
    DEVICE_GONE_ERRORS,
    GLOBAL_ERRORS,
    SESSION_ENDING,
    device_problem,
    error_name,
    error_text,
)
from jax_nbmem.gpu.nvml_mig import mig_devices, mig_layout

__all__ = ["SLOW_CALL_S", "Device", "Nvml", "Session", "device_string", "text"]

_log = logging.getLogger("jax_nbmem.gpu.nvml")

# First pause before retrying a failed NVML; it doubles up to the maximum while NVML stays away.
RETRY_FIRST_S = 1.0
_RETRY_MAX_S = 30.0
PYNVML_MISSING = "nvidia-ml-py (pynvml) is not installed, so GPU memory cannot be read"
# A call slower than this is worth telling users about: a healthy driver answers in ms.
SLOW_CALL_S = 0.5
# How often the readings look whether a GPU's MIG layout changed (a few cheap calls a GPU).
LAYOUT_CHECK_S = 5.0


@dataclass
class Device:
    """One GPU of a session: its handle (``None`` once the GPU failed), identity and problem.

    A MIG instance is a device too, numbered after the whole GPUs, with ``mig`` saying where it
    lives; ``mig_mode`` marks a GPU split into instances (its own lists are root's alone). A GPU
    in MIG mode whose instances could not all be read keeps its handle and says so in
    ``problem``.
    """

    index: int
    handle: Any
    uuid: str | None = None
    name: str | None = None
    problem: str | None = None
    mig: MigInstance | None = None
    mig_mode: bool = False
    # (NVML's v2 figures, the GpuMemory made of them): the same figures again give that
    # reading, not a new one (nvml_memory.read_memory).
    memory_seen: Any = field(default=None, compare=False, repr=False)


@dataclass
class Session:
    """One ``nvmlInit`` worth of handles, and what this driver turned out to support."""

    devices: list[Device]
    driver: str | None
    # Each readable whole GPU's MIG layout when the session opened (see nvml_mig.mig_layout).
    layout: dict[int, tuple[int, ...] | None] = field(default_factory=dict)
    memory_v2: bool = True
    process_version: dict[str, int] = field(default_factory=lambda: {"Compute": 0, "Graphics": 0})
    # The v2 memory call as resolved for this session (see nvml_memory): None until the first
    # reading, () where pynvml cannot make it directly.
    memory_v2_call: Any = field(default=None, compare=False, repr=False)
    # The devices each asked-for set of indices selects (see select): a boundary asks for the
    # same set at every cell.
    _selections: dict[tuple[int, ...] | None, tuple[Device, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def select(self, indices: Iterable[int] | None) -> tuple[Device, ...]:
        """The devices with these NVML indices (all by default), in that order.

        Unknown indices are skipped. By number, not position: a MIG instance keeps its number
        when the GPUs are listed again.
        """
        key = None if indices is None else tuple(indices)
        found = self._selections.get(key)
        if found is None:
            if key is None:
                found = tuple(self.devices)
            else:
                by_index = {device.index: device for device in self.devices}
                found = tuple(by_index[index] for index in key if index in by_index)
            if len(self._selections) < 64:  # a few sets are ever asked for; never grows on
                self._selections[key] = found
        return found


def text(value: str | bytes) -> str:
    """A string from NVML; bytes that are not UTF-8 are shown with backslash escapes."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def device_string(nv: Any, handle: Any, function: str, getter: Callable[[Any], Any]) -> str:
    """A device's name or UUID; one that is not UTF-8 is read again raw and shown escaped.

    pynvml decodes the driver's bytes strictly, so a single bad byte would raise out of it.
    """
    try:
        return text(getter(handle))
    except UnicodeDecodeError:
        import ctypes

        buffer = ctypes.create_string_buffer(256)
        nv._nvmlCheckReturn(
            nv._nvmlGetFunctionPointer(function)(handle, buffer, ctypes.c_uint(256))
        )
        return text(buffer.value)


class Nvml:
    """Lazily initialized NVML with cached handles; rebuilds itself after failures."""

    def __init__(
        self,
        import_pynvml: Callable[[], Any],
        retry_first_s: float = RETRY_FIRST_S,
        layout_check_s: float = LAYOUT_CHECK_S,
    ) -> None:
        self._import_pynvml = import_pynvml  # returns pynvml, or None when it is not installed
        self._retry_first_s = retry_first_s
        self._layout_check_s = layout_check_s
        self._layout_due = 0.0
        self._lock = threading.Lock()
        self._pynvml: Any = None
        self._session: Session | None = None
        self.reason: str | None = None
        self._retry_at = 0.0
        self._backoff = self._retry_first_s
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
        """Log ``message`` the first time ``key`` is seen in this process's NVML state."""
        if key not in self._logged:
            self._logged.add(key)
            _log.info(message)

    def session(self) -> tuple[Any, Session | None]:
        """Return pynvml and the current session, (re)initializing when due."""
        session = self._session
        if session is not None and not self._refresh_wanted:
            # Nothing to (re)initialize: no lock (every cell's boundary asks). A session being
            # replaced meanwhile is still open: the old one is shut only after the new is in.
            return self._pynvml, session
        with self._lock:
            due = time.monotonic() >= self._retry_at
            if due and (self._session is None or self._refresh_wanted):
                self._start()
            return self._pynvml, self._session

    def _start(self) -> None:
        nv = self._pynvml = self._pynvml or self._import_pynvml()
        if nv is None:
            self._fail(PYNVML_MISSING)
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
            name = error_name(nv, error) or ""
            self._fail(GLOBAL_ERRORS.get(name, f"NVML: {error_text(error)}"))
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
            self._backoff = self._retry_first_s

    def _open(self, nv: Any, old: Session | None) -> Session:
        devices = []
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = device_string(nv, handle, "nvmlDeviceGetUUID", nv.nvmlDeviceGetUUID)
                name = device_string(nv, handle, "nvmlDeviceGetName", nv.nvmlDeviceGetName)
                devices.append(Device(index, handle, uuid, name))
            except nv.NVMLError as error:
                if error_name(nv, error) in SESSION_ENDING:
                    raise
                # A GPU lost since the last session keeps the identity NVML gave it then.
                known = old.devices[index] if old and index < len(old.devices) else None
                uuid, name = (known.uuid, known.name) if known else (None, None)
                problem = device_problem(nv, index, error)
                devices.append(Device(index, None, uuid, name, problem))
        layout = self._add_mig_instances(nv, devices, old)
        try:
            driver = text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            driver = None
        self._layout_due = time.monotonic() + self._layout_check_s
        return Session(devices, driver, layout=layout)

    @staticmethod
    def _add_mig_instances(
        nv: Any, devices: list[Device], old: Session | None
    ) -> dict[int, tuple[int, ...] | None]:
        """Mark the GPUs in MIG mode and append their instances; return each GPU's layout.

        Instances are numbered after the whole GPUs; one the old session knew (by UUID) keeps
        its number, so a sampler's or a panel's GPU stays the same GPU after a rebuild.
        """
        known = {d.uuid: d.index for d in old.devices if d.mig and d.uuid} if old else {}
        fresh = max([len(devices), *(index + 1 for index in known.values())])
        layout: dict[int, tuple[int, ...] | None] = {}

        def read(handle: Any, function: str, getter: Callable[[Any], Any]) -> str:
            return device_string(nv, handle, function, getter)

        for parent in list(devices):
            if parent.handle is None:
                continue
            layout[parent.index] = mig_layout(nv, parent.handle)
            if layout[parent.index] is None:
                continue
            parent.mig_mode = True
            found, problems = mig_devices(nv, parent.index, parent.uuid, parent.handle, read)
            # Said like a lost GPU's problem (the status, the reason) and tried again later.
            parent.problem = "; ".join(problems) or None
            for instance in found:
                index = known.get(instance.uuid)
                if index is None:
                    index, fresh = fresh, fresh + 1
                devices.append(
                    Device(index, instance.handle, instance.uuid, instance.name, mig=instance.mig)
                )
        return layout

    def layout_changed(self, nv: Any, session: Session) -> bool:
        """Whether a GPU's MIG layout changed since ``session`` opened; then it is rebuilt next.

        Looks at most every ``LAYOUT_CHECK_S`` (else answers False at once), outside the lock,
        so a reading that asks never waits behind another thread for it.
        """
        now = time.monotonic()
        if now < self._layout_due:
            return False
        self._layout_due = now + self._layout_check_s
        try:
            changed = [
                device.index
                for device in list(session.devices)
                if device.mig is None
                and device.handle is not None
                and device.index in session.layout
                and mig_layout(nv, device.handle) != session.layout[device.index]
            ]
        except nv.NVMLError:
            return False  # the readings meet the same failure and say it
        if not changed:
            return False
        with self._lock:
            if self._session is not session:
                return True  # another thread rebuilt it meanwhile
            _log.info("MIG layout of GPU %s changed: listing the GPUs again", changed)
            self._refresh_wanted, self._retry_at = True, 0.0
        return True

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

    def device_failed(self, nv: Any, session: Session, device: Device, error: Exception) -> str:
        """Record a failed call on ``device``; return the problem to show for it."""
        name = error_name(nv, error)
        problem = device_problem(nv, device.index, error)
        with self._lock:
            if self._session is not session:
                return problem  # another thread has already rebuilt the session
            if name in SESSION_ENDING:
                self._close()
                self._fail(GLOBAL_ERRORS[name])
                return self.reason or problem
            if name in DEVICE_GONE_ERRORS:
                device.handle, device.problem = None, problem
                self.reason = problem
                if not self._refresh_wanted:
                    self._refresh_wanted = True
                    self._schedule_retry()
        return problem

    @property
    def started(self) -> bool:
        """Whether a session is open now; reads no lock, for callers that must never wait."""
        return self._session is not None

    def shutdown(self) -> None:
        """Close the session; the next :meth:`session` opens a new one at once."""
        with self._lock:
            self._close()
            self._retry_at, self._backoff = 0.0, self._retry_first_s
            self._refresh_wanted = False
