"""Who holds what on each GPU, for the sampler: whole lists on a schedule, our own at a boundary.

NVML tells this process's bytes apart from everyone else's only in a GPU's process list. The
whole lists (every neighbour) are read on the sampler thread's schedule: once a
``process_interval``, more often while a cell runs or when some GPU's used bytes moved much. A
cell's boundary needs this process's bytes alone, so it reads only this process's own entries
(:func:`~jax_nbmem.gpu.nvml.own_process_lists`), and only on the GPUs whose used bytes moved
since they were read: where nothing moved, nobody's bytes did, ours included. Both publish one
``(split, used bytes when read)`` pair, replaced whole, so a reader never sees half of one.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from jax_nbmem.record.readings import ProcessSplit, moved_much, own_split, split_by_gpu

__all__ = ["ProcessLists"]


class ProcessLists:
    """The latest split of each GPU's process list, and when the whole lists are due.

    ``state`` is ``(split, used)``: per GPU, a :class:`ProcessSplit` and the GPU's used bytes
    when it was read (``(None, None)`` before the first reading).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state: tuple[dict[int, ProcessSplit] | None, dict[int, int | None] | None] = (
            None,
            None,
        )
        self._due = -math.inf
        self._read_at = -math.inf
        self.split_pid: int | None = None  # the PID the whole lists were last split by

    def moved(self, used: dict[int, int | None]) -> bool:
        """Whether some GPU's used bytes differ from when it was read (or are unknown)."""
        return used != self.state[1] or None in used.values()

    def due(self, used: dict[int, int | None], busy: bool, busy_interval: float) -> float:
        """When the whole lists are next due (monotonic), given the GPUs' *used* bytes now."""
        due = self._due
        if busy:  # a cell runs: the list is due a busy interval after the last one
            due = min(due, self._read_at + busy_interval)
        if moved_much(used, self.state[1]):
            # Someone's bytes changed since the list: who holds what is stale. Read it again
            # soon (no more often than while a cell runs), so a jump of this kernel's memory
            # is not drawn, for a second, as another process's.
            due = min(due, self._read_at + busy_interval)
        return due

    def take_whole(
        self, listing: Any, pid: int | None, used: dict[int, int | None], now: float,
        interval: float,
    ) -> None:  # fmt: skip
        """Publish a reading of the whole lists, taken at monotonic *now*."""
        split = split_by_gpu(listing, pid)
        with self._lock:
            self.state = (split, used)
            self.split_pid = pid
            self._read_at = now
            self._due = now + interval

    def read_own(
        self,
        reader: Callable[[Sequence[int], int], Any],
        pid: int | None,
        used: dict[int, int | None],
        on_error: Callable[[Exception], Any],
    ) -> None:
        """Read this process's own entries on the GPUs whose used bytes moved, and publish them.

        The split of the others stands until the next whole list. *pid* None (not known yet):
        nothing is read, and those GPUs' own bytes are unknown, never the last figure.
        """
        at = self.state[1] or {}
        moved = [gpu for gpu, now in used.items() if now is None or now != at.get(gpu)]
        if pid != self.split_pid:  # proven since the lists were split: every GPU's own again
            moved = list(used)
        if not moved:
            return
        listing = None
        if pid is not None:
            try:
                listing = reader(moved, pid)
            except Exception as exc:
                on_error(exc)
        mine = own_split(listing, pid, moved)
        with self._lock:
            split, at = self.state
            self.state = (
                {**(split or {}), **mine},
                {**(at or {}), **{gpu: used[gpu] for gpu in moved}},
            )
