"""One kernel's jax_nbmem state: allocator control now, measuring parts as they are attached.

Plain Python: the magics module builds one `KernelSession` per loaded extension and forwards
IPython's events to it. Everything here is safe to call from event callbacks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .allocator import ModeError, parse_mode
from .control import AllocatorControl, ApplyResult
from .reports import format_applied, too_late
from .settings import JaxNbMem, startup_mode

__all__ = ["KernelSession"]

log = logging.getLogger("jax_nbmem")


class KernelSession:
    """The extension's state for one IPython shell."""

    def __init__(self, settings: JaxNbMem, *, say: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.control = AllocatorControl()
        self._say = say

    def apply_startup_mode(self) -> None:
        """Apply the mode from $JAX_NBMEM_ALLOCATOR or the config, telling the user if it fails."""
        text, source = startup_mode(self.settings)
        if not text:
            return
        try:
            mode = parse_mode(text)
        except ModeError as exc:
            self._say(f"jax_nbmem: ignoring allocator mode {text!r} from {source}: {exc}")
            return
        result = self.control.apply(mode, source)
        if result.too_late:
            self._say(too_late(mode, self.control.report()))

    def request(self, text: str, source: str = "%jaxalloc") -> tuple[ApplyResult, str]:
        """Apply a mode the user typed; ModeError (environment untouched) if it is invalid."""
        mode = parse_mode(text)
        result = self.control.apply(mode, source)
        message = (
            too_late(mode, self.control.report()) if result.too_late else format_applied(result)
        )
        return result, message

    def cell_started(self, execution_count: int | None, source: str) -> None:
        """Called before every user cell."""
        self.control.observe_cell_start(execution_count)

    def cell_finished(self, success: bool, error: BaseException | None) -> None:
        """Called after every user cell, also after a syntax error."""
        self.control.observe_cell_end(None)

    def close(self) -> None:
        """Stop whatever runs in the background; the session is not used after this."""
