"""A slow background watch over who else is on our GPUs, so warnings are ready when wanted.

Attributing processes reads /proc for each of them and may ask Jupyter servers (up to a second
when one is slow), and NVML itself may be slow: far too slow for a cell hook or the 10 Hz
sampler. This thread refreshes the status report every few seconds; readers take the last one
without waiting, or wait a bounded time for a fresh one (:meth:`StatusWatcher.fresh`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the kernel's session loads without the status code (issue 38)
    from jax_nbmem.tenants.status import StatusReport

__all__ = ["StatusWatcher"]

log = logging.getLogger("jax_nbmem")


class StatusWatcher:
    """Refresh ``collect()`` every ``interval`` seconds on a daemon thread; never raises."""

    def __init__(self, collect: Callable[[], StatusReport], interval: float = 5.0) -> None:
        self._collect = collect
        self.interval = interval
        self._latest: StatusReport | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # Guards the counters below; the thread waits on it between reports.
        self._done = threading.Condition()
        self._generation = 0  # reports finished (or failed) so far
        self._requested = 0  # the generation someone is waiting for
        self._collecting = False
        self.last_error: str | None = None

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread; a running one is reused."""
        with self._lock:
            if self.running:
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name="jax_nbmem-status", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop and join the thread; a second call is a no-op."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        with self._done:
            self._done.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def latest(self) -> StatusReport | None:
        """The last report, or None before the first one."""
        return self._latest

    def refresh(self) -> StatusReport | None:
        """Collect a report now, on the caller's thread (the watcher keeps it too)."""
        try:
            report = self._collect()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.debug("jax_nbmem: status collection failed", exc_info=True)
            report = None
        with self._done:
            if report is not None:
                self._latest = report
            self._generation += 1
            self._done.notify_all()
        return report if report is not None else self._latest

    def fresh(self, timeout: float) -> tuple[StatusReport | None, bool]:
        """A report begun after this call, waiting at most ``timeout`` s; else the latest.

        Returns ``(report, fresh)``: ``fresh`` is False when the wait ran out (NVML or a
        server is slow) and the report is the previous one, or None. Without the watch's
        thread the report is collected on a helper thread, so the wait is bounded too.
        """
        wanted = self.poke()
        if not self.running:
            threading.Thread(target=self.refresh, name="jax_nbmem-status-now", daemon=True).start()
        with self._done:
            got = self._done.wait_for(lambda: self._generation >= wanted, timeout)
            return self._latest, got

    def poke(self) -> int:
        """Ask the thread for a report begun from now on; returns the generation to wait for."""
        with self._done:
            # A collection already under way began before this call: the next one counts.
            wanted = self._generation + (2 if self._collecting else 1)
            self._requested = max(self._requested, wanted)
            self._done.notify_all()
            return wanted

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self._done:
                self._collecting = True
            try:
                self.refresh()
            finally:
                with self._done:
                    self._collecting = False
            with self._done:
                self._done.wait_for(
                    lambda: stop.is_set() or self._requested > self._generation, self.interval
                )
