"""What the installed jaxlib reads: its names and values, and variables read as it reads them."""

import importlib.util
from pathlib import Path

import pytest

from jax_nbmem.allocator.jaxlib import (
    ALLOCATOR,
    FRACTION,
    FRACTION_DEPRECATED,
    PREALLOCATE,
    _jaxlib_info,
    effective,
    installed_jaxlib,
)
from tests.allocator.test_modes import NEW, OLD


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
