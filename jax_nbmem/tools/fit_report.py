"""The verdict of "will it fit?": one line, the cheapest change that would make it fit, a table.

Plain logic over :class:`~jax_nbmem.tools.fit.ProgramNeeds` and the rooms of its devices; the
changes it suggests, cheapest first: free named arrays (no restart), free what the last error
keeps (no restart), another allocator mode at the next start (a restart), other processes'
memory (someone else's move), a smaller call.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jax_nbmem.allocator.jaxlib import DEFAULT_FRACTION, Effective
from jax_nbmem.tools.fit import (
    DeviceRoom,
    ProgramNeeds,
    compile_needs,
    device_name,
    read_rooms,
)
from jax_nbmem.units import MISSING, format_bytes, format_duration

__all__ = ["FitReport", "Freeable", "check_fit", "format_fit", "judge"]

# Below this much to spare a fit is "only just": cuBLAS/cuDNN workspaces, autotuning and the
# allocator's rounding take memory that XLA's figures do not show.
_TIGHT_BYTES = 256 * 1024**2
_TIGHT_SHARE = 0.05
_MAX_NAMES = 5
_DEVICE_ROWS = 8
_FRACTION_STEP = 0.05
# Named arrays described when looking for what to free: the largest this many.
_DESCRIBED = 200


@dataclass(frozen=True)
class Freeable:
    """A named array that could be freed for the call: a name, its bytes and its devices."""

    name: str
    bytes: int
    devices: tuple[str, ...]


@dataclass(frozen=True)
class FitReport:
    """Whether a call fits, why, and what would make it fit.

    ``fits`` is None when it cannot be told (``verdict`` says why). ``advice`` is the cheapest
    change that would make a call that does not fit, fit (None when it fits). ``spare``: per
    device, room less what the call still needs (negative: short), None where unknown. Printed,
    it is the verdict, the advice and the table; ``to_dict()`` gives every figure.
    """

    needs: ProgramNeeds
    rooms: tuple[DeviceRoom, ...]
    fits: bool | None
    verdict: str
    advice: str | None
    spare: dict[str, int | None]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Every figure, JSON-friendly."""
        return {
            "fits": self.fits,
            "verdict": self.verdict,
            "advice": self.advice,
            "spare": dict(self.spare),
            "notes": list(self.notes),
            "program": self.needs.to_dict(),
            "devices": [room.to_dict() for room in self.rooms],
        }

    def __str__(self) -> str:
        return format_fit(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def check_fit(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    call: str | None = None,
    started: Effective | None = None,
    namespace: Mapping[str, Any] | None = None,
    last_error_bytes: int | None = None,
    resident_from: Any = None,
) -> FitReport:
    """Compile the call (never run it), read each device's room now, and judge.

    *started*: the mode JAX started with, as far as it is known (default: the environment's).
    *namespace*: the user's names, searched for arrays worth freeing only when the call does
    not fit. *resident_from*: see ``compile_needs``. Raises
    :class:`~jax_nbmem.tools.fit.FitError` as ``compile_needs`` does.
    """
    needs = compile_needs(fn, args, kwargs, call=call, resident_from=resident_from)
    rooms = read_rooms(needs, started=started)
    report = judge(needs, rooms, last_error_bytes=last_error_bytes)
    if report.fits is False and namespace:
        used = (tuple(args), dict(kwargs or {}), resident_from)
        freeable = _freeable(namespace, _argument_ids(used))
        report = judge(needs, rooms, freeable=freeable, last_error_bytes=last_error_bytes)
    return report


def _argument_ids(tree: Any) -> set[int]:
    return {id(leaf) for leaf in sys.modules["jax"].tree_util.tree_leaves(tree)}


def _freeable(namespace: Mapping[str, Any], arguments: set[int]) -> list[Freeable]:
    """Names holding JAX arrays (one level into lists, tuples, dicts) that the call does not use.

    Private names and IPython's output history are left out: ``%jaxmem free`` is for names a
    user chose. Only the largest few are described (their devices read): the verdict suggests
    at most a handful, largest first, and a namespace may hold 20,000 arrays.
    """
    array_type = sys.modules["jax"].Array
    sized = []
    for name, value in list(namespace.items()):
        if name.startswith("_") or name in ("Out", "In"):
            continue
        if isinstance(value, array_type):  # the common case, kept cheap: 20,000 names happen
            size = 0 if id(value) in arguments else _live_nbytes(value)
            if size:
                sized.append((size, name, [value]))
            continue
        if isinstance(value, dict):
            items = list(value.values())
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            items = [value]
        arrays = [item for item in items if isinstance(item, array_type)]
        if not arrays or any(id(array) in arguments for array in arrays):
            continue
        size = sum(_live_nbytes(array) for array in arrays)
        if size:
            sized.append((size, name, arrays))
    sized.sort(key=lambda entry: entry[0], reverse=True)
    return [Freeable(name, size, _devices_of(arrays)) for size, name, arrays in sized[:_DESCRIBED]]


def _live_nbytes(array: Any) -> int:
    """What freeing *array* would give back: its bytes on the device (0 once deleted)."""
    try:
        return int(array.on_device_size_in_bytes())  # a deleted array raises
    except Exception:
        return 0


def _devices_of(arrays: list[Any]) -> tuple[str, ...]:
    devices: set[str] = set()
    for array in arrays:
        try:
            devices.update(device_name(d) for d in array.devices())
        except Exception:  # deleted meanwhile: no device
            continue
    return tuple(sorted(devices))


def judge(
    needs: ProgramNeeds,
    rooms: Sequence[DeviceRoom],
    *,
    freeable: Sequence[Freeable] = (),
    last_error_bytes: int | None = None,
) -> FitReport:
    """Set the call's needs against each device's room; say the verdict and the cheapest fix.

    *freeable*: named arrays (not among the call's arguments) that ``%jaxmem free`` could
    free; *last_error_bytes*: what the last error's frames alone hold.
    """
    spare: dict[str, int | None] = {}
    # CPU devices all take from the host's one memory: what they need together counts.
    on_host = [room for room in rooms if room.kind == "host"]
    host_needs = [needs.new_bytes(room.device) for room in on_host]
    host_total = None if None in host_needs else sum(host_needs)  # type: ignore[arg-type]
    for room in rooms:
        need = host_total if room.kind == "host" else needs.new_bytes(room.device)
        spare[room.device] = (
            None if need is None or room.room_bytes is None else room.room_bytes - need
        )
    notes = _notes(needs, rooms)
    if len(on_host) > 1 and host_total is not None:
        notes = (
            f"The {len(on_host)} CPU devices share the host's memory: the call needs "
            f"{format_bytes(host_total)} more there in all.",
            *notes,
        )
    if needs.total_bytes is None:
        verdict = (
            f"cannot tell whether {needs.call} fits: this jaxlib reports no buffer sizes for it "
            f"on {needs.platform} (only its generated code)"
        )
        return FitReport(needs, tuple(rooms), None, verdict, None, spare, notes)
    unknown = [room for room in rooms if spare[room.device] is None]
    if unknown:
        room = unknown[0]
        need = format_bytes(needs.new_bytes(room.device))
        verdict = (
            f"cannot tell whether {needs.call} fits on {room.device}: {room.reason}; "
            f"it needs {need} more there"
        )
        return FitReport(needs, tuple(rooms), None, verdict, None, spare, notes)
    worst = min(rooms, key=lambda room: spare[room.device])  # type: ignore[arg-type, return-value]
    left = spare[worst.device]
    need = needs.new_bytes(worst.device) or 0
    where = _where(worst)
    if left >= 0:  # type: ignore[operator]
        tight = left < max(_TIGHT_BYTES, _TIGHT_SHARE * need)  # type: ignore[operator]
        head = "fits, only just, with" if tight else "fits with"
        scope = f", the least of {len(rooms)} devices" if len(rooms) > 1 else ""
        verdict = (
            f"{head} {format_bytes(left)} to spare on {worst.device}{scope} (the call needs "
            f"{format_bytes(need)} more; {format_bytes(worst.room_bytes)} {where})"
        )
        if tight:
            notes = (
                *notes,
                "cuBLAS/cuDNN workspaces, autotuning and the allocator's rounding take memory "
                "that XLA's figures leave out: a fit this close may still fail.",
            )
        return FitReport(needs, tuple(rooms), True, verdict, None, spare, notes)
    short = -left  # type: ignore[operator]
    scope = f", the worst of {len(rooms)} devices" if len(rooms) > 1 else ""
    verdict = (
        f"does not fit by {format_bytes(short)} on {worst.device}{scope} (the call needs "
        f"{format_bytes(need)} more; {format_bytes(worst.room_bytes)} {where})"
    )
    advice = _cheapest_change(needs, worst, short, need, freeable, last_error_bytes)
    return FitReport(needs, tuple(rooms), False, verdict, advice, spare, notes)


def _where(room: DeviceRoom) -> str:
    if room.kind == "host":
        return "available on the host"
    if room.limit == "cap":
        return "left under this process's MPS or HAMi cap"
    return "free in JAX's pool" if room.limit == "pool" else "free on the GPU"


def _cheapest_change(
    needs: ProgramNeeds,
    room: DeviceRoom,
    short: int,
    need: int,
    freeable: Sequence[Freeable],
    last_error_bytes: int | None,
) -> str:
    """The first change, cheapest first, that alone would make up *short* on *room*'s device."""
    names = _names_to_free(freeable, room.device, short)
    if names:
        listed = " ".join(item.name for item in names)
        total = format_bytes(sum(item.bytes for item in names))
        return f"free {listed} ({total}) first: `%jaxmem free {listed}`"
    if last_error_bytes is not None and last_error_bytes >= short:
        return (
            f"`%jaxmem free --last-error`: the last error's frames hold "
            f"{format_bytes(last_error_bytes)} of arrays"
        )
    if room.kind == "host":
        smaller = "make the call smaller (a smaller batch, jax.checkpoint)"
        if room.total_bytes is not None and need > room.total_bytes:
            return (
                f"it does not fit this machine's memory at all ({format_bytes(need)} of "
                f"{format_bytes(room.total_bytes)}): {smaller}"
            )
        return f"the host has too little memory available: close other programs, or {smaller}"
    total = room.total_bytes
    wanted = (room.bytes_in_use or 0) + need  # the arrays held now, and the call's new memory
    smaller = "make the call smaller (a smaller batch, jax.checkpoint, or shard it over more GPUs)"
    if total is not None and (needs.total_bytes or 0) > total:
        return (
            f"it does not fit this GPU at all ({format_bytes(needs.total_bytes)} of "
            f"{format_bytes(total)}): {smaller}"
        )
    if total is None or room.free_bytes is None:
        return smaller
    held = room.self_bytes if room.self_bytes is not None else (room.pool_bytes or 0)
    after_restart = room.free_bytes + held  # what a restarted kernel could take at most
    if room.limit == "pool" and wanted <= after_restart:
        if room.preallocated and wanted <= min(DEFAULT_FRACTION * total, after_restart):
            return (
                "`%jaxalloc off` at the next start (restart the kernel): JAX's pool is the "
                f"limit; without preallocation it grows up to {DEFAULT_FRACTION:.0%} of the GPU"
            )
        fraction = math.ceil((wanted + _TIGHT_BYTES) / total / _FRACTION_STEP) * _FRACTION_STEP
        if fraction <= 1.0 and fraction * total <= after_restart:
            return (
                f"`%jaxalloc fraction {fraction:.2g}` at the next start (restart the kernel): "
                f"JAX's pool is the limit, and {format_bytes(fraction * total)} would hold "
                "today's arrays and the call"
            )
    if room.limit == "cap":
        return (
            f"this process's MPS or HAMi cap ({format_bytes(room.memory_cap_bytes)}) is the "
            f"limit, whatever the GPU has free: {smaller}, or ask for a larger share of the GPU"
        )
    others = None
    if room.total_bytes is not None and room.self_bytes is not None:
        # What the driver reserves for itself is no process's to give back.
        held_by_all = room.total_bytes - room.free_bytes - (room.reserved_bytes or 0)
        others = max(0, held_by_all - room.self_bytes)
    if others:
        return (
            f"other processes hold {format_bytes(others)} of "
            f"{room.gpu_label or f'GPU {room.gpu_index}'}; "
            f"{format_bytes(short)} more must come free (`%jaxmem status` names them), or "
            f"{smaller}"
        )
    return smaller


def _names_to_free(freeable: Sequence[Freeable], device: str, short: int) -> list[Freeable]:
    """The fewest large named arrays on *device* that together make up *short*, or []."""
    chosen, total = [], 0
    for item in sorted(freeable, key=lambda f: f.bytes, reverse=True):
        if device not in item.devices or item.bytes <= 0:
            continue
        chosen.append(item)
        total += item.bytes
        if total >= short:
            return chosen
        if len(chosen) == _MAX_NAMES:
            break
    return []


def _notes(needs: ProgramNeeds, rooms: Sequence[DeviceRoom]) -> tuple[str, ...]:
    notes = []
    for room in rooms:
        block, temp = room.largest_free_block, needs.temp_bytes
        if room.limit == "pool" and block is not None and temp and temp > block:
            notes.append(
                f"{room.device}: XLA takes the temporaries as one block of {format_bytes(temp)}, "
                f"but the largest free block in JAX's pool is {format_bytes(block)}: "
                "fragmentation may make it fail even so."
            )
            break
    if needs.host_bytes:
        notes.append(f"The program also uses {format_bytes(needs.host_bytes)} of host memory.")
    return tuple(notes)


def format_fit(report: FitReport) -> str:
    """The verdict, the cheapest change, then the program's figures and each device's room."""
    needs = report.needs
    lines = [report.verdict]
    if report.advice:
        lines.append(f"Cheapest change: {report.advice}.")
    shown = ", ".join(needs.devices[:4]) + (
        f" +{len(needs.devices) - 4}" * (len(needs.devices) > 4)
    )
    lines.append(
        f"{needs.call}: compiled for {shown} in {format_duration(needs.compile_s)}, not run; "
        "per device:"
    )
    # What XLA counts of the arguments as already there (jaxlib 0.4.26's CPU client counts 0).
    resident = min(max(needs.resident_bytes.values(), default=0), needs.argument_bytes or 0)
    if needs.peak_bytes is not None:
        peak_note, total_note = "XLA's peak_memory_in_bytes", "peak + code"
    else:
        peak_note = "not reported by this jaxlib"
        total_note = "arguments + outputs - aliased + temporaries + code"
    there = f"{format_bytes(resident)} already there"
    figures = [
        ("arguments", needs.argument_bytes, _said(resident, there)),
        ("outputs", needs.output_bytes, ""),
        ("aliased", needs.alias_bytes, _said(needs.alias_bytes, "donated arguments reused")),
        ("temporaries", needs.temp_bytes, ""),
        ("generated code", needs.code_bytes, ""),
        ("peak", needs.peak_bytes, peak_note),
        ("total", needs.total_bytes, total_note),
    ]  # fmt: skip
    for label, value, note in figures:
        lines.append(f"  {label:<15}{format_bytes(value):>10}" + (f"  ({note})" if note else ""))
    for room in report.rooms[:_DEVICE_ROWS]:
        lines.append(_room_line(room, needs, report.spare.get(room.device)))
    if len(report.rooms) > _DEVICE_ROWS:
        lines.append(f"  ... and {len(report.rooms) - _DEVICE_ROWS} more devices")
    lines.extend(report.notes)
    return "\n".join(lines)


def _said(value: int | None, note: str) -> str:
    return note if value else ""


def _room_line(room: DeviceRoom, needs: ProgramNeeds, spare: int | None) -> str:
    need = format_bytes(needs.new_bytes(room.device))
    if room.kind == "host":
        where = f"{format_bytes(room.room_bytes)} available on the host (JAX runs on the CPU)"
    else:
        readings = []
        if room.bytes_limit is not None:
            readings.append(
                f"pool limit {format_bytes(room.bytes_limit)}, "
                f"{format_bytes(room.bytes_in_use)} in use"
            )
        if room.growth_bytes is not None:
            grows = room.free_bytes is not None and room.free_bytes >= room.growth_bytes
            readings.append(
                f"pool {format_bytes(room.pool_bytes)} after backing off; it can grow only "
                f"by the whole {format_bytes(room.growth_bytes)} at once, which the GPU "
                + ("has free now" if grows else "does not have free")
            )
        readings.append(f"GPU free {format_bytes(room.free_bytes)}")
        where = f"room {format_bytes(room.room_bytes)}"
        if room.memory_cap_bytes is not None:
            readings.append(f"cap {format_bytes(room.memory_cap_bytes)} (MPS or HAMi)")
        if room.limit:
            limit = {"pool": "JAX pool", "cap": "the cap"}.get(room.limit, "the GPU")
            where += f" ({limit} is the limit)"
        where += f"; {', '.join(readings)}; mode {room.mode or MISSING}"
    if spare is None:
        outcome = room.reason or "unknown"
    elif spare >= 0:
        outcome = f"{format_bytes(spare)} to spare"
    else:
        outcome = f"short by {format_bytes(-spare)}"
    return f"  {room.device}: needs {need} more; {where} -> {outcome}"
