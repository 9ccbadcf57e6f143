"""What must happen however the kernel's process ends, wherever Python still runs.

A clean exit (a ``shutdown_request``, ``exit``, the end of the interpreter) runs ``atexit``.
ipykernel's parent poller does not: when the kernel's parent (its Jupyter server) goes away,
the poller's thread ends the process with ``os._exit(1)``, which skips ``atexit``. That thread
looks ``os`` up in its module's globals each time round its loop, so the module's ``os`` is
replaced by a stand-in that delegates everything to ``os`` and whose ``_exit`` first runs what
was registered here. Nothing else's ``os`` changes, and ipykernel is never imported here: where
it is not loaded (terminal IPython) there is no poller to hook.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

__all__ = ["at_hard_exit", "forget_hard_exit"]

log = logging.getLogger("jax_nbmem")

# The modules whose os._exit ends a kernel without atexit: ipykernel's parent pollers (the
# Unix one, and the Windows one's handle watch).
_POLLER_MODULES = ("ipykernel.parentpoller",)

_callbacks: list[Callable[[], None]] = []
_lock = threading.Lock()


class _OsThatCleansUp:
    """``os`` for one module: everything delegated, ``_exit`` runs the callbacks first."""

    def __init__(self, real) -> None:
        self._real = real

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def _exit(self, code: int) -> None:
        try:
            _run_callbacks()
        finally:
            self._real._exit(code)


def _run_callbacks() -> None:
    with _lock:
        pending = list(reversed(_callbacks))  # last registered first, as atexit
        _callbacks.clear()
    for callback in pending:
        try:
            callback()
        except BaseException:  # the process ends in any case: the others must still run
            try:
                log.debug("jax_nbmem: exit callback %r failed", callback, exc_info=True)
            except BaseException:
                pass


def _hook_pollers() -> None:
    for name in _POLLER_MODULES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "os", None) is os:
            module.os = _OsThatCleansUp(os)


def at_hard_exit(callback: Callable[[], None]) -> None:
    """Call ``callback()`` (once, never raising) if the kernel's parent poller ends the process.

    For what ``atexit`` would do but cannot there. It runs on the poller's thread, with the
    rest of the process still running: it must be quick and must not wait for other threads.
    Registering a callback twice registers it once.
    """
    _hook_pollers()
    with _lock:
        if callback not in _callbacks:
            _callbacks.append(callback)


def forget_hard_exit(callback: Callable[[], None]) -> None:
    """Stop calling ``callback`` at a hard exit; one never registered is ignored."""
    with _lock:
        if callback in _callbacks:
            _callbacks.remove(callback)
