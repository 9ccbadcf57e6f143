"""Allocator modes: parsing them, and the variables each mode sets."""

import pytest

from jax_nbmem.allocator.jaxlib import (
    ALLOCATOR,
    FRACTION,
    FRACTION_DEPRECATED,
    PREALLOCATE,
    JaxlibInfo,
)
from jax_nbmem.allocator.modes import AllocatorMode, ModeError, mode_variables, parse_mode

# jaxlib as this module sees it: current, and from before the vmm allocator.
NEW = JaxlibInfo("0.10.2", FRACTION, ("default", "platform", "bfc", "cuda_async", "vmm"), "test")
OLD = JaxlibInfo("0.4.20", FRACTION_DEPRECATED, ("default", "platform", "bfc", "cuda_async"), "t")


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("off", AllocatorMode("off")),
        ("ON", AllocatorMode("on")),
        ("fraction 0.3", AllocatorMode("fraction", 0.3)),
        ("fraction=0.5", AllocatorMode("fraction", 0.5)),
        ("fraction 1", AllocatorMode("fraction", 1.0)),
        ("platform", AllocatorMode("platform")),
        ("cuda_async", AllocatorMode("cuda_async")),
        ("vmm", AllocatorMode("vmm")),
    ],
)
def test_valid_modes_parse(text, mode):
    assert parse_mode(text, NEW) == mode


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no mode"),
        ("bogus", "unknown mode"),
        ("fraction", "exactly one number"),
        ("fraction 0", "in (0, 1]"),
        ("fraction 1.7", "in (0, 1]"),
        ("fraction -0.2", "in (0, 1]"),
        ("fraction nan", "must be a plain number"),
        ("fraction x", "must be a plain number"),
        ("fraction ０.５", "must be a plain number"),  # fullwidth digits: float() takes them
        ("fraction inf", "must be a plain number"),
        ("fraction 1e400", "in (0, 1]"),
        ("fraction=0.5 0.5", "exactly one number"),
        ("off extra", "unexpected arguments"),
        ("address", "not accepted by the installed jaxlib"),
    ],
)
def test_invalid_modes_name_the_valid_forms(text, why):
    with pytest.raises(ModeError) as caught:
        parse_mode(text, NEW)
    assert why in str(caught.value)
    assert "valid modes: on, off, fraction F, " in str(caught.value)


def test_vmm_is_refused_by_an_old_jaxlib():
    with pytest.raises(ModeError, match="not accepted"):
        parse_mode("vmm", OLD)


def test_each_mode_speaks_for_every_variable_and_never_both_fraction_names():
    for text in ("on", "off", "fraction 0.3", "platform", "bfc"):
        values = mode_variables(parse_mode(text, NEW), NEW)
        assert set(values) == {PREALLOCATE, FRACTION, FRACTION_DEPRECATED, ALLOCATOR}
        assert values[FRACTION] is None or values[FRACTION_DEPRECATED] is None
    assert mode_variables(AllocatorMode("off"), NEW)[PREALLOCATE] == "false"
    assert mode_variables(AllocatorMode("fraction", 0.3), NEW)[FRACTION] == "0.3"
    assert mode_variables(AllocatorMode("fraction", 0.3), OLD)[FRACTION_DEPRECATED] == "0.3"
    assert mode_variables(AllocatorMode("platform"), NEW)[ALLOCATOR] == "platform"
    assert set(mode_variables(AllocatorMode("on"), NEW).values()) == {None}
