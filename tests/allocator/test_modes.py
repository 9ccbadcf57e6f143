"""Allocator modes: parsing, the variables each mode sets, and reading them as jaxlib does."""

import importlib.util
from pathlib import Path

import pytest

from jax_nbmem.allocator.modes import (
    ALLOCATOR,
    FRACTION,
    FRACTION_DEPRECATED,
    PREALLOCATE,
    AllocatorMode,
    JaxlibInfo,
    ModeError,
    _jaxlib_info,
    effective,
    installed_jaxlib,
    mode_variables,
    parse_mode,
)

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
        ("fraction nan", "in (0, 1]"),
        ("fraction x", "must be a number"),
        ("off extra", "unexpected arguments"),
        ("address", "not accepted by the installed jaxlib"),
    ],
)
def test_invalid_modes_name_the_valid_forms(text, why):
    with pytest.raises(ModeError) as caught:
        parse_mode(text, NEW)
    assert why in str(caught.value)
    assert "on | off | fraction F" in str(caught.value)


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


@pytest.mark.parametrize(
    ("environ", "mode_name", "preallocate"),
    [
        ({}, "on", True),
        ({PREALLOCATE: "false"}, "off", False),
        ({PREALLOCATE: "False"}, "off", False),
        ({PREALLOCATE: "0"}, "off", False),
        # jaxlib only knows those three spellings: "no" leaves preallocation on.
        ({PREALLOCATE: "no"}, "on", True),
        ({FRACTION: "0.3"}, "fraction 0.3", True),
        ({FRACTION_DEPRECATED: "0.4"}, "fraction 0.4", True),
        ({ALLOCATOR: "PLATFORM"}, "platform", True),
        ({ALLOCATOR: "cuda_async", PREALLOCATE: "false"}, "off, cuda_async", False),
    ],
)
def test_effective_reads_variables_like_jaxlib(environ, mode_name, preallocate):
    result = effective(environ, NEW)
    assert result.error is None
    assert result.mode_name == mode_name
    assert result.preallocate is preallocate


def test_effective_reports_what_jaxlib_would_refuse():
    both = effective({FRACTION: "0.3", FRACTION_DEPRECATED: "0.5"}, NEW)
    assert "both" in both.error and "invalid" in both.describe()
    assert "not one of" in effective({ALLOCATOR: "bogus"}, NEW).error
    # An old jaxlib ignores the new name: only the deprecated one counts there.
    assert effective({FRACTION: "0.3"}, OLD).fraction_set is False


def test_installed_jaxlib_is_read_from_its_own_source():
    info = installed_jaxlib()
    spec = importlib.util.find_spec("jaxlib")
    source = (Path(spec.submodule_search_locations[0]) / "xla_client.py").read_text()
    assert info.learned_from == "installed jaxlib/xla_client.py"
    assert info.fraction_variable in source
    for value in info.allocators:
        assert f"'{value}'" in source or f'"{value}"' in source
    assert {"default", "platform", "bfc", "cuda_async"} <= set(info.allocators)


def test_version_table_is_the_fallback_when_the_source_is_unreadable():
    assert "vmm" in _jaxlib_info("0.10.2", None).allocators
    assert "address" in _jaxlib_info("0.11.0", None).allocators
    assert "vmm" not in _jaxlib_info("0.6.0", None).allocators
    # Without the source, the deprecated fraction name is the one every jaxlib reads.
    assert _jaxlib_info("0.10.2", None).fraction_variable == FRACTION_DEPRECATED
    assert _jaxlib_info(None, None).version is None
