"""The panel's "shut down" buttons next to a kernel that blocks the GPU, with confirmation.

One row per ``blocking-preallocation`` warning: a button naming the PID and notebook; a click
asks for confirmation (Confirm / Cancel); Confirm hands over to the session, which refuses what
must be refused (other users' processes, non-kernels) and says so. Clicks arrive on the kernel's
main thread, and the panel's update thread redraws the buttons when the warnings change (a lock
keeps the two apart); nothing here raises into either.
"""

from __future__ import annotations

import html
import logging
import threading
from typing import Any

from jax_nbmem.text import printable

__all__ = ["ShutdownActions"]

log = logging.getLogger("jax_nbmem")

_ACTIONABLE = ("blocking-preallocation",)
_WRAPPING = {"flex_flow": "row wrap"}


class ShutdownActions:
    """A box of shutdown buttons, rebuilt from the session's warnings (any thread)."""

    def __init__(self, session: Any, on_change: Any = None) -> None:
        import ipywidgets as widgets

        self._widgets = widgets
        self._session = session
        self._on_change = on_change  # called after a shutdown, to re-read the warnings
        self._pids: tuple[int, ...] = ()
        self._pending: int | None = None
        # Held while the buttons change; never while calling out (a shutdown, on_change).
        self._lock = threading.RLock()
        self.result = widgets.HTML()
        self.rows = widgets.VBox()
        self.widget = widgets.VBox([self.rows, self.result])
        self.widget.add_class("jax-nbmem-actions")

    def wanted(self) -> tuple[int, ...]:
        """The PIDs the latest warnings say block the GPU (cheap: the watch's last report)."""
        try:
            warnings = self._session.warnings()
            # In another container (or only inferred): nothing here can stop it, no button.
            elsewhere = getattr(self._session, "elsewhere_pids", set)()
        except Exception:
            log.debug("jax_nbmem: warnings unavailable for the panel", exc_info=True)
            warnings, elsewhere = [], set()
        pids = {w["pid"] for w in warnings if w["kind"] in _ACTIONABLE and w["pid"]}
        return tuple(sorted(pids - elsewhere))

    def shown(self) -> tuple[int, ...]:
        """The PIDs that have a button now."""
        return self._pids

    def refresh(self) -> None:
        """Show one button per kernel the warnings say blocks the GPU (any thread)."""
        pids = self.wanted()
        with self._lock:
            if pids != self._pids:
                self._pids = pids
                if self._pending not in pids:
                    self._pending = None
                self._draw()

    def _label(self, pid: int) -> str:
        notebook = None
        try:
            report = self._session.watcher.latest()
            tenant = next((t for t in report.tenants() if t.pid == pid), None) if report else None
            notebook = (tenant.notebook_shown or tenant.notebook) if tenant is not None else None
        except Exception:
            log.debug("jax_nbmem: no tenant record for PID %s", pid, exc_info=True)
        name = f" ({printable(notebook.rsplit('/', 1)[-1])})" if notebook else ""
        return f"Shut down PID {pid}{name}"

    def _draw(self) -> None:
        """Rebuild the rows (the caller holds the lock)."""
        widgets, rows = self._widgets, []
        for pid in self._pids:
            if pid == self._pending:
                # Sized by their labels, never cut ("Confirm: shut do…" at ipywidgets' fixed
                # width); where the panel is narrower than both, Cancel wraps below.
                confirm = widgets.Button(
                    description=f"Confirm: shut down PID {pid}",
                    button_style="danger",
                    layout=widgets.Layout(width="auto"),
                )
                cancel = widgets.Button(description="Cancel", layout=widgets.Layout(width="auto"))
                confirm.on_click(lambda _, pid=pid: self._confirmed(pid))
                cancel.on_click(lambda _: self._ask(None))
                rows.append(widgets.HBox([confirm, cancel], layout=_WRAPPING))
            else:
                button = widgets.Button(
                    description=self._label(pid),
                    button_style="warning",
                    tooltip="Shut down this kernel of yours, after a confirmation",
                    layout=widgets.Layout(width="auto"),
                )
                button.on_click(lambda _, pid=pid: self._ask(pid))
                rows.append(button)
        self.rows.children = rows

    def _ask(self, pid: int | None) -> None:
        with self._lock:
            self._pending = pid
            self.result.value = ""
            self._draw()

    def _confirmed(self, pid: int) -> None:
        try:
            outcome = self._session.shutdown(pid, confirm=True)
            message, done = outcome.message, outcome.done
        except Exception as exc:  # a click must never raise into the kernel
            message, done = f"Could not shut down PID {pid}: {type(exc).__name__}: {exc}", False
        colour = "#0f5132" if done else "#842029"
        text = html.escape(printable(message))
        with self._lock:
            self.result.value = f"<span style='color:{colour}'>{text}</span>"
            self._pending = None
            if done:
                self._pids = tuple(p for p in self._pids if p != pid)
        if done:
            try:
                # The click runs on the main thread: a fresh look now, so the banner stops
                # naming a kernel that is gone without waiting for the next cell.
                self._session.watcher.refresh()
                if self._on_change is not None:
                    self._on_change()
            except Exception:
                log.debug("jax_nbmem: panel refresh after shutdown failed", exc_info=True)
        with self._lock:
            self._draw()
