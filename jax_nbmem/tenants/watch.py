"""A slow background watch over who else is on our GPUs, so warnings are ready when wanted.

Attributing processes reads /proc for each of them and may ask Jupyter servers (up to a second
when one is slow): far too slow for a cell hook or the 10 Hz sampler. This thread refreshes the
status report every few seconds; readers take the last one without waiting.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

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
        self._wake = threading.Event()
        self._lock = threading.Lock()
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
            self._wake.set()
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
            return self._latest
        self._latest = report
        return report

    def poke(self) -> None:
        """Ask the thread for a fresh report soon (e.g. after a cell changed GPU memory)."""
        self._wake.set()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.refresh()
            self._wake.wait(self.interval)
            self._wake.clear()
