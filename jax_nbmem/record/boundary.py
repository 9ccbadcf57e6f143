"""A cell's boundary read in microseconds: the last complete reading, and whether it still holds.

Back to back (Run All), every cell's start reads the boundary between it and the previous cell
(see :mod:`jax_nbmem.record.ledger`). Between two trivial cells nothing a GPU sample is made of
moves: NVML's memory figures of the kernel's GPUs come back the same (the same reading objects,
see :func:`jax_nbmem.gpu.nvml_memory.read_memory`), so do JAX's counters, the process lists'
split and this process's NVML PID. A :class:`BoundaryPlan` keeps what the last complete reading
was made of; :meth:`BoundaryPlan.sample` reads only what tells whether it still holds (the
memory figures, JAX's counters where it has GPUs, whether its backend is up) and this process's
RSS, and then reuses the reading's GPU samples. Anything else, or anything moved, says ``None``:
then the sampler takes its complete reading, which reads this process's own entries where a
GPU's used bytes moved (and never guesses). The record is the same either way; only its cost
differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jax_nbmem.record.history import GpuSample, HostSample, Sample
from jax_nbmem.record.readings import SamplerSource, jax_gpus

__all__ = ["BoundaryPlan"]


class BoundaryPlan:
    """What a complete reading was made of, to tell at a boundary whether it still holds.

    Made by the sampler after a complete reading whose process lists' split is up to date
    (no GPU's used bytes moved since its lists were read, and by the PID NVML lists this
    process by); replaced by the next. ``until`` (monotonic): from then on it never holds
    (the live arrays are due a walk, or the set of GPUs a look). Immutable once made: two
    threads may use one at once.
    """

    __slots__ = (
        "gpus",
        "indices",
        "jax_up",
        "lists_due",
        "live",
        "memory",
        "pid",
        "state",
        "stats",
        "until",
    )

    def __init__(
        self,
        *,
        indices: Sequence[int] | None,
        memory: list[Any],
        jax_up: bool,
        stats: list[Any] | None,
        pid: int | None,
        state: Any,
        gpus: tuple[GpuSample, ...],
        live: tuple[int | None, float | None],
        until: float,
        lists_due: float,
    ) -> None:
        self.indices = indices
        self.memory = memory
        self.jax_up = jax_up
        self.stats = stats  # JAX's GPU counters, when its backend is up and has GPUs
        self.pid = pid
        self.state = state  # the process lists' (split, used) pair, by identity
        self.gpus = gpus
        self.live = live  # the live arrays' (bytes, time of the walk), as the reading had them
        self.until = until
        self.lists_due = lists_due  # the whole process lists are due (the thread reads them)

    def sample(
        self,
        source: SamplerSource,
        now: float,
        state: Any,
        pid: Callable[[], int | None],
        clock: Callable[[], float],
        cell_path: bool = True,
    ) -> tuple[Sample | None, tuple[Sequence[int] | None, list[Any]] | None]:
        """This boundary's sample if nothing but the RSS moved since the plan, and what it read.

        *now*: monotonic; *state*: the process lists' pair now; *pid*: reads this process's
        NVML PID; *cell_path* False: the sampler's thread reads after a cell, and the whole
        process lists, which a cell's path never reads, are due at ``lists_due``. Never
        raises: a reader that fails says no sample (the complete reading then meets the
        failure and keeps it). The second item: ``(indices, memory)``, the NVML memory
        readings it took of those GPUs (None when it took none), which the complete reading
        that follows a moved figure takes as its own rather than ask NVML again at once.
        """
        memory = None
        try:
            if now >= self.until or (not cell_path and now >= self.lists_due):
                return None, None
            if state is not self.state or pid() != self.pid:
                return None, None
            if bool(source.backend_initialized()) is not self.jax_up:
                return None, None
            indices = self.indices
            memory = [] if indices == () else list(source.memory(indices) or [])
            if memory != self.memory:  # the same reading objects: compared by identity first
                return None, (indices, memory)
            if self.stats is not None and jax_gpus(source.device_stats()) != self.stats:
                return None, (indices, memory)
            host = HostSample(source.host_rss_bytes(), *self.live)
            return Sample(t=clock(), gpus=self.gpus, host=host), None
        except Exception:
            return None, (None if memory is None else (self.indices, memory))
