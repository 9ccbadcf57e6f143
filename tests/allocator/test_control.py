"""What JAX's backend started with, as AllocatorControl records it from a kernel's cells.

A fake probe stands for "has JAX's backend started": a cell's code flips it, as
``jax.numpy.ones(1)`` would. Both kinds of environment are used: os.environ (read through its
bytes table) and a plain mapping.
"""

from __future__ import annotations

import os
import sys
import types

import pytest

from jax_nbmem.allocator.control import AllocatorControl
from jax_nbmem.allocator.jaxlib import ALLOCATOR, FRACTION, MANAGED_VARIABLES, PREALLOCATE


class _Jax:
    """The backend's state, as the control's probe sees it."""

    def __init__(self) -> None:
        self.up = False

    def probe(self) -> bool:
        return self.up


@pytest.fixture(params=["os.environ", "mapping"])
def environ(request, monkeypatch):
    for name in MANAGED_VARIABLES:
        # Set first, so that monkeypatch records the name and takes away at the end what a
        # test writes into os.environ itself (delenv of an absent name records nothing).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return os.environ if request.param == "os.environ" else {}


def _control(environ, jax: _Jax) -> AllocatorControl:
    return AllocatorControl(environ, probe=jax.probe, platforms=lambda: ("cuda",))


def test_the_cell_that_starts_jax_is_recorded_with_the_variables_it_began_with(environ):
    jax = _Jax()
    control = _control(environ, jax)
    environ[PREALLOCATE] = "false"
    control.observe_cell_start(1)  # a cell that does nothing with JAX
    control.observe_cell_end(1)
    environ[FRACTION] = "0.5"  # set between cells (a widget's callback, a silent run)
    control.observe_cell_start(2)
    jax.up = True  # cell 2 starts JAX
    control.observe_cell_end(2)
    start = control.backend
    assert start is not None
    assert start.variables == {PREALLOCATE: "false", FRACTION: "0.5"}
    assert (start.cell, start.exact, start.seen) == (2, True, "before")


def test_a_variable_changed_by_hand_in_the_starting_cell_makes_the_record_inexact(environ):
    jax = _Jax()
    control = _control(environ, jax)
    control.observe_cell_start(1)
    environ[ALLOCATOR] = "platform"  # by hand, in the same cell that starts JAX
    jax.up = True
    control.observe_cell_end(1)
    start = control.backend
    assert start is not None
    assert start.variables == {}  # what was there when the cell began
    assert (start.cell, start.exact) == (1, False)


def test_cells_after_the_start_change_nothing(environ):
    jax = _Jax()
    control = _control(environ, jax)
    control.observe_cell_start(1)
    jax.up = True
    control.observe_cell_end(1)
    first = control.backend
    environ[PREALLOCATE] = "false"
    control.observe_cell_start(2)
    control.observe_cell_end(2)
    assert control.backend is first


@pytest.fixture
def bridge(monkeypatch):
    """Stand-in `jax` and `jax._src.xla_bridge` modules, imported, the backend not started."""
    bridge = types.ModuleType("jax._src.xla_bridge")
    bridge._backends = {}
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", bridge)
    return bridge


def _real_control(environ) -> AllocatorControl:
    """With the control's own probe: JAX's bridge read directly around cells once found."""
    return AllocatorControl(environ, platforms=lambda: ("cuda",))


def test_jax_not_imported_is_down_and_its_bridge_is_kept_once_found(environ, bridge, monkeypatch):
    monkeypatch.delitem(sys.modules, "jax")
    control = _real_control(environ)
    environ[PREALLOCATE] = "false"
    control.observe_cell_start(1)
    control.observe_cell_end(1)
    assert control.backend is None and control._bridge is None
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))  # cell 2 imports JAX
    control.observe_cell_start(2)
    control.observe_cell_end(2)
    assert control.backend is None and control._bridge is bridge
    bridge._backends = {}  # jax.clear_backends() puts a new table in place: that one is read
    control.observe_cell_start(3)
    bridge._backends["cuda"] = object()  # cell 3 starts JAX: its table fills in place
    control.observe_cell_end(3)
    start = control.backend
    assert start is not None
    assert start.variables == {PREALLOCATE: "false"}
    assert (start.cell, start.exact, start.seen) == (3, True, "before")


def test_a_bridge_without_a_table_gets_the_careful_question(environ, bridge):
    table = bridge._backends
    del bridge._backends  # a JAX still importing
    control = _real_control(environ)
    control.observe_cell_start(1)
    control.observe_cell_end(1)
    assert control.backend is None and control._bridge is None
    bridge._backends = table  # found from the next cell on
    control.observe_cell_start(2)
    assert control._bridge is bridge
    environ[FRACTION] = "0.5"  # by hand, in the cell that starts JAX
    del bridge._backends  # and JAX's internals move under us: its public question answers
    bridge.backends_are_initialized = lambda: True
    control.observe_cell_end(2)
    start = control.backend
    assert start is not None
    assert start.variables == {}
    assert (start.cell, start.exact) == (2, False)
