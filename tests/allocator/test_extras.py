"""The settings beyond the allocator trio, read as jaxlib, JAX and XLA read them."""

import sys
import types

import pytest

from jax_nbmem.allocator.extras import (
    ASYNC_PREALLOC,
    CLIENT_OPTIONS_ENV,
    COLLECTIVE_MEM,
    USE_TFRT,
    client_options,
    cuda_visible_devices,
    live_client_options,
    read_extras,
)
from jax_nbmem.allocator.jaxlib import ALLOCATOR, PREALLOCATE, _jaxlib_info, effective

NEW = _jaxlib_info("0.10.2", None)
OLD = _jaxlib_info("0.4.26", None)


def test_collective_memory_is_counted_per_gpu_outside_the_pool():
    settings = effective({COLLECTIVE_MEM: "512"}, NEW)
    assert settings.collective_bytes == 512 << 20
    assert settings.pool_fraction == 0.75  # the pool is the same; the collective one is beside it
    # platform takes none (XLA warns), vmm builds no collective allocator.
    assert effective({COLLECTIVE_MEM: "512", ALLOCATOR: "platform"}, NEW).collective_bytes is None
    assert effective({COLLECTIVE_MEM: "512", ALLOCATOR: "vmm"}, NEW).collective_bytes is None
    assert effective({COLLECTIVE_MEM: "0"}, NEW).collective_bytes is None  # grows as needed


def test_a_value_jaxlib_cannot_int_stops_the_backend():
    assert "ValueError" in effective({COLLECTIVE_MEM: "lots"}, NEW).error
    assert "ValueError" in effective({USE_TFRT: "yes"}, NEW).error
    # jaxlib 0.4.26 does not read the TFRT variable at all (it came in 0.7.1).
    assert effective({USE_TFRT: "yes"}, OLD).error is None
    assert read_extras({USE_TFRT: "1"}, (0, 7, 1)).use_tfrt is True
    assert read_extras({USE_TFRT: "1"}, (0, 7, 0)).use_tfrt is None


def test_tf_prealloc_makes_cuda_async_take_memory_with_preallocation_off():
    whole = effective({ALLOCATOR: "cuda_async", PREALLOCATE: "false", ASYNC_PREALLOC: "-1"}, NEW)
    assert whole.pool_fraction == 0.75 and "when the backend starts" in whole.describe()
    some = effective({ALLOCATOR: "cuda_async", PREALLOCATE: "false", ASYNC_PREALLOC: "1024"}, NEW)
    assert some.pool_fraction is None and "1024 bytes" in some.describe()
    # BFC does not read it.
    assert effective({PREALLOCATE: "false", ASYNC_PREALLOC: "-1"}, NEW).pool_fraction == 0.0


def test_command_buffer_update_mode_forces_vmm_from_0_10_2():
    flags = {"XLA_FLAGS": "--xla_gpu_command_buffer_update_mode=SKIP_TEMP", ALLOCATOR: "bfc"}
    forced = effective(flags, NEW)
    assert forced.allocator == "vmm" and forced.chosen_allocator == "bfc"
    assert "forced by XLA_FLAGS" in forced.describe()
    assert effective(flags, _jaxlib_info("0.9.2", None)).allocator == "bfc"
    default = {"XLA_FLAGS": "--xla_gpu_command_buffer_update_mode=ALWAYS_UPDATE"}
    assert effective(default, NEW).allocator == "default"


@pytest.mark.parametrize(
    ("value", "error", "overrides"),
    [
        ("allocator:platform", None, {"allocator": "platform"}),
        ("preallocate:false", "wants a bool", {}),
        ("memory_fraction:0.5", "wants a float", {}),
        ("a:b:c", "not 'key:value'", {}),
        ({"preallocate": False, "memory_fraction": 0.5}, None,
         {"preallocate": False, "memory_fraction": 0.5}),
        ({"memory_fraction": 1}, "wants a float", {}),
    ],
)  # fmt: skip
def test_client_options_override_or_break_the_backend(value, error, overrides):
    read = client_options(value, (0, 10, 2))
    assert (read.error is None) == (error is None)
    if error:
        assert error in read.error
    assert read.overrides == overrides


def test_client_options_win_over_the_variables():
    settings = effective({PREALLOCATE: "false"}, NEW, {"preallocate": True, "memory_fraction": 0.3})
    assert settings.preallocate and settings.fraction == 0.3 and settings.pool_fraction == 0.3
    from_env = effective({CLIENT_OPTIONS_ENV: "allocator:platform"}, NEW)
    assert from_env.allocator == "platform"
    broken = effective({CLIENT_OPTIONS_ENV: "preallocate:false"}, NEW)
    assert broken.error and broken.pool_fraction is None
    # A dict before jax 0.6.2 is split() as a string: the backend does not start.
    assert client_options({"allocator": "bfc"}, (0, 6, 1)).error
    assert client_options("allocator:bfc", (0, 4, 28)).form is None  # no such option yet


class _State:
    """A stand-in for one of JAX's config states: only ``.value``, as JAX's has."""

    def __init__(self, value):
        self.value = value


def test_live_settings_are_read_from_an_imported_jax_only(monkeypatch):
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    assert live_client_options({CLIENT_OPTIONS_ENV: "allocator:bfc"}) == "allocator:bfc"
    assert cuda_visible_devices() is None
    # Stand-ins for jax's modules, holding what jax.config.update would have set.
    config = types.ModuleType("jax._src.config")
    config.jax_pjrt_client_create_options = _State({"preallocate": False})
    bridge = types.ModuleType("jax._src.xla_bridge")
    bridge.CUDA_VISIBLE_DEVICES = _State("0,2")
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    monkeypatch.setitem(sys.modules, "jax._src.config", config)
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", bridge)
    assert live_client_options({}) == {"preallocate": False}
    assert cuda_visible_devices() == (0, 2)
    bridge.CUDA_VISIBLE_DEVICES = _State("all")
    assert cuda_visible_devices() is None
