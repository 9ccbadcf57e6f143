"""Will it fit? A call's memory, from XLA's compiled program, set against what this process can get.

``fit`` lowers and compiles the call without running it (``jit(fn).lower(...).compile()``), so
nothing is allocated for the program, and reads XLA's ``memory_analysis()``: arguments, outputs,
temporaries, generated code, what donated arguments save (aliasing) and, where jaxlib reports it,
``peak_memory_in_bytes``. Those figures are per device. Against them: what each device can still
give this process under the allocator mode in effect (:func:`room_of`), less what is already
there (arguments that are resident arrays on the device need no new memory).

Compiling needs JAX's backend: ``fit`` refuses (:class:`FitError`) while it has not started,
because starting it takes the allocator mode for good (and preallocates, by default). The
verdict and the cheapest change that would make the call fit are in :mod:`.fit_report`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from jax_nbmem.allocator.caps import MemoryCap, caps_by_gpu
from jax_nbmem.allocator.jaxlib import Effective, effective
from jax_nbmem.gpu import jaxstats
from jax_nbmem.text import printable

__all__ = [
    "DeviceRoom",
    "FitError",
    "ProgramNeeds",
    "attempt",
    "compile_needs",
    "device_name",
    "host_room",
    "not_started_reason",
    "read_rooms",
    "room_of",
]

_MESSAGE_CHARS = 400


class FitError(ValueError):
    """The call could not be measured: JAX not started, not traceable, or not compilable."""


@dataclass(frozen=True)
class ProgramNeeds:
    """What one compiled call needs on each device it runs on (XLA's figures, per device).

    Byte counts are ``None`` where jaxlib does not report them. ``peak_bytes`` is XLA's
    ``peak_memory_in_bytes`` (arguments, outputs and temporaries live at once; jaxlib 0.4.31
    and later), ``None`` where jaxlib lacks it or reports 0. ``resident_bytes`` holds, per
    device, the bytes of arguments already there (live JAX arrays): they need no new memory.
    ``compile_s`` is how long JAX took: lowering, compiling and its memory analysis.
    """

    call: str
    platform: str
    devices: tuple[str, ...]
    argument_bytes: int | None
    output_bytes: int | None
    alias_bytes: int | None
    temp_bytes: int | None
    code_bytes: int | None
    peak_bytes: int | None
    host_bytes: int | None
    resident_bytes: dict[str, int] = field(default_factory=dict)
    compile_s: float = 0.0

    @property
    def total_bytes(self) -> int | None:
        """All the program holds at its peak on one device, code included.

        XLA's peak where known, plus the generated code; else arguments + outputs − aliased +
        temporaries + code, which is never below the peak. ``None`` when neither is known.
        """
        code = self.code_bytes or 0
        if self.peak_bytes is not None:
            return self.peak_bytes + code
        parts = (self.argument_bytes, self.output_bytes, self.temp_bytes)
        if None in parts:
            return None
        return sum(parts) - (self.alias_bytes or 0) + code  # type: ignore[arg-type]

    def new_bytes(self, device: str) -> int | None:
        """What the call still has to take on *device*: the total less resident arguments."""
        total = self.total_bytes
        if total is None:
            return None
        resident = min(self.resident_bytes.get(device, 0), self.argument_bytes or 0)
        return max(0, total - resident)

    def to_dict(self) -> dict[str, Any]:
        """Every field, plus ``total_bytes`` and ``new_bytes`` per device."""
        data = asdict(self)
        data["devices"] = list(self.devices)
        data["total_bytes"] = self.total_bytes
        data["new_bytes"] = {device: self.new_bytes(device) for device in self.devices}
        return data


@dataclass(frozen=True)
class DeviceRoom:
    """What one device can still give this process, and which limit binds.

    ``room_bytes`` is the most a new allocation may take now (``None``: cannot be told, with
    ``reason``). ``limit`` is ``"pool"`` when JAX's pool is what limits it (its ``bytes_limit``
    less ``bytes_in_use``), ``"device"`` when the GPU's free memory is (or the host's available
    memory, for a CPU device). The other fields are the readings it came from (``None`` where
    unread): JAX's counters, NVML's free and total and this process's bytes on the GPU, and
    the memory the GPU's driver reserves for itself (``None`` where NVML does not tell it).
    """

    device: str
    kind: str  # "gpu" or "host"
    mode: str | None
    room_bytes: int | None
    limit: str | None
    reason: str | None = None
    gpu_index: int | None = None
    bytes_in_use: int | None = None
    bytes_limit: int | None = None
    pool_bytes: int | None = None
    largest_free_block: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    self_bytes: int | None = None
    preallocated: bool | None = None
    reserved_bytes: int | None = None
    gpu_label: str | None = None  # "GPU 0", "MIG 3g.71gb instance 1 of GPU 0"
    memory_cap_bytes: int | None = None  # MPS's or HAMi's cap on this process there
    # A pool that backed off (pool_bytes < bytes_limit): what it lacks of its limit, which it
    # can take only at once (None: no back-off, or not preallocated).
    growth_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-friendly."""
        return asdict(self)


def not_started_reason() -> str | None:
    """Why ``fit`` may not compile now (JAX not imported or its backend not started), or None."""
    if "jax" not in sys.modules:
        return "JAX is not imported in this process"
    if not jaxstats.backend_initialized():
        return "JAX's backend has not started yet, and compiling would start it"
    return None


def compile_needs(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    call: str | None = None,
    resident_from: Any = None,
) -> ProgramNeeds:
    """Lower and compile ``fn(*args, **kwargs)`` without running it; read XLA's figures.

    *fn* may be jitted already (its ``static_argnums``, shardings and donation are kept) or a
    plain function (then it is jitted as it is). Arguments may be arrays or
    ``jax.ShapeDtypeStruct``; nothing is allocated for them. The live arrays among
    *resident_from* (default: the arguments) count as already on their devices. Raises
    :class:`FitError` with a short reason when the call cannot be traced or compiled, or JAX's
    backend is not up.
    """
    reason = not_started_reason()
    if reason is not None:
        raise FitError(reason)
    import jax

    kwargs = dict(kwargs or {})
    call = call or f"{_name_of(fn)}(...)"
    if not callable(fn):
        raise FitError(f"{call}: {type(fn).__name__} is not callable")
    lowerable = fn if callable(getattr(fn, "lower", None)) else jax.jit(fn)
    began = time.perf_counter()
    lowered = attempt(
        lambda: lowerable.lower(*args, **kwargs),
        lambda exc: (
            f"cannot trace {call}: {_short(exc)}. A Python value the function branches on, "
            "or uses as a shape, must be static: jit it with static_argnums/static_argnames"
        ),
    )
    compiled = attempt(lowered.compile, lambda exc: f"XLA cannot compile {call}: {_short(exc)}")
    analysis = attempt(
        compiled.memory_analysis,
        lambda exc: f"jaxlib gives no memory analysis for {call}: {_short(exc)}",
    )
    compile_s = time.perf_counter() - began  # JAX's part: lowering, compiling, its analysis
    if isinstance(analysis, (list, tuple)):  # one per device (pmap): the largest counts
        analysis = [a for a in analysis if a is not None]
    elif analysis is not None:
        analysis = [analysis]
    if not analysis:
        raise FitError(f"jaxlib gives no memory analysis for {call} on this backend")
    devices = _program_devices(compiled, jax)

    def largest(name: str) -> int | None:
        values = [_count(getattr(a, name, None)) for a in analysis]
        return None if None in values else max(values)  # type: ignore[type-var]

    peak = largest("peak_memory_in_bytes")
    host = [largest(f"host_{part}_size_in_bytes") for part in ("argument", "output", "temp")]
    buffers = {
        part: largest(f"{part}_size_in_bytes") for part in ("argument", "output", "alias", "temp")
    }
    if not peak and not any(buffers.values()) and _tree_bytes((tuple(args), kwargs), jax) > 0:
        # jaxlib 0.4.26's CPU client reports only the generated code's size: its zeros for
        # arguments that plainly take memory are unknowns, not a program that needs nothing.
        buffers = dict.fromkeys(buffers)
    return ProgramNeeds(
        call=call,
        platform=str(devices[0].platform) if devices else "?",
        devices=tuple(device_name(d) for d in devices),
        argument_bytes=buffers["argument"],
        output_bytes=buffers["output"],
        alias_bytes=buffers["alias"],
        temp_bytes=buffers["temp"],
        code_bytes=largest("generated_code_size_in_bytes"),
        peak_bytes=peak if peak else None,  # 0: this jaxlib does not compute it
        host_bytes=None if None in host else sum(host),  # type: ignore[arg-type]
        resident_bytes=_resident_bytes(
            (tuple(args), kwargs) if resident_from is None else resident_from, jax
        ),
        compile_s=compile_s,
    )


def attempt(action: Callable[[], Any], describe: Callable[[BaseException], str]) -> Any:
    """``action()``, or a :class:`FitError` saying ``describe(exc)`` when it raises.

    The FitError is raised outside the handler, so it carries no ``__context__``: the failed
    trace's frames (and the user's arrays in their locals) would otherwise stay alive with
    the error, as the last error, until the next one.
    """
    try:
        return action()
    except Exception as exc:
        message = describe(exc)
    raise FitError(message)


def room_of(
    device: str,
    stats: Any,
    gpu: Any,
    started: Effective,
    *,
    self_bytes: int | None = None,
) -> DeviceRoom:
    """How much one GPU device can still give, under the mode JAX *started* with.

    *stats* are JAX's counters for the device (:class:`~jax_nbmem.gpu.jaxstats.DeviceStats`,
    or ``None``), *gpu* NVML's reading of its GPU (``free_bytes``, ``total_bytes``; or
    ``None``). The rules, by allocator:

    * BFC preallocating (``on``, ``fraction F``): room is ``pool_bytes − bytes_in_use``; when
      the pool backed off (``pool_bytes < bytes_limit``) it may still grow, but only by the
      whole rest at once, so up to ``bytes_limit − bytes_in_use`` only while the GPU has that
      rest free (see :func:`_preallocated_room`).
    * BFC growing (``off``): what is free in the pool plus what the GPU has free, capped by
      ``bytes_limit − bytes_in_use`` (the fraction still caps it).
    * ``cuda_async``: free in its pool plus the GPU's free memory (the fraction is no cap).
    * ``platform`` (no pool), and ``vmm``: the GPU's free memory (capped by the limit, if any).

    Under an MPS or HAMi cap (*gpu*'s ``memory_cap``) no more than the cap less what this
    process holds (plus what is free in its pool) is room, and the cap is the ``limit``
    (``"cap"``) when it binds.
    """
    in_use = getattr(stats, "bytes_in_use", None)
    limit = getattr(stats, "bytes_limit", None)
    pool = getattr(stats, "pool_bytes", None)
    free = getattr(gpu, "free_bytes", None)
    pool_room = None if in_use is None or limit is None else max(0, limit - in_use)
    pool_free = None if in_use is None or pool is None else max(0, pool - in_use)
    preallocated = bool(started.pool_fraction) and started.allocator != "platform"
    room: int | None
    binding: str | None
    reason = None
    growth_bytes = None
    if started.error:
        room, binding, reason = None, None, f"jaxlib refused the settings: {started.error}"
    elif started.allocator == "platform" or stats is None:
        room, binding = free, "device"
        if free is None:
            reason = "NVML cannot say what the GPU has free"
    elif preallocated and started.capped:
        room, binding, growth_bytes = _preallocated_room(in_use, limit, pool, free)
        if room is None:
            reason = "JAX does not report its pool's limit and use"
    else:
        growth = None if free is None else free + (pool_free or 0)
        if started.capped is not False and pool_room is not None:
            room = pool_room if growth is None else min(pool_room, growth)
            binding = "pool" if growth is None or pool_room <= growth else "device"
        else:
            room, binding = growth, "device"
        if room is None:
            reason = "NVML cannot say what the GPU has free"
    cap = getattr(gpu, "memory_cap", None)
    if cap is not None and room is not None:
        held = self_bytes if self_bytes is not None else (pool or limit or 0)
        under_cap = max(0, cap.bytes - held) + (pool_free or 0)
        if under_cap < room:
            room, binding = under_cap, "cap"
    return DeviceRoom(
        device=device,
        kind="gpu",
        mode=started.mode_name,
        room_bytes=room,
        limit=binding if room is not None else None,
        reason=reason,
        gpu_index=getattr(gpu, "index", None),
        gpu_label=getattr(gpu, "label", None),
        bytes_in_use=in_use,
        bytes_limit=limit,
        pool_bytes=pool if pool is not None else (limit if preallocated else None),
        largest_free_block=getattr(stats, "largest_free_block_bytes", None),
        free_bytes=free,
        total_bytes=getattr(gpu, "total_bytes", None),
        self_bytes=self_bytes,
        preallocated=preallocated,
        reserved_bytes=getattr(gpu, "reserved_bytes", None),
        memory_cap_bytes=cap.bytes if cap is not None else None,
        growth_bytes=growth_bytes,
    )


def _preallocated_room(
    in_use: int | None, limit: int | None, pool: int | None, free: int | None
) -> tuple[int | None, str, int | None]:
    """A preallocated BFC pool's room, its binding limit, and the growth it still lacks.

    After a 0.9x back-off the pool (``pool_bytes``) is smaller than ``bytes_limit``. BFC backs
    off only once (``started_backpedal_`` in bfc_allocator.cc's ``Extend``), so the pool can
    grow later only by the whole remaining ``bytes_limit − pool_bytes`` at once, which a
    shared GPU rarely has free: the room is ``pool_bytes − bytes_in_use`` unless the GPU has
    that whole amount free now.
    """
    if in_use is None or limit is None:
        return None, "pool", None
    if pool is None or pool >= limit:
        return max(0, limit - in_use), "pool", None
    lacking = limit - pool
    if free is not None and free >= lacking:
        return max(0, limit - in_use), "pool", lacking
    return max(0, pool - in_use), "pool", lacking


def host_room(device: str) -> DeviceRoom:
    """Room for a CPU device: the host's available memory (JAX's CPU arrays live there)."""
    try:
        import psutil

        memory = psutil.virtual_memory()
        available, total = int(memory.available), int(memory.total)
    except Exception as exc:
        return DeviceRoom(device, "host", None, None, None, reason=f"cannot read: {_short(exc)}")
    return DeviceRoom(
        device, "host", None, available, "device", free_bytes=available, total_bytes=total
    )


def read_rooms(
    needs: ProgramNeeds,
    *,
    started: Effective | None = None,
    stats: Mapping[str, Any] | None = None,
    gpus: Mapping[str, Any] | None = None,
) -> tuple[DeviceRoom, ...]:
    """The room on each device the program runs on, read now (NVML waits; not for a hook).

    *started* is the mode JAX started with (default: as the environment says now).
    *stats* and *gpus* map a device name (``gpu:0``) to JAX's counters and to NVML's reading
    of its GPU; by default they are read here (JAX's GPU device *n* is the *n*-th GPU this
    process sees). A CPU device gets :func:`host_room`, unless *gpus* gives it a GPU (tests
    set a CPU-compiled program against a simulated GPU that way).
    """
    started = started or effective(os.environ)
    if stats is None:
        stats = {
            _gpu_name(f"{s.platform}:{s.id}"): s for s in jaxstats.device_stats(gpus_only=True)
        }
    gpu_devices = [d for d in needs.devices if d.startswith("gpu:")]
    if gpus is None:
        gpus = _nvml_by_device(gpu_devices) if gpu_devices else {}
    rooms = []
    host: DeviceRoom | None = None  # read once: every CPU device takes from the same memory
    for device in needs.devices:
        if device not in gpu_devices and device not in gpus:
            host = host or host_room(device)
            rooms.append(replace(host, device=device))
            continue
        gpu = gpus.get(device)
        mine = getattr(gpu, "self_bytes", None)
        rooms.append(room_of(device, stats.get(device), gpu, started, self_bytes=mine))
    return tuple(rooms)


@dataclass(frozen=True)
class _GpuReading:
    """NVML's reading of one GPU, with this process's bytes on it."""

    index: int
    free_bytes: int | None
    total_bytes: int | None
    self_bytes: int | None
    reserved_bytes: int | None = None
    label: str | None = None
    memory_cap: MemoryCap | None = None


def _nvml_by_device(devices: Sequence[str]) -> dict[str, _GpuReading]:
    from jax_nbmem.gpu import nvml, own_process, visible

    every_gpu = nvml.gpus()
    order = visible.visible_gpus(every_gpu, os.environ).indices if every_gpu else ()
    caps, _ = caps_by_gpu(os.environ, every_gpu)  # a problem with them: the status says it
    wanted = {}
    for device in devices:
        ordinal = int(device.split(":", 1)[1])
        if ordinal < len(order):
            wanted[device] = order[ordinal]
    if not wanted:
        return {}
    memory = {m.index: m for m in nvml.memory(sorted(set(wanted.values())))}
    mine: dict[int, int] = {}
    # This process as NVML lists it (its host PID in a container): none while that is unknown.
    for process in own_process.own_entries(nvml.processes(sorted(set(wanted.values())))) or ():
        if process.used_bytes is not None:
            mine[process.gpu] = mine.get(process.gpu, 0) + process.used_bytes
    found = {}
    for device, index in wanted.items():
        reading = memory.get(index)
        if reading is not None:
            found[device] = _GpuReading(
                index, reading.free_bytes, reading.total_bytes, mine.get(index),
                reading.reserved_bytes, reading.label, caps.get(index),
            )  # fmt: skip
    return found


def _program_devices(compiled: Any, jax: Any) -> list[Any]:
    """The devices the compiled program runs on, from its shardings; else the default one."""
    found: dict[int, Any] = {}
    for attribute in ("input_shardings", "output_shardings"):
        try:
            shardings = jax.tree_util.tree_leaves(getattr(compiled, attribute))
        except Exception:
            continue
        for sharding in shardings:
            for device in getattr(sharding, "device_set", ()) or ():
                found[id(device)] = device
    if not found:  # older pmap executables carry no shardings; the executable knows its devices
        try:
            found = {id(d): d for d in compiled.runtime_executable().local_devices()}
        except Exception:
            found = {}
    devices = sorted(found.values(), key=lambda d: (str(d.platform), d.id))
    return devices or list(jax.local_devices()[:1])


def _resident_bytes(tree: Any, jax: Any) -> dict[str, int]:
    """Bytes per device of the live JAX arrays among the call's arguments (each array once)."""
    resident: dict[str, int] = {}
    seen: set[int] = set()
    for leaf in jax.tree_util.tree_leaves(tree):
        if not isinstance(leaf, jax.Array) or id(leaf) in seen:
            continue
        seen.add(id(leaf))
        try:
            if leaf.is_deleted():
                continue
            devices = leaf.sharding.device_set
            if len(devices) == 1:  # the usual case, and 20x cheaper than listing shards
                name = device_name(next(iter(devices)))
                resident[name] = resident.get(name, 0) + int(leaf.nbytes)
                continue
            for shard in leaf.addressable_shards:
                name = device_name(shard.device)
                resident[name] = resident.get(name, 0) + int(shard.data.nbytes)
        except Exception:  # an array JAX cannot describe is simply not counted as resident
            continue
    return resident


def device_name(device: Any) -> str:
    """A JAX device as ``fit`` names it: ``gpu:0`` (CUDA and ROCm alike), ``cpu:0``."""
    return _gpu_name(f"{device.platform}:{device.id}")


def _gpu_name(name: str) -> str:
    """``cuda:0`` and ``rocm:0`` are ``gpu:0``: one name for a GPU device everywhere."""
    platform, _, number = name.partition(":")
    return f"gpu:{number}" if platform in jaxstats.GPU_PLATFORMS else name


def _tree_bytes(tree: Any, jax: Any) -> int:
    """The logical bytes of every array-like leaf (arrays, ShapeDtypeStructs) of *tree*."""
    import numpy

    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        try:
            total += math.prod(shape) * numpy.dtype(dtype).itemsize
        except Exception:  # a Python scalar, a string: no buffer of its own
            continue
    return total


def _count(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def _name_of(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def _short(exc: BaseException) -> str:
    """An exception's type and first lines, enough to act on (JAX's messages run long)."""
    paragraphs = str(exc).strip().split("\n\n", 1)
    first = " ".join(printable(line.strip()) for line in paragraphs[0].splitlines())
    if len(first) > _MESSAGE_CHARS:
        first = first[: _MESSAGE_CHARS - 1] + "…"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
