"""What the sampler reads, and how one reading becomes a GPU's sample.

:class:`SamplerSource` names the readers (NVML's memory counters and process lists, the
visible GPUs, JAX's allocator counters, the host RSS), each a plain callable so that tests can
pass fakes; :class:`QuickReading` is what a cell hook reads itself. NVML's process list is
split once per reading into this process's bytes and everyone else's (:func:`split_by_gpu`),
and :func:`gpu_sample` joins a GPU's memory reading, JAX's counters and that split into the
:class:`~jax_nbmem.record.history.GpuSample` the history keeps. Unknown values stay ``None``.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from jax_nbmem.gpu import jaxstats, nvml, own_process
from jax_nbmem.record.history import GpuSample
from jax_nbmem.record.simulated import mirror_running, with_simulated

__all__ = [
    "ProcessSplit",
    "QuickReading",
    "SamplerSource",
    "gpu_sample",
    "gpu_samples",
    "jax_gpus",
    "moved_much",
    "own_split",
    "split_by_gpu",
]

_JAX_GPU_PLATFORMS = frozenset({"gpu", "cuda", "rocm"})


def _nvml_memory(indices: Sequence[int] | None) -> Sequence[Any]:
    return nvml.memory(indices)


def _nvml_processes(indices: Sequence[int] | None) -> Sequence[Any]:
    return nvml.process_lists(indices)


def _nvml_own_processes(indices: Sequence[int] | None, pid: int) -> Sequence[Any]:
    return nvml.own_process_lists(indices, pid)


def _own_from_full(
    processes: Callable[[Sequence[int] | None], Sequence[Any]],
    indices: Sequence[int] | None,
    pid: int,
) -> Sequence[Any] | None:
    """A source without a reader of its own entries (a fake's): its whole lists serve."""
    return processes(indices)


def _visible_gpu_indices() -> Sequence[int] | None:
    from jax_nbmem.gpu import nvml, visible

    every_gpu = nvml.gpus()
    if not every_gpu:
        return None  # NVML sees nothing right now: not "no GPUs are ours"
    return tuple(visible.visible_gpus(every_gpu, os.environ).indices)


@dataclass(frozen=True)
class SamplerSource:
    """Where the sampler reads from. Each field is a plain callable, so tests can pass fakes.

    The defaults read through :mod:`jax_nbmem.gpu.nvml` (which imports pynvml at its first
    reading) and import :mod:`jax_nbmem.gpu.visible` when first called. ``gpu_indices``
    returns the NVML indices this kernel uses, in the order JAX numbers its GPU devices, or
    ``None`` for "all GPUs NVML sees". ``processes`` returns
    NVML's per-GPU lists (:class:`~jax_nbmem.gpu.nvml.GpuProcesses`, ``processes=None`` where
    a list failed) or flat process records. ``own_processes(indices, pid)`` returns the same
    for *pid*'s entries alone (others' may be left out, and are not used): what a cell's
    boundary reads; None: NVML's own reader where ``processes`` is NVML's, else ``processes``.
    ``pid`` is this process as NVML lists it (the host's PID), or None while it is unknown:
    then no bytes are taken as this process's.
    """

    memory: Callable[[Sequence[int] | None], Sequence[Any]] = _nvml_memory
    processes: Callable[[Sequence[int] | None], Sequence[Any]] = _nvml_processes
    gpu_indices: Callable[[], Sequence[int] | None] = _visible_gpu_indices
    backend_initialized: Callable[[], bool] = jaxstats.backend_initialized
    device_stats: Callable[[], Sequence[Any]] = jaxstats.device_stats
    live_array_bytes: Callable[[], int | None] = jaxstats.live_array_bytes
    host_rss_bytes: Callable[[], int | None] = jaxstats.host_rss_bytes
    # The PID NVML lists this process by: a callable asked at each reading (by default
    # jax_nbmem.gpu.own_process's, the host PID once the node agent proves it in a container),
    # or a fixed PID (tests). None: unknown, so its bytes and the others' are unknown too.
    pid: int | Callable[[], int | None] | None = own_process.nvml_pid
    # What a cell hook reads: like device_stats, but never waiting for JAX's backend lock and
    # GPU devices only; asked before backend_initialized, so it must never start a backend.
    # None: device_stats itself (a fake source's, in tests), or JAX's own.
    quick_device_stats: Callable[[], Sequence[Any]] | None = None
    own_processes: Callable[[Sequence[int] | None, int], Sequence[Any] | None] | None = None

    def __post_init__(self) -> None:
        if self.own_processes is None:
            own = _nvml_own_processes
            if self.processes is not _nvml_processes:
                own = functools.partial(_own_from_full, self.processes)
            object.__setattr__(self, "own_processes", own)
        if self.quick_device_stats is None:
            quick = self.device_stats
            if quick is jaxstats.device_stats:
                quick = jaxstats.gpu_stats_now
            object.__setattr__(self, "quick_device_stats", quick)
        if self.quick_device_stats is jaxstats.gpu_stats_now and mirror_running():
            # The demo's simulated GPU: at the cells' boundaries its mirror's counters stand
            # for JAX's (see .simulated); the samples between keep JAX's own (none on the CPU).
            quick = with_simulated(jaxstats.gpu_stats_now)
            object.__setattr__(self, "quick_device_stats", quick)

    def own_pid(self) -> int | None:
        """The PID NVML lists this process by now; None while it is unknown."""
        return self.pid() if callable(self.pid) else self.pid


class QuickReading(NamedTuple):
    """What a cell hook reads itself (see :meth:`Sampler.quick_reading`).

    ``jax`` holds JAX's GPU devices' counters (anything with ``id``, ``bytes_in_use`` and
    ``peak_bytes_in_use``), in device order; empty before the backend starts or on the CPU.
    A named tuple: made twice per cell, where a frozen dataclass costs several times more.
    """

    t: float
    mono: float
    jax_up: bool
    jax: tuple[Any, ...]

    def jax_in_use(self) -> int | None:
        """Bytes JAX's arrays use over its GPU devices; None when any device cannot say."""
        values = [getattr(d, "bytes_in_use", None) for d in self.jax]
        return None if not values or None in values else sum(values)


@dataclass(frozen=True)
class ProcessSplit:
    """One GPU's process list, split once into this process's bytes and everyone else's.

    ``mine`` is None when our PID is listed without bytes; ``listed`` says whether it is
    listed at all; ``others`` is None when another process's bytes are unknown. A GPU whose
    list could not be read has ``readable`` False (and its ``problem``): nothing is known.
    ``identified`` is False while this process's NVML PID is unknown (in a container before
    the node agent proves it): which entry is ours, and so whose bytes are whose, is unknown.
    """

    listed: bool
    mine: int | None
    others: int | None
    readable: bool = True
    problem: str | None = None
    identified: bool = True


_UNLISTED = -1  # the split that stands for every GPU a flat process list does not name
_PID, _USED = operator.attrgetter("pid"), operator.attrgetter("used_bytes")


def split_by_gpu(listing: Any, pid: int | None) -> dict[int, ProcessSplit] | None:
    """Per GPU, our bytes and the others' from one process-list reading; None if unread.

    ``listing`` is what ``SamplerSource.processes`` returned: flat process records (``pid``,
    ``gpu``, ``used_bytes``), or per-GPU lists (``gpu``, ``processes`` — None when that GPU's
    list failed). ``pid``: ours as NVML lists it; None (unknown) splits nothing.
    """
    if listing is None:
        return None
    entries: dict[int, Sequence[Any] | None] = {}
    problems: dict[int, str | None] = {}
    flat = True
    for item in listing:
        if hasattr(item, "processes"):
            flat = False
            entries[item.gpu] = item.processes
            problems[item.gpu] = getattr(item, "problem", None)
        else:
            found = entries.setdefault(item.gpu, [])
            if found is not None:
                found.append(item)  # type: ignore[union-attr]
    split: dict[int, ProcessSplit] = {}
    for gpu, processes in entries.items():
        if processes is None:
            split[gpu] = ProcessSplit(False, None, None, readable=False, problem=problems[gpu])
            continue
        if pid is None and processes:  # an empty list says who is there, whoever we are: nobody
            unknown = ProcessSplit(False, None, None, problem=problems.get(gpu), identified=False)
            split[gpu] = unknown
            continue
        # A node lists hundreds of processes a GPU, read every fraction of a second: the
        # figures are NVML's columns (or taken out in C), and only a list naming us is walked.
        if isinstance(processes, nvml.ProcessTable):
            pids, used = processes.pids, processes.used
        else:
            pids, used = list(map(_PID, processes)), list(map(_USED, processes))
        mine, theirs = [], used
        if pid in pids:
            mine = [bytes_ for owner, bytes_ in zip(pids, used, strict=True) if owner == pid]
            theirs = [bytes_ for owner, bytes_ in zip(pids, used, strict=True) if owner != pid]
        split[gpu] = ProcessSplit(
            listed=bool(mine),
            mine=None if not mine or None in mine else sum(mine),
            others=None if None in theirs else sum(theirs),
            problem=problems.get(gpu),
        )
    if flat:  # a flat list names only GPUs with processes: the others have none
        split[_UNLISTED] = ProcessSplit(listed=False, mine=None, others=0)
    return split


def own_split(listing: Any, pid: int | None, gpus: Sequence[int]) -> dict[int, ProcessSplit]:
    """Per GPU of *gpus*, this process's bytes from a reading of its own entries.

    Others' bytes are never taken from it (an own reading may leave them out): ``others`` is
    None, and a sample works them out from the GPU's used bytes. A GPU the reading does not
    answer for, and every GPU while *pid* is unknown, is unknown (``readable`` False): never
    the last figure, never a guessed 0.
    """
    split = split_by_gpu(listing, pid) if listing is not None and pid is not None else None
    unknown = ProcessSplit(False, None, None, readable=False)
    if split is None:
        return dict.fromkeys(gpus, unknown)
    result = {}
    for gpu in gpus:
        found = split.get(gpu, split.get(_UNLISTED, unknown))
        result[gpu] = ProcessSplit(found.listed, found.mine, None, found.readable, found.problem)
    return result


def jax_gpus(stats: Sequence[Any]) -> list[Any]:
    """JAX's GPU devices among ``stats``, in device-id order."""
    return sorted(
        (s for s in stats if getattr(s, "platform", None) in _JAX_GPU_PLATFORMS),
        key=lambda s: getattr(s, "id", None) or 0,
    )


def _held(stats: Any) -> int | None:
    """What JAX's allocator holds (its pool), as :func:`~jax_nbmem.gpu.jaxstats.held_of` says.

    ``pool_bytes``, else ``bytes_limit`` only where cuda_async took its pool up front (with
    preallocation off its ``bytes_limit`` is no memory held). Never ``bytes_reserved``.
    """
    if stats is None:
        return None
    return jaxstats.held_of(getattr(stats, "pool_bytes", None), getattr(stats, "bytes_limit", None))


# How far a GPU's used bytes may move before its process list is taken as out of date.
_STALE_LIST_BYTES = 64 * 1024**2


def moved_much(used: dict[int, int | None], at_list: dict[int, int | None] | None) -> bool:
    """Whether some GPU's used bytes moved by more than ``_STALE_LIST_BYTES`` since the list."""
    if at_list is None:
        return False
    for index, now in used.items():
        then = at_list.get(index)
        if now is not None and then is not None and abs(now - then) > _STALE_LIST_BYTES:
            return True
    return False


def gpu_samples(
    memory: Sequence[Any],
    indices: Sequence[int] | None,
    gpu_stats: Sequence[Any],
    split: dict[int, ProcessSplit] | None,
    used_at_split: dict[int, int | None] | None,
    on_error: Callable[[Exception], Any],
    made: dict[int, tuple[Any, ...]] | None = None,
) -> list[GpuSample]:
    """Every GPU's sample from NVML's memory readings, JAX's GPU counters and the last split.

    *indices*: the kernel's visible GPUs in JAX's device order (None: all, by index);
    *used_at_split*: each GPU's used bytes when the process list was read. A malformed
    reading loses its GPU, not the sample: its error goes to *on_error*. *made*, when given,
    keeps each GPU's sample with what it was made of: made of the same objects again, the same
    (immutable) sample serves, as between most cells, when nothing on the GPU moved.
    """
    # JAX numbers its GPU devices in the order of the kernel's visible GPUs.
    order = list(indices) if indices is not None else sorted(g.index for g in memory)
    stats_by_index = dict(zip(order, gpu_stats, strict=False))
    listed_used = used_at_split or {}
    unlisted = split.get(_UNLISTED) if split is not None else None
    gpus = []
    for reading in memory:
        index = reading.index
        stats = stats_by_index.get(index)
        mine = split.get(index, unlisted) if split is not None else None
        then, now = listed_used.get(index), reading.used_bytes
        stale = now is not None and then is not None and abs(now - then) > _STALE_LIST_BYTES
        kept = made.get(index) if made is not None else None
        if (
            kept is not None
            and kept[0] is reading
            and kept[1] is mine
            and kept[2] is stale
            and kept[4] is stats  # unchanged JAX counters are the same object again
        ):
            gpus.append(kept[3])
            continue
        try:
            sample = gpu_sample(reading, stats, split, stale=stale)
        except Exception as exc:
            on_error(exc)
            continue
        gpus.append(sample)
        if made is not None:
            made[index] = (reading, mine, stale, sample, stats)
    return gpus


def gpu_sample(
    reading: Any, stats: Any, split: dict[int, ProcessSplit] | None, stale: bool = False
) -> GpuSample:
    """One GPU's sample from its memory reading, JAX's counters and the process list's split.

    *stale*: the GPU's used bytes moved since the process list was read, so the split cannot
    say whose bytes moved; others are unknown (a gap, not a guess) until the next list.
    """
    used = reading.used_bytes
    self_bytes: int | None = None
    others: int | None = None
    mine = split.get(reading.index, split.get(_UNLISTED)) if split is not None else None
    if mine is not None and mine.readable and mine.identified:
        if mine.listed:
            self_bytes = mine.mine
        elif stats is None and used is not None:
            self_bytes = 0  # JAX does not use this GPU and NVML does not list us: nothing
        # Otherwise our pid is missing from a GPU that JAX holds (e.g. NVML sees another PID
        # namespace in a container): unknown, not 0.
        if stale:
            others = None
        elif used is not None and self_bytes is not None:
            others = max(0, used - self_bytes)
        else:
            others = mine.others
    # No split (the GPU's process list could not be read), or this process's NVML PID is
    # unknown: who holds what is unknown, never a guessed 0.
    return GpuSample(
        index=reading.index,
        uuid=reading.uuid,
        name=reading.name,
        total_bytes=reading.total_bytes,
        used_bytes=used,
        free_bytes=reading.free_bytes,
        self_bytes=self_bytes,
        others_bytes=others,
        jax_in_use=getattr(stats, "bytes_in_use", None),
        jax_peak=getattr(stats, "peak_bytes_in_use", None),
        jax_reserved=_held(stats),
        jax_limit=getattr(stats, "bytes_limit", None),
        problem=nvml.gpu_problem(getattr(reading, "problem", None), mine.problem if mine else None),
        reserved_bytes=getattr(reading, "reserved_bytes", None),
        mig=getattr(reading, "mig", None),
    )
