"""When the sampler walks ``jax.live_arrays()``, and what the last walk found.

Walking JAX's live arrays costs time per array, so the walk is scheduled: at most every
``live_array_interval``, less often the more it costs (never more than its budget of a core),
and at a cell's boundary only while it is cheap (a few thousand arrays). Only where JAX's
allocator keeps no counters of its own (the CPU): with a GPU's counters nothing is walked.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BOUNDARY_LIVE_COST_S", "LiveWalk"]

# Walking is part of a reading at a cell's boundary while it costs less than this; beyond,
# the value is the latest walk's, with its time.
BOUNDARY_LIVE_COST_S = 0.0005


class LiveWalk:
    """The latest walk of the live arrays, and when the next is due.

    ``bytes``: its total (None: none yet, or nothing to walk); ``at``: its ``time.time()``;
    ``cost``: what it took (s); ``due``: when the next is (monotonic).
    """

    def __init__(self) -> None:
        self.bytes: int | None = None
        self.at: float | None = None
        self.cost = 0.0  # none yet: cheap until a walk says otherwise
        self.due = -math.inf

    def forget(self) -> None:
        """Nothing to walk (JAX's allocator counts its bytes, or JAX is down)."""
        self.bytes = self.at = None

    def due_now(self, now: float, slack: float, force: bool, boundary: bool) -> bool:
        """Whether a reading at monotonic *now* walks (*force*: it must; *boundary*: a cell's)."""
        return force or now + slack >= self.due or (boundary and self.cheap)

    @property
    def cheap(self) -> bool:
        """Whether a cell's boundary walks the arrays (the last walk cost little)."""
        return self.cost < BOUNDARY_LIVE_COST_S

    def walk(
        self,
        read: Callable[[], int | None],
        now: float,
        clock: Callable[[], float],
        interval: float,
        budget: float,
    ) -> None:
        """Walk now (*read* never raises) and schedule the next by its cost."""
        began = time.perf_counter()
        self.bytes = read()
        self.at = None if self.bytes is None else clock()
        self.cost = time.perf_counter() - began
        # Read them less often the more there are: never more than the budget of a core.
        self.due = now + max(interval, self.cost / budget)

    def until(self, slack: float) -> float:
        """From when (monotonic) a boundary must walk: at once while walking is cheap."""
        return -math.inf if self.cheap else self.due - slack

    def state(self) -> tuple[Any, Any]:
        """(bytes, at): what a sample says of the live arrays."""
        return self.bytes, self.at
