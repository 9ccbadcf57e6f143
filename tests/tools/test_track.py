"""`with jax_nbmem.track() as t:` in a plain script, an IPython shell, and on scripted GPUs.

The script and the shell read the simulated GPU through the real NVML stand-in; the other tests
drive a private sampler over a scripted world (tests/record/test_sampler.py), where JAX's own
counters can be set by hand (JAX runs on the CPU here, which keeps none).
"""

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

import jax_nbmem
from jax_nbmem.record.sampler import Sampler
from tests.ipython_session import clean_environ, run_cells
from tests.record.test_sampler import GIB, MIB, OUR_PID, FakeClock, GpuWorld, jax_gpu
from tests.waiting import wait_for

# The block's transient: this process's entry on the simulated GPU holds 2 GiB more for 300 ms.
TRANSIENT = textwrap.dedent(
    """
    import json, os, sys, threading, time
    import jax_nbmem
    from jax_nbmem import simgpu
    GIB = 1024**3

    def hold(nbytes):
        path = os.environ[simgpu.STATE_ENV_VAR]
        state = simgpu.SimState.read(path).remove_process(os.getpid())
        state.process(0, os.getpid(), nbytes).write()

    hold(1 * GIB)
    """
)
BLOCK = textwrap.dedent(
    """
    with jax_nbmem.track() as t:
        hold(3 * GIB)
        time.sleep(0.3)
        hold(1 * GIB)
    deadline = time.monotonic() + 30  # the reading after the block, however loaded the machine
    while any("not read yet" in n for n in t.to_dict()["notes"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    """
)


@pytest.fixture
def gpu_state(sim_state):
    sim_state.gpu(0, total=80 * GIB).write()
    return sim_state


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def test_a_plain_script_catches_a_300_ms_transient_without_ipython_or_jax(simgpu_env, gpu_state):
    script = (
        TRANSIENT
        + BLOCK
        + textwrap.dedent(
            """
        print(t)
        print(json.dumps({
            "figures": t.to_dict(),
            "line": str(t),
            "modules": [m for m in ("jax", "IPython") if m in sys.modules],
            "threads": [th.name for th in threading.enumerate()],
        }))
        """
        )
    )
    env = {**clean_environ(), **simgpu_env}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = last_json(done.stdout)
    figures = seen["figures"]
    assert figures["sampler"] == "private" and figures["samples"] >= 3
    assert figures["peak"] == {"gpu:0": 3 * GIB}
    assert figures["retained"] == {"gpu:0": 0}
    gpu = figures["devices"]["gpu:0"]
    assert gpu["peak_source"] == "nvml_sampled" and gpu["retained_source"] == "nvml"
    assert gpu["gpu_self_before"] == gpu["gpu_self_after"] == 1 * GIB
    assert gpu["jax_in_use_peak"] is None and gpu["jax_device"] is None  # not a guessed 0
    assert 0.3 <= figures["duration_s"] < 30
    assert seen["line"].startswith("track: ")
    assert "gpu:0 peak 3.00 GiB (NVML, sampled), retained 0 B" in seen["line"]
    assert seen["modules"] == []  # neither imported: a plain script stays plain
    assert "jax_nbmem-sampler" not in seen["threads"]  # the private sampler stopped


def test_in_an_ipython_shell_the_sessions_sampler_is_used_and_keeps_running(simgpu_env, gpu_state):
    outputs = run_cells(
        [
            "%load_ext jax_nbmem",
            TRANSIENT + "sampler = jax_nbmem._session().sampler",
            # Not busy for once (say a callback runs the block): it must be given back so.
            "sampler.set_busy(False)\n"
            + BLOCK
            + "print(json.dumps({'figures': t.to_dict(), 'line': str(t),"
            " 'busy': sampler.busy, 'rate': sampler.busy_process_interval}))",
            "print(json.dumps({'running': sampler.running,"
            " 'same': jax_nbmem._session().sampler is sampler, 'jax': 'jax' in sys.modules}))",
        ],
        env=simgpu_env,
    )
    for output in outputs:
        assert output.error is None, output.text
    block, after = last_json(outputs[2].stdout), last_json(outputs[3].stdout)
    figures = block["figures"]
    assert figures["sampler"] == "session"
    assert figures["peak"] == {"gpu:0": 3 * GIB} and figures["retained"] == {"gpu:0": 0}
    assert "gpu:0 peak 3.00 GiB (NVML, sampled), retained 0 B" in block["line"]
    # Given back as it was: its busy flag, its own rate, and still sampling.
    assert block["busy"] is False and block["rate"] == pytest.approx(0.2)
    assert after == {"running": True, "same": True, "jax": False}


@pytest.fixture
def world():
    world = GpuWorld(FakeClock())
    world.hold(0, OUR_PID, 4 * GIB)  # JAX's pool, as NVML sees it
    world.jax_up = True
    return world


def readings_of(*devices):
    """What the world reports of these JAX devices: a fresh copy per reading, as JAX gives."""
    return [lambda now, device=device: SimpleNamespace(**vars(device)) for device in devices]


def test_jax_peak_is_exact_when_it_rose_between_two_samples(world):
    device = jax_gpu(0, 1 * GIB, peak=1 * GIB)
    world.jax_devices = readings_of(device)
    with jax_nbmem.track(source=world.source()) as t:
        # A step that used 5 GiB and freed most of it before any sample could see it.
        device.peak_bytes_in_use = 5 * GIB
        device.bytes_in_use = 1 * GIB + 512 * MIB
    assert t.peak == {"gpu:0": 5 * GIB}
    assert t.retained == {"gpu:0": 512 * MIB}
    gpu = t.to_dict()["devices"]["gpu:0"]
    assert gpu["peak_source"] == "jax_exact" and gpu["peak_exact"] is True
    assert gpu["retained_source"] == "jax" and gpu["jax_device"] == 0
    assert gpu["jax_in_use_before"] == GIB and gpu["jax_in_use_after"] == GIB + 512 * MIB
    assert gpu["gpu_self_peak"] == 4 * GIB and gpu["gpu_self_retained"] == 0  # the pool stays
    assert "gpu:0 peak 5.00 GiB (JAX, exact), retained +512 MiB" in str(t)
    json.dumps(t.to_dict())


def test_a_peak_below_jaxs_old_record_is_sampled_and_said_so(world):
    device = jax_gpu(0, 1 * GIB, peak=8 * GIB)  # JAX's all-time peak, from earlier work
    world.jax_devices = readings_of(device)
    sampler = Sampler(world.source(), interval=0.02)
    with jax_nbmem.track(sampler=sampler) as t:
        device.bytes_in_use = 3 * GIB
        wait_for("a sample of the 3 GiB", lambda: sampler.latest().gpu(0).jax_in_use == 3 * GIB)
        device.bytes_in_use = 1 * GIB
    gpu = t.to_dict()["devices"]["gpu:0"]
    assert t.peak == {"gpu:0": 3 * GIB} and t.retained == {"gpu:0": 0}
    assert gpu["peak_source"] == "jax_sampled" and gpu["peak_exact"] is False
    assert "(JAX, sampled)" in str(t)
    assert t.to_dict()["sampler"] == "given" and not sampler.running  # started for the block


def test_devices_are_named_by_nvml_index_with_jaxs_numbering_beside(world):
    world.totals[1] = 80 * GIB
    world.visible = [1, 0]  # CUDA_VISIBLE_DEVICES=1,0: JAX's device 0 is NVML's GPU 1
    first, second = jax_gpu(0, GIB, peak=GIB), jax_gpu(1, GIB, peak=GIB)
    world.jax_devices = readings_of(first, second)
    with jax_nbmem.track(source=world.source()) as t:
        first.peak_bytes_in_use, second.peak_bytes_in_use = 6 * GIB, 3 * GIB
    assert t.peak == {"gpu:1": 6 * GIB, "gpu:0": 3 * GIB}
    devices = t.to_dict()["devices"]
    assert devices["gpu:1"]["jax_device"] == 0 and devices["gpu:0"]["jax_device"] == 1
    assert devices["gpu:1"]["gpu_self_before"] is None  # NVML lists us on GPU 0 only
    assert devices["gpu:0"]["gpu_self_before"] == 4 * GIB


def test_as_a_decorator_each_call_is_tracked_afresh(world):
    device = jax_gpu(0, GIB, peak=GIB)
    world.jax_devices = readings_of(device)

    @jax_nbmem.track(source=world.source())
    def step(extra):
        """One training step."""
        device.peak_bytes_in_use += extra
        return extra * 2

    assert step.tracker is None and step.__name__ == "step" and step.__doc__ == "One training step."
    assert step(2 * GIB) == 4 * GIB
    first = step.tracker
    step(1 * GIB)
    assert step.tracker is not first
    assert first.peak == {"gpu:0": 3 * GIB} and step.tracker.peak == {"gpu:0": 4 * GIB}


def test_an_exception_passes_through_and_the_tracker_still_closes(world):
    world.jax_devices = [jax_gpu(0, GIB)]
    sampler = Sampler(world.source(), interval=0.02)
    failure = ValueError("the step failed")
    tracker = jax_nbmem.track(sampler=sampler)
    with pytest.raises(ValueError) as raised:
        with tracker as t:
            assert sampler.running
            raise failure
    assert raised.value is failure
    assert not sampler.running
    assert t.to_dict()["error"] == "ValueError" and "raised ValueError" in str(t)
    assert t.peak == {"gpu:0": GIB}


def test_figures_wait_for_the_block_to_end_and_a_tracker_is_not_entered_twice(world):
    t = jax_nbmem.track(source=world.source())
    assert str(t) == "track: not started"
    with pytest.raises(RuntimeError, match="nothing tracked yet"):
        _ = t.peak
    with t:
        assert str(t).startswith("track: running")
        with pytest.raises(RuntimeError, match="still running"):
            t.to_dict()
        with pytest.raises(RuntimeError, match="already tracking"):
            with t:
                pass
    assert t.peak == {"gpu:0": 4 * GIB}  # the block itself ended well
    with t:  # once ended, it may track another block
        pass
    assert t.retained == {"gpu:0": 0}


def test_without_a_gpu_the_host_is_tracked_and_unknowns_stay_none():
    world = GpuWorld(FakeClock(), gpus=())
    world.jax_up = True  # on the CPU: JAX counts no bytes, its live arrays are walked
    world.jax_devices = [jax_gpu(0, None)]
    world.jax_devices[0].platform = "cpu"
    live = {"bytes": 3 * GIB}
    world.live_array_bytes = lambda: live["bytes"]
    with jax_nbmem.track(source=world.source()) as t:
        live["bytes"] = 4 * GIB
    figures = t.to_dict()
    assert t.peak == {"host": 2 * GIB} and t.retained == {"host": 0}  # the scripted RSS
    assert figures["devices"] == {}
    assert figures["host"]["live_array_bytes_before"] == 3 * GIB
    assert figures["host"]["live_array_bytes_after"] == 4 * GIB  # read at the block's end
    assert any("no GPU seen" in note for note in figures["notes"])
    assert "host peak 2.00 GiB (host RSS, sampled), retained 0 B" in str(t)
    json.dumps(figures)


class BrokenSampler:
    """A sampler whose every reading fails."""

    running = True
    busy_process_interval = 0.1

    def __getattr__(self, name):
        def broken(*args, **kwargs):
            raise OSError(f"{name}: the driver went away")

        return broken


def test_a_fault_in_reading_becomes_a_note_never_an_exception():
    with jax_nbmem.track(sampler=BrokenSampler()) as t:
        pass
    figures = t.to_dict()
    assert t.peak == {"host": None} and t.retained == {"host": None}  # unknown, not 0
    assert any("starting to track failed: OSError" in n for n in figures["notes"])
    assert any("reading after the block failed" in n for n in figures["notes"])
    assert "host peak —" in str(t)
    json.dumps(figures)
