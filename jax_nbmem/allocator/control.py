"""Apply allocator modes to this process's environment and remember what JAX started with.

The state of one kernel: which mode was requested and from where, which variables we set (so a
variable set by hand is never mistaken for ours), and — once the user's code starts JAX's backend —
the settings it started with. No IPython here: the magics module only forwards events.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from jax_nbmem.allocator.extras import EXTRA_VARIABLES, cuda_visible_devices, live_client_options
from jax_nbmem.allocator.jaxlib import (
    MANAGED_VARIABLES,
    Effective,
    JaxlibInfo,
    effective,
    installed_jaxlib,
)
from jax_nbmem.allocator.modes import AllocatorMode, mode_variables
from jax_nbmem.gpu.jaxstats import (
    GPU_PLATFORMS,
    backend_bridge,
    backend_initialized,
    initialized_platforms,
    note_limit_held,
)

__all__ = [
    "ENV_ALLOCATOR",
    "ENV_MODE_REASON",
    "AllocatorControl",
    "AllocatorReport",
    "ApplyResult",
    "BackendStart",
    "Variable",
]

_MANAGED_KEYS = tuple(os.fsencode(name) for name in MANAGED_VARIABLES)

# The mode a kernel asks for at start (a jax-nbmem kernelspec sets it); wins over the config.
ENV_ALLOCATOR = "JAX_NBMEM_ALLOCATOR"
# Why that mode, when jax_nbmem's kernel provisioner chose it at launch.
ENV_MODE_REASON = "JAX_NBMEM_MODE_REASON"


@dataclass(frozen=True)
class Variable:
    """One allocator variable as it is now; ``origin`` is ``jax_nbmem`` or ``outside``."""

    name: str
    value: str
    origin: str


@dataclass(frozen=True)
class BackendStart:
    """What JAX's backend started with, as far as we can tell.

    ``variables`` is the environment when it started; ``exact`` is False when it can only be
    bounded (the backend started before the extension loaded, or the variables were changed
    by hand, not by jax_nbmem, in the same cell that started JAX). ``seen`` says when those
    variables were read: ``"now"`` (after the backend had started) or ``"before"`` (the last
    time jax_nbmem saw the backend down: a cell's start, or its own change of them).
    """

    platforms: tuple[str, ...]
    variables: dict[str, str]
    effective: Effective
    cell: int | None
    exact: bool
    seen: str = "now"

    @property
    def without_gpu(self) -> bool:
        """Whether JAX started with platforms known and none of them a GPU (so no allocator)."""
        return bool(self.platforms) and not any(p in GPU_PLATFORMS for p in self.platforms)


@dataclass(frozen=True)
class ApplyResult:
    """What applying a mode did: ``too_late`` means nothing changed; the rest lists the changes."""

    mode: AllocatorMode
    too_late: bool
    set: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    replaced_outside: dict[str, str] = field(default_factory=dict)


def _options_dict(settings: Effective) -> dict | None:
    options = settings.options
    if options.form is None:
        return None
    return {"form": options.form, "overrides": dict(options.overrides), "error": options.error}


def _overridden_by(settings: Effective) -> str | None:
    """What made another allocator run than the one chosen (None: the chosen one runs)."""
    if settings.chosen_allocator is None:
        return None
    return f"XLA_FLAGS --xla_gpu_command_buffer_update_mode={settings.extras.update_mode}"


@dataclass(frozen=True)
class AllocatorReport:
    """Everything ``%jaxalloc`` with no argument shows."""

    requested: AllocatorMode | None
    requested_from: str | None
    variables: tuple[Variable, ...]
    pending: Effective
    backend: BackendStart | None
    backend_started: bool
    jaxlib: JaxlibInfo
    # The backend was started and then torn down by jax.extend.backend.clear_backends()
    # (jax.clear_backends() before jax 0.4.36): JAX's table of backends is empty, but the GPU
    # settings it took stay; a new mode needs a new process.
    backends_cleared: bool = False
    # The variables beyond the four that change what JAX holds (see allocator.extras), as now.
    extra_variables: tuple[Variable, ...] = ()
    # jax_cuda_visible_devices as the user's JAX holds it (None: all, or JAX not imported).
    cuda_visible_devices: tuple[int, ...] | None = None

    def _in_effect(self) -> Effective:
        return self.backend.effective if self.backend is not None else self.pending

    def to_dict(self) -> dict:
        """A JSON-friendly form."""
        backend = None
        if self.backend is not None:
            backend = {
                "platforms": list(self.backend.platforms),
                "mode": self.backend.effective.mode_name,
                "description": self.backend.effective.describe(),
                "variables": dict(self.backend.variables),
                "cell": self.backend.cell,
                "exact": self.backend.exact,
            }
        return {
            "requested": str(self.requested) if self.requested else None,
            "requested_from": self.requested_from,
            "variables": [vars(v) for v in self.variables],
            "next_start": {
                "mode": self.pending.mode_name,
                "description": self.pending.describe(),
            },
            "backend_started": self.backend_started,
            "backends_cleared": self.backends_cleared,
            "backend": backend,
            "jaxlib": self.jaxlib.version,
            "extra_variables": [vars(v) for v in self.extra_variables],
            "cuda_visible_devices": (
                list(self.cuda_visible_devices) if self.cuda_visible_devices else None
            ),
            "collective_bytes": self._in_effect().collective_bytes,
            "client_options": _options_dict(self._in_effect()),
            "allocator_overridden_by": _overridden_by(self._in_effect()),
            "fraction_variable": self.jaxlib.fraction_variable,
            "allocators": list(self.jaxlib.allocators),
        }


def _snapshot_reader(environ: MutableMapping) -> tuple[Callable[[Any], Any], tuple]:
    """How to read the managed variables of *environ* before every cell: a getter and its keys.

    os.environ's own bytes table where there is one: os.environ[name] encodes the name on
    every lookup, ten times the cost. Only compared, and decoded when JAX starts.
    """
    raw = getattr(environ, "_data", None) if environ is os.environ else None
    if isinstance(raw, dict) and os.name == "posix":
        return raw.get, _MANAGED_KEYS
    return environ.get, MANAGED_VARIABLES


class AllocatorControl:
    """The allocator mode of this process: request it, apply it, report what is in effect."""

    def __init__(
        self,
        environ: MutableMapping[str, str] | None = None,
        jaxlib: JaxlibInfo | None = None,
        *,
        probe: Callable[[], bool] | None = None,
        platforms=initialized_platforms,
    ) -> None:
        self._environ = os.environ if environ is None else environ
        # The managed variables as they are, as cheaply as possible (before every cell).
        self._get, self._keys = _snapshot_reader(self._environ)
        self._jaxlib = jaxlib
        # Whether JAX's backend is up; asked around every cell until its start is recorded.
        # Ours keeps JAX's bridge module once found: then a cell's ends read its table.
        self._probe = self._probe_and_keep if probe is None else probe
        self._bridge: Any = None
        self._platforms = platforms
        self._ours: dict[str, str] = {}
        self.requested: AllocatorMode | None = None
        self.requested_from: str | None = None
        self.backend: BackendStart | None = None
        self._at_cell_start: tuple | None = None
        self._cell: int | None = None
        if self._probe():
            # Started before we were loaded: the variables now are our best, inexact, account.
            self._record_start(self._managed(), cell=None, exact=False)

    @property
    def jaxlib(self) -> JaxlibInfo:
        """The installed jaxlib's names and values (looked up on first use)."""
        if self._jaxlib is None:
            self._jaxlib = installed_jaxlib()
        return self._jaxlib

    def backend_started(self) -> bool:
        """Whether JAX's backend has started (then no mode change can take effect here).

        Stays True after ``jax.extend.backend.clear_backends()``: the table of backends is
        empty again, but the GPU settings were taken once, and a new mode still needs a new
        process.
        """
        return self.backend is not None or self._probe()

    def _probe_and_keep(self) -> bool:
        """`backend_initialized`, keeping JAX's bridge module once found (for a cell's ends)."""
        if "jax" not in sys.modules:
            return False
        bridge = backend_bridge()
        if bridge is None:  # JAX still importing, or its internals moved: the careful question
            return backend_initialized()
        self._bridge = bridge
        return len(bridge._backends) != 0

    def _snapshot(self) -> tuple:
        return tuple(map(self._get, self._keys))

    def _managed(self) -> dict[str, str]:
        return {name: self._environ[name] for name in MANAGED_VARIABLES if name in self._environ}

    @staticmethod
    def _variables(snapshot: tuple) -> dict[str, str]:
        return {
            name: os.fsdecode(value) if isinstance(value, bytes) else value
            for name, value in zip(MANAGED_VARIABLES, snapshot, strict=True)
            if value is not None
        }

    def apply(self, mode: AllocatorMode, source: str) -> ApplyResult:
        """Request ``mode`` (from ``source``, e.g. ``%jaxalloc``) and set the variables for it.

        When the backend is already up the environment is left untouched: the result says
        ``too_late`` and the caller explains how to get the mode.
        """
        if self.backend_started():
            self.observe_cell_end(None)
            return ApplyResult(mode, too_late=True)
        changes: dict[str, str] = {}
        unset: list[str] = []
        replaced: dict[str, str] = {}
        for name, value in mode_variables(mode, self.jaxlib).items():
            current = self._environ.get(name)
            if current is not None and self._ours.get(name) != current and current != value:
                replaced[name] = current
            if value is None:
                if current is not None:
                    del self._environ[name]
                    unset.append(name)
                self._ours.pop(name, None)
            else:
                if current != value:
                    changes[name] = value
                self._environ[name] = value
                self._ours[name] = value
        self.requested, self.requested_from = mode, source
        # The backend is down (checked above) and these are the variables now: what it starts
        # with, unless something else changes them before it does.
        self._at_cell_start = self._snapshot()
        return ApplyResult(mode, False, changes, tuple(unset), replaced)

    def variables(self) -> tuple[Variable, ...]:
        """The allocator variables set now, each marked as ours or set outside jax_nbmem."""
        return tuple(
            Variable(name, value, "jax_nbmem" if self._ours.get(name) == value else "outside")
            for name, value in self._managed().items()
        )

    def observe_cell_start(self, cell: int | None) -> None:
        """Remember the variables before a cell runs, while the backend is still down.

        `apply` remembers them again after it changes them (the backend still down then), so
        a cell that sets a mode and then starts JAX is recorded with the mode it set.

        Both ends of every cell until JAX starts, so written out: once JAX's bridge is known
        they read its table of backends and the four variables with no call of their own.
        Each call costs a cell more than its instructions: the hooks run after IPython's own
        work has pushed their code and data out of the processor's caches.
        """
        if self.backend is not None:
            return
        bridge = self._bridge
        if bridge is None:
            up = self._probe()
        else:
            try:
                up = len(bridge._backends) != 0  # a table JAX replaced is the one read
            except Exception:  # JAX changed under us: the careful question
                up = backend_initialized()
        if not up:
            get, (first, second, third, fourth) = self._get, self._keys
            self._at_cell_start = (get(first), get(second), get(third), get(fourth))
            self._cell = cell

    def observe_cell_end(self, cell: int | None) -> None:
        """If the cell started the backend, record what it started with."""
        if self.backend is not None:
            return
        bridge = self._bridge
        if bridge is None:
            up = self._probe()
        else:  # as in observe_cell_start
            try:
                up = len(bridge._backends) != 0
            except Exception:
                up = backend_initialized()
        if not up:
            return
        now = self._snapshot()
        before = self._at_cell_start
        if before is None:
            self._record_start(self._variables(now), cell=cell, exact=False)
        else:
            # Unchanged since we last saw the backend down → exactly the values jaxlib read.
            self._record_start(
                self._variables(before),
                cell=self._cell if cell is None else cell,
                exact=before == now,
                seen="before",
            )

    def _record_start(
        self, variables: dict[str, str], *, cell: int | None, exact: bool, seen: str = "now"
    ) -> None:
        # The variables beyond the four are not followed cell by cell: as they are now.
        read = {**self._extra_variables(), **variables}
        started = effective(read, self.jaxlib, live_client_options(self._environ))
        self.backend = BackendStart(
            platforms=self._platforms(),
            variables=dict(variables),
            effective=started,
            cell=cell,
            exact=exact,
            seen=seen,
        )
        # cuda_async's bytes_limit is memory it holds only when it took its pool up front.
        note_limit_held(started.allocator != "cuda_async" or bool(started.pool_fraction))

    def _extra_variables(self) -> dict[str, str]:
        names = [name for name, _ in EXTRA_VARIABLES] + ["XLA_FLAGS"]
        return {name: self._environ[name] for name in names if name in self._environ}

    def pending(self) -> Effective:
        """What JAX's backend would start with now, from the variables as they are."""
        return effective(self._environ, self.jaxlib, live_client_options(self._environ))

    def report(self) -> AllocatorReport:
        """The requested mode, the variables in effect, and the backend's state."""
        running = self._probe()
        if running:
            self.observe_cell_end(None)
        return AllocatorReport(
            requested=self.requested,
            requested_from=self.requested_from,
            variables=self.variables(),
            pending=self.pending(),
            backend=self.backend,
            backend_started=running or self.backend is not None,
            jaxlib=self.jaxlib,
            backends_cleared=self.backend is not None and not running,
            extra_variables=tuple(
                Variable(name, value, "outside") for name, value in self._extra_variables().items()
            ),
            cuda_visible_devices=cuda_visible_devices(),
        )
