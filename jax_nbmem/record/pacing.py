"""When the sampler's thread looks for ended cells itself instead of being woken by each.

A cell's end wakes the sleeping thread for the reading that is its record's "after". The wake
is paid by that cell, not by the thread: setting the event takes its lock and a futex call,
and on a shared machine the scheduler's work (waking a thread on another core, or the woken
thread taking this one) lands in the cell. Measured on the shared 2-core machine, cells 20 ms
apart: 35 µs of a 700–950 µs trivial cell, half of what the extension cost such a cell.

So while cells come a short pause apart (not back to back: there each start reads its own
boundary), the thread polls every :data:`POLL_S` for cells that ended unread and a cell's end
wakes nobody. The first cell after a quiet spell still wakes it (that reading comes at once);
:data:`WINDOW_S` without a cell to read for, or two polls in a row that find a cell running
(cells long or back to back: a poll would only take the GIL from them), end the polling. (One
such poll is chance: a short cell that a poll happened to land on.) Either way the
record is the same: a reading taken after the cell ended and before the next one started,
by the thread or, if the next start comes first, by that start.
"""

from __future__ import annotations

__all__ = ["POLL_S", "WINDOW_S", "Pacing", "next_deadline"]

# Under half the quickest pace worth a poll (20 ms between cells): the thread reads before the
# next start. Each poll costs the thread's CPU (some 100-200 µs a poll on a loaded 2-core VM).
POLL_S = 0.010
# A pause longer than this is a person's: the next cell's end wakes the thread again.
WINDOW_S = 0.5


class Pacing:
    """Whether the sampler's thread is polling for ended cells; only that thread calls it.

    ``active``: polling (the sampler then keeps ``wake_after_at`` at infinity, so that no
    cell's end wakes the thread); ``until``: the monotonic time the polling ends without a
    cell to read for.
    """

    def __init__(self) -> None:
        self.active = False
        self.until = 0.0
        self._running_polls = 0  # polls in a row that found a cell running

    def after_pass(
        self, now: float, *, read_for_cells: bool, woken: bool, polled: bool, cell_running: bool,
        back_to_back: bool = False,
    ) -> bool | None:  # fmt: skip
        """Update after one pass of the thread's loop: True if polling began, False if it ended.

        *read_for_cells*: the pass took the reading cells waited for; *woken*: a cell's end
        (or a request) woke the thread for it; *polled*: the pass was a poll, not a tick;
        *cell_running*: a cell is running now; *back_to_back*: the latest cell started right
        after the one before (each start reads its own boundary, so a poll only takes the GIL
        from them: one such poll ends the polling, not chance as a running cell is). None: as
        it was.
        """
        if not self.active:
            if read_for_cells and woken:  # a cell that did not run back to back woke the thread
                self.active, self.until, self._running_polls = True, now + WINDOW_S, 0
                return True
            return None
        if polled:
            self._running_polls = self._running_polls + 1 if cell_running else 0
        if read_for_cells:
            self.until = now + WINDOW_S
        if self._running_polls >= 2 or now >= self.until or (polled and back_to_back):
            self.active = False
            return False
        return None

    def next_wake(self, now: float, deadline: float) -> tuple[float, bool]:
        """When the thread wakes next, and whether that wake is a poll (no tick) or the tick."""
        if self.active and now + POLL_S < deadline:
            return now + POLL_S, True
        return deadline, False


def next_deadline(previous: float, now: float, interval: float) -> float:
    """Next tick time on a fixed grid; after a stall, resume from *now* instead of bursting."""
    deadline = previous + interval
    return deadline if deadline > now - interval else now
