"""GPU sharing caps: the memory MPS or HAMi lets this process take, and what JAX takes under it.

Two ways of sharing a GPU cap a process's memory below the card's (docs/containers.md, "GPU
sharing caps", says what was verified and what only on paper):

* **MPS** (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20G,1=8G``): ``<CUDA ordinal>=<integer><unit>``
  entries, the unit ``M``/``MB`` (2**20) or ``G``/``GB`` (2**30). CUDA's ``cuMemGetInfo`` still
  reports the whole card as the total, its free memory is at most the cap, and an allocation
  past the cap fails: JAX asks for 75% *of the card*, and its 0.9x retries end just under the
  cap, taking all of it.
* **HAMi** (``CUDA_DEVICE_MEMORY_LIMIT`` for every device, ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` for
  device *i*, which wins): ``<integer>`` bytes or ``<integer>`` with ``k``/``m``/``g`` (either
  case, powers of 1024), ``0`` meaning no limit. HAMi-core hooks ``cuMemGetInfo`` and reports
  the cap as the total, so JAX's fraction is a fraction *of the cap*.

Ordinals are CUDA's, counted after ``CUDA_VISIBLE_DEVICES``. Parsing is strict: what HAMi-core's
``strtoul`` would read loosely (``8.5g`` as 8 GiB, ``010m`` as octal, ``20gb`` as 20 bytes) is a
said problem, never a guess. Pure: an environment and NVML's totals in, facts out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from jax_nbmem.allocator.jaxlib import RETRY_FACTOR
from jax_nbmem.gpu.mig import gpu_label
from jax_nbmem.gpu.visible import visible_gpus
from jax_nbmem.units import format_bytes

__all__ = [
    "HAMI_VARIABLE",
    "MPS_VARIABLE",
    "CONTEXT_RESERVE_BYTES",
    "CapError",
    "Caps",
    "MemoryCap",
    "PoolUnderCap",
    "cap_variables",
    "capped_reading",
    "caps_of_report",
    "caps_by_gpu",
    "cuda_view",
    "has_caps",
    "parse_hami_limit",
    "parse_mps_limit",
    "pool_under_cap",
    "read_caps",
]

MPS_VARIABLE = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
HAMI_VARIABLE = "CUDA_DEVICE_MEMORY_LIMIT"
_HAMI_INDEXED = re.compile(rf"{HAMI_VARIABLE}_([0-9]{{1,3}})")
_MPS_ENTRY = re.compile(r"([0-9]{1,3})=([1-9][0-9]{0,15}|0)(MB|GB|M|G)", re.IGNORECASE)
_HAMI_VALUE = re.compile(r"([1-9][0-9]{0,18}|0)([kmg]?)", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}
# Room a pool must leave under the cap: a CUDA context (what the warnings reserve too).
CONTEXT_RESERVE_BYTES = 512 * 1024**2
# Retries BFC makes before giving up (0.9**60 of a pool is far below any useful size).
_RETRIES = 60


class CapError(ValueError):
    """A cap variable whose value is not one its sharing system reads; the message says why."""


@dataclass(frozen=True)
class MemoryCap:
    """The memory one CUDA device lets this process take: ``bytes``, set by ``kind``.

    ``kind`` is ``"mps"`` (CUDA still reports the card's total) or ``"hami"`` (CUDA reports the
    cap as the total); ``variable`` names the variable that set it.
    """

    ordinal: int
    bytes: int
    kind: str
    variable: str

    @property
    def cuda_total_is_cap(self) -> bool:
        """Whether CUDA (and so JAX's fraction) counts the cap as the device's total."""
        return self.kind == "hami"

    def describe(self) -> str:
        """``20.0 GiB (MPS, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)``."""
        return f"{format_bytes(self.bytes)} ({self.system}, {self.variable})"

    @property
    def system(self) -> str:
        """``MPS`` or ``HAMi``, as people write them."""
        return "MPS" if self.kind == "mps" else "HAMi"

    def to_dict(self) -> dict:
        """JSON-ready: ``bytes``, ``kind``, ``variable``, ``cuda_device``, ``cuda_total_is_cap``."""
        return {
            "bytes": self.bytes,
            "cuda_device": self.ordinal,
            "kind": self.kind,
            "variable": self.variable,
            "cuda_total_is_cap": self.cuda_total_is_cap,
        }


@dataclass(frozen=True)
class Caps:
    """Caps by CUDA ordinal, and each problem with the variables in one sentence."""

    by_ordinal: Mapping[int, MemoryCap]
    problems: tuple[str, ...] = ()


def cap_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of *environ* that cap GPU memory (and ``CUDA_VISIBLE_DEVICES``)."""
    return {
        key: value
        for key, value in environ.items()
        if key in (MPS_VARIABLE, HAMI_VARIABLE, "CUDA_VISIBLE_DEVICES")
        or _HAMI_INDEXED.fullmatch(key)
    }


def has_caps(environ: Mapping[str, str]) -> bool:
    """Whether *environ* sets any MPS or HAMi memory cap variable (a quick look, no parsing)."""
    return any(key != "CUDA_VISIBLE_DEVICES" for key in cap_variables(environ))


def parse_mps_limit(text: str) -> dict[int, int]:
    """``"0=20G,1=512M"`` → ``{0: 20 GiB, 1: 512 MiB}``; CapError for anything else.

    Each entry is ``<ordinal>=<integer><unit>``, unit ``M``/``MB`` or ``G``/``GB`` (any case);
    no spaces inside an entry, no ordinal twice, a limit above 0.
    """
    limits: dict[int, int] = {}
    entries = [entry.strip() for entry in text.split(",")]
    if not text.strip():
        raise CapError("it is empty")
    for entry in entries:
        match = _MPS_ENTRY.fullmatch(entry)
        if match is None:
            bare = re.fullmatch(r"([0-9]+)=([0-9]+)", entry)
            why = (
                "has no unit (MPS takes M or G, e.g. 0=20G)"
                if bare
                else ("is not <CUDA device>=<integer><M or G>, e.g. 0=20G")
            )
            raise CapError(f"entry {entry!r} {why}")
        ordinal, number, unit = int(match[1]), int(match[2]), match[3].lower()
        if ordinal in limits:
            raise CapError(f"CUDA device {ordinal} is named twice")
        if number == 0:
            raise CapError(f"entry {entry!r} is a limit of 0")
        limits[ordinal] = number * _UNITS[unit]
    return limits


def parse_hami_limit(text: str) -> int:
    """``"8192m"`` → 8 GiB, ``"20g"``, ``"1073741824"`` (bytes); 0 means no limit.

    CapError for what HAMi-core would read loosely or not at all (see the module).
    """
    value = text.strip()
    match = _HAMI_VALUE.fullmatch(value)
    if match is None:
        if re.fullmatch(r"0[0-9]+[kmgKMG]?", value):
            why = "has a leading 0 (HAMi-core would read it as octal)"
        else:
            why = "is not an integer with an optional k, m or g (e.g. 8192m, 20g)"
        raise CapError(f"{text!r} {why}")
    return int(match[1]) * _UNITS[match[2].lower()]


def read_caps(environ: Mapping[str, str], devices: int) -> Caps:
    """The caps *environ* sets on this process's *devices* CUDA devices, and its problems.

    With both MPS and HAMi caps on a device, the smaller binds. A variable with a problem sets
    no cap (said in ``problems``), never a guessed one.
    """
    caps: dict[int, MemoryCap] = {}
    problems: list[str] = []

    def offer(cap: MemoryCap) -> None:
        if cap.ordinal >= devices:
            seen = f"{devices} CUDA device{'s' if devices != 1 else ''}"
            problems.append(
                f"{cap.variable} caps CUDA device {cap.ordinal}, but this process sees {seen}: "
                "ignored"
            )
        elif cap.ordinal not in caps or cap.bytes < caps[cap.ordinal].bytes:
            caps[cap.ordinal] = cap

    mps = environ.get(MPS_VARIABLE)
    if mps is not None and mps.strip():
        try:
            for ordinal, size in parse_mps_limit(mps).items():
                offer(MemoryCap(ordinal, size, "mps", MPS_VARIABLE))
        except CapError as error:
            problems.append(f"{MPS_VARIABLE}={mps!r} is not an MPS limit: {error}; no MPS cap read")
    fallback, indexed = None, {}
    for key in sorted(environ):
        match = _HAMI_INDEXED.fullmatch(key)
        if key != HAMI_VARIABLE and match is None:
            continue
        text = environ[key]
        if not text.strip():
            continue  # empty: HAMi-core reads it as unset
        try:
            size = parse_hami_limit(text)
        except CapError as error:
            problems.append(f"{key} {error}; no HAMi cap read from it")
            continue
        if match is None:
            fallback = size
        else:
            indexed[int(match[1])] = (key, size)
    hami = {i: (HAMI_VARIABLE, fallback) for i in range(devices) if fallback}
    hami.update(indexed)  # CUDA_DEVICE_MEMORY_LIMIT_<i> wins, as in HAMi-core
    for ordinal, (variable, size) in sorted(hami.items()):
        if size:  # 0: no limit, as HAMi-core reads it
            offer(MemoryCap(ordinal, size, "hami", variable))
    return Caps(caps, tuple(problems))


def caps_by_gpu(
    environ: Mapping[str, str], gpus: Sequence
) -> tuple[dict[int, MemoryCap], tuple[str, ...]]:
    """The caps in *environ* on NVML's *gpus* (``GpuMemory`` readings), by NVML index.

    A cap larger than its GPU's total (NVML's) is no cap: it is dropped, and said. Problems come
    back as sentences for the status's notes.
    """
    if not gpus or not has_caps(environ):
        return {}, ()  # none, or no GPU to place them on (the status says why NVML lists none)
    order = visible_gpus(gpus, environ).indices
    found = read_caps(environ, len(order))
    totals = {gpu.index: gpu for gpu in gpus}
    caps: dict[int, MemoryCap] = {}
    problems = list(found.problems)
    for ordinal, cap in found.by_ordinal.items():
        gpu = totals[order[ordinal]]
        total = getattr(gpu, "total_bytes", None)
        if total is not None and cap.bytes > total:
            problems.append(
                f"{cap.variable} caps CUDA device {ordinal} ({gpu_label(gpu)}) at "
                f"{format_bytes(cap.bytes)}, more than its {format_bytes(total)}: no cap there"
            )
            continue
        caps[gpu.index] = cap
    return caps, tuple(problems)


def cuda_view(
    total: int | None, free: int | None, cap: MemoryCap | None, held: int = 0
) -> tuple[int | None, int | None]:
    """(total, free) as this process's CUDA reports them under *cap*, from NVML's figures.

    *held*: what this process already holds against the cap. MPS: the card's total, free at
    most what the cap leaves; HAMi: the cap is the total (HAMi-core counts every process of
    the container against it; *held* can only be this one's).
    """
    if cap is None:
        return total, free
    room = max(0, cap.bytes - held)
    free = room if free is None else min(free, room)
    if cap.cuda_total_is_cap:
        total = cap.bytes if total is None else min(total, cap.bytes)
    return total, free


def capped_reading(gpu: Any, cap: MemoryCap | None) -> Any:
    """NVML's reading *gpu* (a dataclass) as this process's CUDA sees it under *cap*.

    Its ``total_bytes`` and ``free_bytes`` become :func:`cuda_view`'s; uncapped, *gpu* itself.
    """
    if cap is None or getattr(gpu, "total_bytes", None) is None:
        return gpu
    total, free = cuda_view(gpu.total_bytes, gpu.free_bytes, cap)
    return replace(gpu, total_bytes=total, free_bytes=free)


def caps_of_report(gpus: Sequence[Mapping[str, Any]]) -> dict[int, MemoryCap]:
    """The caps a status report's ``gpus`` carry (``memory_cap``), by NVML index."""
    caps = {}
    for gpu in gpus:
        cap = gpu.get("memory_cap")
        if cap:
            ordinal, size = cap["cuda_device"], cap["bytes"]
            caps[gpu["index"]] = MemoryCap(ordinal, size, cap["kind"], cap["variable"])
    return caps


@dataclass(frozen=True)
class PoolUnderCap:
    """What a preallocating mode takes against a cap at the first allocation.

    ``asked``: fraction x CUDA's total; ``pool``: what BFC ends with after its 0.9x retries (0:
    none fits); ``fits``: the first ask fits under the cap, leaving *reserve*.
    """

    asked: int
    pool: int
    fits: bool
    cap: MemoryCap


def pool_under_cap(
    fraction: float, card_total: int, cap: MemoryCap, reserve: int = CONTEXT_RESERVE_BYTES
) -> PoolUnderCap:
    """The pool ``fraction`` takes on a card of *card_total* bytes under *cap*.

    *reserve*: what must stay under the cap besides the pool (a CUDA context). The cap alone
    limits it here; what other processes leave free is the shared-GPU warnings' business.
    """
    total = min(card_total, cap.bytes) if cap.cuda_total_is_cap else card_total
    asked = int(fraction * total)
    room = max(0, cap.bytes - reserve)
    pool = asked
    for _ in range(_RETRIES):
        if pool <= room:
            return PoolUnderCap(asked, pool, pool == asked, cap)
        pool = int(pool * RETRY_FACTOR)
    return PoolUnderCap(asked, 0, False, cap)
