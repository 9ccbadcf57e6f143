"""jaxstats against real JAX (CPU) in fresh interpreters, and against stand-in modules.

Whether the JAX backend is up is process-wide state that other tests share, so everything
that needs it *not* started (or that starts it) runs in its own Python process.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
import types

import pytest

from jax_nbmem.gpu import jaxstats


def run_python(code: str) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_session_that_never_starts_jax_is_left_alone():
    seen = run_python(
        """
        import json, sys
        from jax_nbmem.gpu import jaxstats
        before_import = [jaxstats.backend_initialized(), jaxstats.device_stats(),
                         jaxstats.live_array_bytes(), "jax" in sys.modules]
        import jax
        import jax._src.xla_bridge as xb
        after_import = [jaxstats.backend_initialized(), jaxstats.device_stats(),
                        jaxstats.live_array_bytes(), xb.backends_are_initialized()]
        print(json.dumps({"before_import": before_import, "after_import": after_import}))
        """
    )
    # Not imported: nothing to report, and asking did not import jax.
    assert seen["before_import"] == [False, [], None, False]
    # Imported but no array made yet: still nothing, and asking did not start the backend.
    assert seen["after_import"] == [False, [], None, False]


def test_once_the_user_makes_an_array_the_devices_and_live_bytes_appear():
    seen = run_python(
        """
        import dataclasses, json
        import jax.numpy as jnp
        from jax_nbmem.gpu import jaxstats
        first = jnp.ones((1000,), jnp.float32)
        up = jaxstats.backend_initialized()
        devices = [dataclasses.asdict(d) for d in jaxstats.device_stats()]
        base = jaxstats.live_array_bytes()
        big = jnp.zeros((250_000,), jnp.float32)
        with_big = jaxstats.live_array_bytes()
        del big
        after_del = jaxstats.live_array_bytes()
        print(json.dumps({"up": up, "devices": devices, "base": base,
                          "with_big": with_big, "after_del": after_del}))
        """
    )
    assert seen["up"] is True
    assert len(seen["devices"]) >= 1
    cpu = seen["devices"][0]
    assert cpu["id"] == 0 and cpu["platform"] == "cpu"
    # The CPU backend has no allocator stats: unknown, not zero.
    for name in ("bytes_in_use", "peak_bytes_in_use", "bytes_reserved", "bytes_limit"):
        assert cpu[name] is None
    assert seen["base"] >= 4000
    assert seen["with_big"] - seen["base"] == 1_000_000
    assert seen["after_del"] == seen["base"]


def test_a_real_out_of_memory_error_is_recognised_even_when_wrapped():
    seen = run_python(
        """
        import json
        import jax.numpy as jnp
        from jax_nbmem.gpu.jaxstats import is_resource_exhausted
        try:
            jnp.zeros((2**50,), jnp.uint8).block_until_ready()  # a petabyte
        except Exception as error:
            oom = error
        try:
            try:
                raise oom
            except Exception as inner:
                raise ValueError("training step failed") from inner
        except ValueError as wrapped:
            outer = wrapped
        try:
            jnp.ones(3) + jnp.ones(4)
        except Exception as error:
            shape_error = error
        print(json.dumps({
            "type": type(oom).__name__,
            "direct": is_resource_exhausted(oom),
            "wrapped": is_resource_exhausted(outer),
            "shape_error": is_resource_exhausted(shape_error),
        }))
        """
    )
    assert seen["type"] in ("JaxRuntimeError", "XlaRuntimeError")
    assert seen["direct"] is True
    assert seen["wrapped"] is True
    assert seen["shape_error"] is False


def test_errors_that_merely_mention_memory_are_not_out_of_memory():
    class JaxRuntimeError(RuntimeError):
        pass

    assert not jaxstats.is_resource_exhausted(None)
    assert not jaxstats.is_resource_exhausted(MemoryError("host is out of memory"))
    assert not jaxstats.is_resource_exhausted(JaxRuntimeError("INTERNAL: something else"))
    assert jaxstats.is_resource_exhausted(
        JaxRuntimeError("INTERNAL: while running: RESOURCE_EXHAUSTED: Out of memory")
    )
    # A library re-raising XLA's status text as its own type keeps the status prefix.
    assert jaxstats.is_resource_exhausted(RuntimeError("RESOURCE_EXHAUSTED: Out of memory"))


def test_an_exception_chain_with_a_cycle_does_not_hang():
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__context__, second.__context__ = second, first
    assert not jaxstats.is_resource_exhausted(first)


class FakeDevice:
    def __init__(self, device_id, stats, platform="gpu"):
        self.id = device_id
        self.platform = platform
        self.device_kind = "NVIDIA H200"
        self._stats = stats

    def memory_stats(self):
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats


@pytest.fixture
def fake_jax(monkeypatch):
    """Stand-in `jax` and `jax._src.xla_bridge` modules with a started GPU backend."""
    bridge = types.ModuleType("jax._src.xla_bridge")
    bridge._backend_lock = threading.Lock()
    bridge._backends = {"cuda": object()}
    jax = types.ModuleType("jax")
    jax.devices_listed = []
    jax.local_devices = lambda: list(jax.devices_listed)
    jax.live_arrays = lambda: []
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "jax._src.xla_bridge", bridge)
    return jax, bridge


def test_gpu_allocator_stats_are_read_per_device_in_id_order(fake_jax):
    jax, _ = fake_jax
    gib = 1024**3
    jax.devices_listed = [
        FakeDevice(1, {"bytes_in_use": 2 * gib, "peak_bytes_in_use": 3 * gib}),
        FakeDevice(
            0,
            {
                "bytes_in_use": gib,
                "peak_bytes_in_use": 5 * gib,
                "bytes_reserved": 0,
                "bytes_limit": 60 * gib,
                "largest_free_block_bytes": 59 * gib,
            },
        ),
    ]
    first, second = jaxstats.device_stats()
    assert (first.id, first.platform, first.kind) == (0, "gpu", "NVIDIA H200")
    assert (first.bytes_in_use, first.peak_bytes_in_use, first.bytes_limit) == (
        gib,
        5 * gib,
        60 * gib,
    )
    assert first.bytes_reserved == 0  # a reported zero stays zero
    assert second.id == 1 and second.bytes_limit is None  # not reported: unknown


def test_a_device_whose_stats_fail_is_listed_with_unknowns(fake_jax):
    jax, _ = fake_jax
    jax.devices_listed = [FakeDevice(0, RuntimeError("driver went away"))]
    (only,) = jaxstats.device_stats()
    assert only.id == 0 and only.bytes_in_use is None and only.peak_bytes_in_use is None


def test_unreadable_devices_and_arrays_give_empty_answers(fake_jax):
    jax, _ = fake_jax

    def broken():
        raise RuntimeError("backend torn down")

    jax.local_devices = broken
    jax.live_arrays = broken
    assert jaxstats.device_stats() == []
    assert jaxstats.live_array_bytes() is None


def test_live_arrays_deleted_while_counting_are_skipped(fake_jax):
    jax, _ = fake_jax

    class Deleted:
        @property
        def nbytes(self):
            raise RuntimeError("Array has been deleted")

    jax.live_arrays = lambda: [types.SimpleNamespace(nbytes=100), Deleted()]
    assert jaxstats.live_array_bytes() == 100


def test_a_held_backend_lock_neither_blocks_nor_changes_the_answer(fake_jax):
    jax, bridge = fake_jax
    jax.devices_listed = [FakeDevice(0, {"bytes_in_use": 7})]
    assert [d.bytes_in_use for d in jaxstats.device_stats()] == [7]  # lists and keeps them
    held, release = threading.Event(), threading.Event()

    def hold():  # as the sampler inside jax.local_devices(), or a backend starting up
        with bridge._backend_lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        # Answered at once, and right: the table of backends is filled.
        assert jaxstats.backend_initialized()
        assert [d.bytes_in_use for d in jaxstats.device_stats(may_wait=False)] == [7]
    finally:
        release.set()
        holder.join()
    bridge._backends.clear()
    assert not jaxstats.backend_initialized()


def test_a_hook_does_not_list_devices_itself_and_new_backends_are_listed_anew(fake_jax):
    jax, bridge = fake_jax
    jax.devices_listed = [FakeDevice(0, {"bytes_in_use": 1})]
    assert jaxstats.device_stats(may_wait=False) == []  # not listed yet: nothing, no wait
    assert [d.bytes_in_use for d in jaxstats.device_stats()] == [1]
    bridge._backends = {"cuda": object()}  # jax.clear_backends() and a new start
    jax.devices_listed = [FakeDevice(0, {"bytes_in_use": 2}), FakeDevice(1, {})]
    assert jaxstats.device_stats(may_wait=False) == []
    assert [d.bytes_in_use for d in jaxstats.device_stats()] == [2, None]


def test_a_jax_whose_internals_moved_counts_as_not_started(fake_jax, monkeypatch):
    jax, bridge = fake_jax
    del bridge._backend_lock
    del bridge._backends
    assert not jaxstats.backend_initialized()  # no public fallback either
    bridge.backends_are_initialized = lambda: True
    assert jaxstats.backend_initialized()
    monkeypatch.delitem(sys.modules, "jax._src.xla_bridge")
    assert not jaxstats.backend_initialized()
    assert jaxstats.device_stats() == []


def test_host_rss_grows_when_this_process_touches_memory():
    before = jaxstats.host_rss_bytes()
    block = b"\x01" * (64 * 1024**2)
    after = jaxstats.host_rss_bytes()
    assert before is not None and before > 0
    assert after - before >= 48 * 1024**2
    del block


def test_a_hooks_reading_is_empty_on_the_cpu_and_follows_a_new_backend(fake_jax):
    jax, bridge = fake_jax
    jax.devices_listed = [FakeDevice(0, {}, platform="cpu")]
    assert jaxstats.gpu_stats_now() == []  # not listed yet
    assert len(jaxstats.device_stats()) == 1  # the sampler's thread lists them
    assert jaxstats.gpu_stats_now() == []  # the CPU keeps no counters
    bridge._backends = {"cuda": object()}  # jax.clear_backends() and a start on the GPU
    jax.devices_listed = [FakeDevice(0, {"bytes_in_use": 5})]
    assert jaxstats.gpu_stats_now() == []  # listed by the sampler's thread first
    jaxstats.device_stats()
    assert [d.bytes_in_use for d in jaxstats.gpu_stats_now()] == [5]
    bridge._backends.clear()
    assert jaxstats.gpu_stats_now() == []


def test_the_bridge_is_found_only_with_jax_imported_and_a_table(fake_jax, monkeypatch):
    jax, bridge = fake_jax
    assert jaxstats.backend_bridge() is bridge
    table = bridge._backends
    del bridge._backends  # a JAX still importing, or internals that moved
    assert jaxstats.backend_bridge() is None
    bridge._backends = table
    monkeypatch.delitem(sys.modules, "jax")
    assert jaxstats.backend_bridge() is None


def test_the_host_rss_is_read_from_statm_holding_the_gil_as_os_pread_reads_it():
    assert jaxstats._pread is not None  # the C library's pread, on Linux
    ours = jaxstats._read_statm(jaxstats._statm_fd()).split()
    theirs = os.pread(jaxstats._statm_fd(), 128, 0).split()
    assert len(ours) == len(theirs) == 7
    assert [ours[i] for i in (3, 4, 6)] == [theirs[i] for i in (3, 4, 6)]  # text, lib, dt
    resident = int(ours[1]) * jaxstats._PAGE_SIZE
    assert 0.5 * resident <= jaxstats.host_rss_bytes() <= 2 * resident


def test_unchanged_counters_give_the_same_stats_object_and_new_ones_a_new_object():
    counters = {"bytes_in_use": 10, "peak_bytes_in_use": 20, "bytes_limit": 100}

    class Device:
        id, platform, device_kind = 0, "gpu", "H200"

        def memory_stats(self):
            return counters  # the same dict, changed in place: never mistaken for unchanged

    device = Device()
    first = jaxstats._stats_of(device)
    assert jaxstats._stats_of(device) is first
    counters["bytes_in_use"] = 30
    second = jaxstats._stats_of(device)
    assert second is not first and second.bytes_in_use == 30
