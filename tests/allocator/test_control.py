"""What JAX's backend started with, as AllocatorControl records it from a kernel's cells.

A fake probe stands for "has JAX's backend started": a cell's code flips it, as
``jax.numpy.ones(1)`` would. Both kinds of environment are used: os.environ (read through its
bytes table) and a plain mapping.
"""

from __future__ import annotations

import os

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
