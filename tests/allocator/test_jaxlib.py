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
    assert "vmm" not in _jaxlib_info("0.9.2", None).allocators
    # The new fraction name from 0.4.32 on (yanked, but installable), beside the deprecated one;
    # before, only that one.
    assert _jaxlib_info("0.10.2", None).fraction_variables == (FRACTION, FRACTION_DEPRECATED)
    assert _jaxlib_info("0.4.32", None).fraction_variable == FRACTION
    assert _jaxlib_info("0.4.32", None).refuses_both_fractions
    assert _jaxlib_info("0.4.31", None).fraction_variables == (FRACTION_DEPRECATED,)
    assert _jaxlib_info("0.4.26", None).learned_from == "version table for 0.4.26"
    assert _jaxlib_info(None, None).version is None


# Minimal generate_pjrt_gpu_plugin_options in each shape jaxlib has written it (written for
# these tests after jaxlib's own, reduced to the lines that matter).
UP_TO_0_4_31 = """
def generate_pjrt_gpu_plugin_options():
  options = {}
  allocator = os.getenv('XLA_PYTHON_CLIENT_ALLOCATOR', 'default').lower()
  memory_fraction = os.getenv('XLA_PYTHON_CLIENT_MEM_FRACTION', '')
  preallocate = os.getenv('XLA_PYTHON_CLIENT_PREALLOCATE', '')
  if allocator not in ('default', 'platform', 'bfc', 'cuda_async'):
    raise ValueError('bad allocator')
  return options
"""
FROM_0_4_33 = """
def generate_pjrt_gpu_plugin_options():
  allocator = os.getenv('XLA_PYTHON_CLIENT_ALLOCATOR', 'default').lower()
  memory_fraction = os.getenv('XLA_CLIENT_MEM_FRACTION', '')
  deprecated_memory_fraction = os.getenv('XLA_PYTHON_CLIENT_MEM_FRACTION', '')
  if deprecated_memory_fraction:
    if memory_fraction:
      raise ValueError('both')
    memory_fraction = deprecated_memory_fraction
  if allocator not in ('default', 'platform', 'bfc', 'cuda_async', 'vmm'):
    raise ValueError('bad allocator')
"""
FROM_0_11 = """
def generate_pjrt_gpu_plugin_options():
  allocator = os.getenv('XLA_PYTHON_CLIENT_ALLOCATOR', 'default').lower()
  memory_fraction = os.getenv('XLA_CLIENT_MEM_FRACTION', '')
  deprecated_memory_fraction = os.getenv('XLA_PYTHON_CLIENT_MEM_FRACTION', '')
  allowed_allocators = (
      'default',
      'platform',
      'bfc',
      'cuda_async',
      'vmm',
      'address',
  )
  if allocator not in allowed_allocators:
    raise ValueError('must be one of %s' % ', '.join(allowed_allocators))
"""


BASE = ("default", "platform", "bfc", "cuda_async")
BOTH = (FRACTION, FRACTION_DEPRECATED)


@pytest.mark.parametrize(
    ("version", "source", "fractions", "allocators"),
    [
        ("0.4.26", UP_TO_0_4_31, (FRACTION_DEPRECATED,), BASE),
        ("0.10.2", FROM_0_4_33, BOTH, (*BASE, "vmm")),
        ("0.11.0", FROM_0_11, BOTH, (*BASE, "vmm", "address")),
    ],
)
def test_each_shape_of_xla_client_is_read_from_the_source(version, source, fractions, allocators):
    info = _jaxlib_info(version, source)
    assert info.learned_from == "installed jaxlib/xla_client.py"
    assert info.fraction_variables == fractions and info.fraction_variable == fractions[0]
    assert info.allocators == allocators


def test_the_fraction_names_are_read_even_where_the_allocator_test_is_not_found():
    moved = FROM_0_11.replace("allocator not in allowed_allocators", "not ok(allocator)")
    info = _jaxlib_info("0.12.0", moved)
    assert info.fraction_variables == (FRACTION, FRACTION_DEPRECATED)
    assert "address" in info.allocators  # from the version table
    assert info.learned_from.startswith("fraction names from the installed jaxlib")


def test_jaxlib_0_11_takes_a_hand_set_new_fraction_and_refuses_both():
    info = _jaxlib_info("0.11.0", FROM_0_11)
    assert effective({FRACTION: "0.4"}, info).fraction == 0.4
    assert effective({FRACTION: "0.4"}, info).mode_name == "fraction 0.4"
    both = effective({FRACTION: "0.4", FRACTION_DEPRECATED: "0.5"}, info)
    assert both.error and "ValueError" in both.error
    assert effective({ALLOCATOR: "address"}, info).error is None
    old = _jaxlib_info("0.4.26", UP_TO_0_4_31)
    assert effective({FRACTION: "0.4", FRACTION_DEPRECATED: "0.5"}, old).fraction == 0.5


@pytest.mark.parametrize(
    ("environ", "pool", "capped", "says"),
    [
        ({}, 0.75, True, "preallocates 75% of GPU memory at the first allocation"),
        ({PREALLOCATE: "false"}, 0.0, True, "grows on demand up to 75%"),
        ({FRACTION: "0.3"}, 0.3, True, "retries at 0.9x steps"),
        ({ALLOCATOR: "cuda_async"}, 0.75, False, "when the backend starts"),
        ({ALLOCATOR: "cuda_async", PREALLOCATE: "false"}, 0.0, False, "takes nothing up front"),
        # A DeviceAddressAllocator: the fraction caps it, memory_stats() gives nothing.
        ({ALLOCATOR: "vmm"}, 0.0, True, "memory_stats() reports nothing"),
        ({ALLOCATOR: "platform"}, 0.0, False, "no pool"),
    ],
)
def test_each_allocator_is_described_as_xla_runs_it(environ, pool, capped, says):
    settings = effective(environ, NEW)
    assert settings.pool_fraction == pool
    assert settings.capped is capped
    assert says in settings.describe()
    assert "up to" not in settings.describe() or settings.allocator in ("default", "bfc", "vmm")


def test_address_is_a_passthrough_without_a_pool():
    info = _jaxlib_info("0.11.0", FROM_0_11)
    settings = effective({ALLOCATOR: "address"}, info)
    assert settings.pool_fraction == 0.0 and settings.capped is False
    assert "synchronous passthrough" in settings.describe()
    assert "bypassing BFC" in settings.describe()
