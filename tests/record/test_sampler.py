"""The sampler against a scripted GPU world on a fake clock, plus its real thread.

Most tests drive the sampler with ``tick()`` (what the thread does each interval) on a fake
clock, so the schedule and the numbers are exact. The thread tests wait for events, never
for a fixed time.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter, deque
from types import SimpleNamespace

import pytest

from jax_nbmem import simgpu
from jax_nbmem.record.sampler import (
    GpuSample,
    HostSample,
    Sample,
    SampleHistory,
    Sampler,
    SamplerSource,
)

GIB = 1024**3
MIB = 1024**2
OUR_PID = 4242
OTHER_PID = 5151
DRIVER_BYTES = 500 * MIB


class FakeClock:
    def __init__(self, start=100.0):
        self.now = start

    def __call__(self):
        return self.now


class GpuWorld:
    """Scripted GPUs: processes hold bytes (a number, None, or a function of the time)."""

    def __init__(self, clock, gpus=(0,)):
        self.clock = clock
        self.totals = {index: 80 * GIB for index in gpus}
        self.holders = []  # (gpu, pid, bytes or callable)
        self.jax_up = False
        self.jax_devices = []
        self.visible = None
        self.calls = Counter()
        self.broken = set()

    def hold(self, gpu, pid, amount):
        self.holders.append((gpu, pid, amount))
        return self

    def _bytes(self, amount):
        return amount(self.clock.now) if callable(amount) else amount

    def memory(self, indices):
        self.calls["memory"] += 1
        if "memory" in self.broken:
            raise RuntimeError("NVML fell over")
        result = []
        for index in indices if indices is not None else sorted(self.totals):
            held = [self._bytes(a) for g, _, a in self.holders if g == index]
            used = DRIVER_BYTES + sum(b for b in held if b is not None)
            total = self.totals[index]
            result.append(
                SimpleNamespace(
                    index=index,
                    uuid=f"GPU-{index}",
                    name="NVIDIA H200 (simulated)",
                    total_bytes=total,
                    used_bytes=used,
                    free_bytes=total - used,
                )
            )
        return result

    def processes(self, indices):
        self.calls["processes"] += 1
        wanted = set(indices) if indices is not None else set(self.totals)
        return [
            SimpleNamespace(pid=pid, gpu=gpu, used_bytes=self._bytes(amount))
            for gpu, pid, amount in self.holders
            if gpu in wanted
        ]

    def device_stats(self):
        self.calls["device_stats"] += 1
        return [d(self.clock.now) if callable(d) else d for d in self.jax_devices]

    def live_array_bytes(self):
        self.calls["live_array_bytes"] += 1
        return 3 * GIB

    def source(self):
        return SamplerSource(
            memory=self.memory,
            processes=self.processes,
            gpu_indices=lambda: self.visible,
            backend_initialized=lambda: self.jax_up,
            device_stats=self.device_stats,
            live_array_bytes=self.live_array_bytes,
            host_rss_bytes=lambda: 2 * GIB,
            pid=OUR_PID,
        )


def jax_gpu(device_id, in_use, peak=None, limit=60 * GIB):
    return SimpleNamespace(
        id=device_id,
        platform="gpu",
        bytes_in_use=in_use,
        peak_bytes_in_use=in_use if peak is None else peak,
        bytes_reserved=0,
        bytes_limit=limit,
    )


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def world(clock):
    return GpuWorld(clock)


def make_sampler(world, clock, **options):
    return Sampler(world.source(), clock=lambda: 1.7e9 + clock.now, monotonic=clock, **options)


def run_ticks(sampler, clock, seconds, interval=0.1):
    start = clock.now
    samples = []
    for step in range(int(round(seconds / interval))):
        clock.now = start + step * interval
        samples.append(sampler.tick())
    clock.now = start + seconds
    return samples


def test_memory_every_tick_process_list_once_a_second_and_faster_while_busy(world, clock):
    sampler = make_sampler(world, clock)
    run_ticks(sampler, clock, 3.0)
    assert world.calls["memory"] == 30
    assert world.calls["processes"] == 3  # at 0 s, 1 s, 2 s

    world.calls.clear()
    sampler.set_busy(True)  # a cell started
    run_ticks(sampler, clock, 3.0)
    assert world.calls["memory"] == 30
    assert world.calls["processes"] == 15  # every 0.2 s


def test_jax_is_asked_only_once_its_backend_is_up_and_live_arrays_seldom(world, clock):
    sampler = make_sampler(world, clock)
    run_ticks(sampler, clock, 1.0)
    assert world.calls["device_stats"] == 0 and world.calls["live_array_bytes"] == 0
    assert sampler.latest().host == HostSample(rss_bytes=2 * GIB, live_array_bytes=None)

    world.jax_up = True  # the user's first array started the backend, on the CPU
    world.jax_devices = [SimpleNamespace(id=0, platform="cpu", bytes_in_use=None)]
    samples = run_ticks(sampler, clock, 3.0)
    assert world.calls["device_stats"] == 30
    assert world.calls["live_array_bytes"] == 2  # at most every 1.5 s
    assert all(s.host.live_array_bytes == 3 * GIB for s in samples)


def test_live_arrays_are_not_walked_where_jax_counts_its_bytes(world, clock):
    world.jax_up = True
    world.jax_devices = [jax_gpu(0, 1 * GIB)]
    sampler = make_sampler(world, clock)
    samples = run_ticks(sampler, clock, 5.0)
    sampler.sample_now()
    assert world.calls["live_array_bytes"] == 0
    assert all(s.host.live_array_bytes is None and s.gpu(0).jax_in_use == GIB for s in samples)


def test_a_costly_live_array_walk_is_read_less_often_within_its_budget(world, clock):
    world.jax_up = True
    world.jax_devices = [SimpleNamespace(id=0, platform="cpu", bytes_in_use=None)]

    def slow_walk():  # 20 ms of real work per walk, as with some 25,000 live arrays
        world.calls["live_array_bytes"] += 1
        deadline = time.perf_counter() + 0.02
        while time.perf_counter() < deadline:
            pass
        return GIB

    world.live_array_bytes = slow_walk
    sampler = make_sampler(world, clock)  # budget: 0.5% of a core
    run_ticks(sampler, clock, 12.0)
    # 20 ms at 0.5% of a core: one walk every 4 s or more (instead of every 1.5 s).
    assert 2 <= world.calls["live_array_bytes"] <= 3


def test_a_sample_tells_our_bytes_from_everyone_elses(world, clock):
    world.hold(0, OUR_PID, 4 * GIB).hold(0, 777, 10 * GIB)
    world.jax_up = True
    world.jax_devices = [jax_gpu(0, 3 * GIB, peak=5 * GIB)]
    gpu = make_sampler(world, clock).tick().gpu(0)
    assert gpu.used_bytes == DRIVER_BYTES + 14 * GIB
    assert gpu.free_bytes == 80 * GIB - gpu.used_bytes
    assert gpu.self_bytes == 4 * GIB
    assert gpu.others_bytes == gpu.used_bytes - gpu.self_bytes  # includes the driver's share
    assert (gpu.jax_in_use, gpu.jax_peak, gpu.jax_limit) == (3 * GIB, 5 * GIB, 60 * GIB)


def test_our_bytes_are_zero_before_jax_starts_and_unknown_when_nvml_cannot_see_us(world, clock):
    world.hold(0, 777, 10 * GIB)
    sampler = make_sampler(world, clock)
    assert sampler.tick().gpu(0).self_bytes == 0  # no JAX backend: we hold nothing there

    # JAX now holds the GPU but NVML still does not list our pid (e.g. a container's
    # separate PID namespace): that is unknown, not zero.
    world.jax_up = True
    world.jax_devices = [jax_gpu(0, GIB)]
    gpu = sampler.sample_now().gpu(0)
    assert gpu.self_bytes is None
    assert gpu.others_bytes == 10 * GIB  # the listed processes still add up


def test_while_our_nvml_pid_is_unknown_our_bytes_and_the_others_are_unknown(world, clock):
    """In a container before the node agent proves its host PID (issue 46): never 0."""
    from dataclasses import replace

    pid = {"now": None}
    source = replace(world.source(), pid=lambda: pid["now"])
    sampler = Sampler(source, clock=lambda: 1.7e9 + clock.now, monotonic=clock)
    gpu = sampler.sample_now().gpu(0)
    # Nobody listed: none of the bytes are ours (the driver's count as the others', as ever).
    assert (gpu.self_bytes, gpu.others_bytes) == (0, gpu.used_bytes)
    world.hold(0, 31337, 4 * GIB).hold(0, 777, 10 * GIB)
    gpu = sampler.sample_now().gpu(0)
    assert (gpu.self_bytes, gpu.others_bytes) == (None, None)
    pid["now"] = 31337  # proven: asked at the next reading
    gpu = sampler.sample_now().gpu(0)
    assert (gpu.self_bytes, gpu.others_bytes) == (4 * GIB, gpu.used_bytes - 4 * GIB)


def test_a_process_nvml_cannot_measure_leaves_our_bytes_unknown(world, clock):
    world.hold(0, OUR_PID, None).hold(0, 777, 2 * GIB)
    gpu = make_sampler(world, clock).tick().gpu(0)
    assert gpu.self_bytes is None
    assert gpu.others_bytes == 2 * GIB


def test_jax_devices_map_onto_the_kernels_gpus_in_visible_order():
    clock = FakeClock()
    world = GpuWorld(clock, gpus=(0, 1, 2))
    world.visible = (2, 0)  # CUDA_VISIBLE_DEVICES=2,0
    world.jax_up = True
    world.jax_devices = [jax_gpu(1, 7 * GIB), jax_gpu(0, 5 * GIB)]
    sample = make_sampler(world, clock).tick()
    assert [g.index for g in sample.gpus] == [2, 0]
    assert sample.gpu(2).jax_in_use == 5 * GIB  # JAX device 0
    assert sample.gpu(0).jax_in_use == 7 * GIB  # JAX device 1
    assert sample.gpu(1) is None


def test_a_kernel_with_no_visible_gpu_samples_only_the_host(world, clock):
    world.visible = ()  # CUDA_VISIBLE_DEVICES=""
    sample = make_sampler(world, clock).tick()
    assert sample.gpus == ()
    assert sample.host.rss_bytes == 2 * GIB
    assert world.calls["memory"] == 0


def test_the_gpu_set_follows_cuda_visible_devices_until_jax_starts():
    clock = FakeClock()
    world = GpuWorld(clock, gpus=(0, 1))
    world.visible = (0,)
    sampler = make_sampler(world, clock)
    assert [g.index for g in sampler.tick().gpus] == [0]
    world.visible = (1,)  # the user edits CUDA_VISIBLE_DEVICES before touching JAX
    assert [g.index for g in sampler.sample_now().gpus] == [1]
    world.jax_up = True  # JAX starts on GPU 1 and keeps it
    world.jax_devices = [jax_gpu(0, GIB)]
    sampler.sample_now()
    world.visible = (0,)  # too late to matter for this process
    run_ticks(sampler, clock, 30.0)
    sample = sampler.sample_now()
    assert [g.index for g in sample.gpus] == [1]
    assert sample.gpu(1).jax_in_use == GIB


def test_a_source_that_breaks_its_contract_gives_an_empty_sample_not_an_error(world, clock):
    world.memory = lambda indices: [object()]  # no .index, no .used_bytes
    sampler = Sampler(world.source(), clock=clock, monotonic=clock)
    sample = sampler.sample_now()
    assert sample.gpus == ()
    assert sampler.last_error.startswith("AttributeError")


def test_failing_readings_are_remembered_and_sampling_goes_on(world, clock):
    world.broken.add("memory")
    sampler = make_sampler(world, clock)
    sample = sampler.tick()
    assert sample.gpus == () and sample.host.rss_bytes == 2 * GIB
    assert sampler.last_error == "RuntimeError: NVML fell over"
    assert sampler.last_error_at == 1.7e9 + clock.now
    assert sampler.error_count == 1
    world.broken.clear()
    assert sampler.tick().gpu(0) is not None


def test_sample_now_reads_the_process_list_fresh(world, clock):
    world.hold(0, OUR_PID, GIB)
    sampler = make_sampler(world, clock)
    sampler.tick()
    world.holders = [(0, OUR_PID, 6 * GIB)]
    clock.now += 0.1
    assert sampler.tick().gpu(0).self_bytes == GIB  # the process list is not due yet
    assert sampler.sample_now().gpu(0).self_bytes == 6 * GIB


def transient(start, length, low, high):
    return lambda t: high if start <= t < start + length else low


def test_a_300ms_spike_is_the_peak_while_busy_and_when_idle_once_used_memory_moves(clock):
    spike = transient(start=101.05, length=0.3, low=GIB, high=5 * GIB)
    busy_world = GpuWorld(clock).hold(0, OUR_PID, spike)
    busy = make_sampler(busy_world, clock)
    busy.set_busy(True)
    tracker = busy.track()
    run_ticks(busy, clock, 2.0)
    peaks = tracker.close()
    assert peaks.gpu(0).max_self_bytes == 5 * GIB

    clock.now = 100.0
    idle_world = GpuWorld(clock).hold(0, OUR_PID, spike)
    idle = make_sampler(idle_world, clock)
    tracker = idle.track()
    # Idle, the list is read once a second; but the GPU's used bytes jumped at 101.05, which
    # makes the list out of date: it is read again a busy interval later, within the spike.
    run_ticks(idle, clock, 2.0)
    assert tracker.close().gpu(0).max_self_bytes == 5 * GIB


def test_while_the_process_list_is_stale_others_are_unknown_not_this_kernels_bytes(clock):
    clock.now = 100.0
    # This kernel's pool (JAX preallocating) arrives between two reads of the process list.
    world = GpuWorld(clock).hold(0, OUR_PID, transient(100.55, 10.0, GIB, 30 * GIB))
    world.hold(0, OTHER_PID, lambda t: 2 * GIB)
    samples = run_ticks(make_sampler(world, clock), clock, 2.0)
    others = [s.gpu(0).others_bytes for s in samples]
    # Never this kernel's new bytes counted as someone else's: the move makes the list due
    # (read again at once here, the last one being older than a busy interval); at worst a gap.
    assert all(o is None or o == 2 * GIB + DRIVER_BYTES for o in others), others
    assert samples[-1].gpu(0).self_bytes == 30 * GIB
    assert samples[-1].gpu(0).others_bytes == 2 * GIB + DRIVER_BYTES


def test_a_tracker_sees_every_sample_until_closed(world, clock):
    usage = {"now": GIB}
    world.hold(0, OUR_PID, lambda t: usage["now"])
    sampler = make_sampler(world, clock)
    tracker = sampler.track()
    sampler.sample_now()
    usage["now"] = 9 * GIB
    sampler.sample_now()
    usage["now"] = 2 * GIB
    sampler.sample_now()
    peaks = tracker.close()
    assert peaks.samples == 3
    assert peaks.gpu(0).max_self_bytes == 9 * GIB
    assert peaks.gpu(0).min_free_bytes == 80 * GIB - DRIVER_BYTES - 9 * GIB
    assert peaks.max_rss_bytes == 2 * GIB
    usage["now"] = 20 * GIB
    sampler.sample_now()
    assert tracker.close() == peaks  # closed: later samples do not count


def test_rates_must_be_positive(world, clock):
    sampler = make_sampler(world, clock)
    with pytest.raises(ValueError, match="interval"):
        sampler.configure(interval=0)
    with pytest.raises(ValueError, match="process_interval"):
        Sampler(world.source(), process_interval=-1)
    sampler.configure(interval=0.5)
    assert sampler.interval == 0.5


def gpu_reading(used, free, self_bytes):
    return GpuSample(0, "GPU-0", "H200", 80 * GIB, used, free, self_bytes, used - self_bytes,
                     None, None, None, None)  # fmt: skip


def test_a_day_of_history_stays_bounded_and_keeps_its_peaks():
    history = SampleHistory(recent_s=600, bucket_s=5, max_points=20_000)
    rate = 2  # samples a second over 24 hours
    day = 24 * 3600
    spike_at, dip_at = 3 * 3600 + 0.5, 5 * 3600
    for step in range(day * rate):
        t = step / rate
        used, free = 10 * GIB, 70 * GIB
        if t == spike_at:
            used = 70 * GIB
        if t == dip_at:
            free = GIB
        history.add(Sample(t=t, gpus=(gpu_reading(used, free, 4 * GIB),), host=None))
    points = history.samples()
    assert len(points) <= 20_000
    assert [p.t for p in points] == sorted(p.t for p in points)
    assert max(p.gpus[0].used_bytes for p in points) == 70 * GIB
    assert min(p.gpus[0].free_bytes for p in points) == GIB
    recent = [p for p in points if p.span_s == 0]
    assert len(recent) == 600 * rate + 1  # the last ten minutes at full rate, both ends
    assert recent[0].t == recent[-1].t - 600
    older = [p for p in points if p.span_s > 0]
    assert older[0].t == 0  # the morning is still there, coarser
    assert history.bucket_s > 5


def test_a_tiny_history_coarsens_over_and_over_but_never_grows():
    history = SampleHistory(recent_s=10, bucket_s=1, max_points=40)
    sizes = []
    for step in range(20_000):
        used = 50 * GIB if step == 1234 else GIB
        history.add(Sample(t=float(step), gpus=(gpu_reading(used, GIB, 0),), host=None))
        sizes.append(len(history))
    assert max(sizes) <= 40
    assert max(p.gpus[0].used_bytes for p in history.samples()) == 50 * GIB


def test_samples_sharing_their_gpu_readings_fold_into_one_point_with_the_host_s_peak():
    # A cell's boundary where no GPU moved reuses the last reading's GPU samples: folded, the
    # bucket keeps them as they are, and the host's figures still merge to their maxima.
    history = SampleHistory(recent_s=1, bucket_s=10, max_points=40)
    gpus = (gpu_reading(10 * GIB, 70 * GIB, 4 * GIB),)
    for step, rss in enumerate((5, 9, 7, 3)):
        host = HostSample(rss * GIB, None if step < 2 else GIB, None)
        history.add(Sample(t=float(step), gpus=gpus, host=host))
    history.add(Sample(t=20.0, gpus=gpus, host=None))  # the four age out into one bucket
    (bucket,) = [p for p in history.samples() if p.span_s > 0]
    assert bucket.gpus is gpus
    assert bucket.host == HostSample(9 * GIB, GIB, None)


def test_the_sampler_history_holds_what_it_sampled(world, clock):
    sampler = make_sampler(world, clock, history=SampleHistory(recent_s=1, max_points=10))
    run_ticks(sampler, clock, 5.0)
    history = sampler.history()
    assert 0 < len(history) <= 10
    assert history[-1] == sampler.latest()


def test_history_since_a_time_gives_the_tail_of_the_whole_history():
    history = SampleHistory(recent_s=10, bucket_s=1, max_points=40)
    for step in range(200):  # 20 s at 10 Hz: the first ten are merged into 1 s buckets
        history.add(Sample(t=100 + step / 10, gpus=(gpu_reading(GIB, GIB, 0),), host=None))
    everything = history.samples()
    assert any(p.span_s > 0 for p in everything) and any(p.span_s == 0 for p in everything)
    for since in (90.0, 100.0, 105.5, 109.95, 110.0, 115.05, 119.9, 120.0, 500.0):
        assert history.samples(since) == [p for p in everything if p.t >= since], since
    assert history.samples(None) == everything


def test_the_sampler_gives_the_last_seconds_without_the_rest(world, clock):
    sampler = make_sampler(world, clock)
    run_ticks(sampler, clock, 30.0)
    everything = sampler.history()
    newest = sampler.latest().t
    last_ten = sampler.history(since=newest - 10)
    assert last_ten == [p for p in everything if p.t >= newest - 10]
    assert 99 <= len(last_ten) <= 101 and last_ten[-1] == sampler.latest()
    assert sampler.history(since=newest + 1) == []


# --- the real thread -------------------------------------------------------------------------


def sampler_threads():
    return [t for t in threading.enumerate() if t.name == "jax_nbmem-sampler"]


def wait_for_samples(sampler, count):
    seen = threading.Semaphore(0)
    unsubscribe = sampler.subscribe(lambda sample: seen.release())
    try:
        for _ in range(count):
            assert seen.acquire(timeout=30), "the sampler stopped producing samples"
    finally:
        unsubscribe()


def test_start_and_stop_are_idempotent_and_leave_no_thread(world):
    sampler = Sampler(world.source(), interval=0.01)
    assert not sampler.running
    sampler.start()
    sampler.start()
    assert sampler.running
    assert len(sampler_threads()) == 1
    wait_for_samples(sampler, 3)
    sampler.stop()
    sampler.stop()
    assert not sampler.running
    assert sampler_threads() == []
    sampler.start()  # and it can start again
    wait_for_samples(sampler, 2)
    sampler.stop()
    assert sampler_threads() == []


def test_a_subscriber_that_raises_does_not_stop_the_thread(world):
    sampler = Sampler(world.source(), interval=0.01)

    def broken(sample):
        raise ValueError("panel bug")

    sampler.subscribe(broken)
    sampler.start()
    try:
        wait_for_samples(sampler, 5)
        assert sampler.running
        assert sampler.callback_errors >= 4
        assert sampler.last_error == "ValueError: panel bug"
    finally:
        sampler.stop()


def test_a_subscriber_may_stop_the_sampler_from_its_own_thread(world):
    sampler = Sampler(world.source(), interval=0.01)
    stopped = threading.Event()

    def stop_after_first(sample):
        sampler.stop()
        stopped.set()

    sampler.subscribe(stop_after_first)
    sampler.start()
    assert stopped.wait(30)
    sampler.stop()  # joins the finished thread
    assert sampler_threads() == []


def test_unsubscribed_callbacks_hear_nothing_more(world, clock):
    sampler = make_sampler(world, clock)
    heard = []
    unsubscribe = sampler.subscribe(heard.append)
    sampler.tick()
    sampler.sample_now()  # synchronous samples are not broadcast
    unsubscribe()
    unsubscribe()
    sampler.tick()
    assert len(heard) == 1


def test_the_default_source_reads_the_simulated_gpu_without_importing_jax(tmp_path, simgpu_lib):
    library = simgpu_lib
    state_path = tmp_path / "gpu.state"
    code = textwrap.dedent(
        f"""
        import json, os, sys
        from jax_nbmem import simgpu
        from jax_nbmem.record.sampler import Sampler
        gib = 1024**3
        state = simgpu.SimState({str(state_path)!r}).gpu(0, total=80 * gib)
        state.process(0, os.getpid(), 3 * gib).process(0, 999999, 5 * gib).write()
        sample = Sampler().sample_now()
        gpu = sample.gpus[0]
        print(json.dumps({{"n": len(sample.gpus), "self": gpu.self_bytes,
                          "used": gpu.used_bytes, "others": gpu.others_bytes,
                          "name": gpu.name, "rss": sample.host.rss_bytes,
                          "jax": "jax" in sys.modules}}))
        """
    )
    env = simgpu.env_for_subprocess(library.parent, state_path)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["n"] == 1 and "simulated" in seen["name"]
    assert seen["self"] == 3 * GIB
    assert seen["others"] == seen["used"] - 3 * GIB
    assert seen["others"] >= 5 * GIB
    assert seen["rss"] > 0
    assert seen["jax"] is False
    assert os.path.exists(state_path)


def test_a_cell_boundary_skips_the_process_list_only_when_no_memory_moved(world, clock):
    held = {"bytes": 1 * GIB}
    world.hold(0, OUR_PID, lambda now: held["bytes"]).hold(0, OUR_PID + 1, 5 * GIB)
    sampler = make_sampler(world, clock)
    assert sampler.sample_now().gpus[0].self_bytes == 1 * GIB
    reads = world.calls["processes"]

    clock.now += 0.05  # a trivial cell: nothing moved, the list would say the same again
    assert sampler.sample_now().gpus[0].self_bytes == 1 * GIB
    assert world.calls["processes"] == reads

    held["bytes"] = 3 * GIB  # the cell allocated: the used total moved, so the list is read
    clock.now += 0.05
    assert sampler.sample_now().gpus[0].self_bytes == 3 * GIB
    assert world.calls["processes"] == reads + 1


def own_entries(world, asked):
    """A reader of this process's entries alone, as NVML's raw one: what it was asked, kept."""

    def read(indices, pid):
        asked.append(list(indices))
        return [
            SimpleNamespace(
                gpu=gpu,
                processes=tuple(
                    SimpleNamespace(pid=p, gpu=gpu, used_bytes=world._bytes(a))
                    for g, p, a in world.holders
                    if g == gpu and p == pid
                ),
            )
            for gpu in indices
        ]

    return read


def own_entries_sampler(world, clock):
    """A sampler whose boundaries read this process's own entries through ``own_entries``,
    after a first complete reading; and the list of the GPUs each such read asked for."""
    asked = []
    source = dataclasses.replace(world.source(), own_processes=own_entries(world, asked))
    sampler = Sampler(source, clock=lambda: 1.7e9 + clock.now, monotonic=clock)
    sampler.sample_now()
    return sampler, asked


def test_a_cells_boundary_reads_its_own_entries_on_the_gpus_that_moved_and_no_list(clock):
    world = GpuWorld(clock, gpus=(0, 1, 2))
    ours, theirs = {"bytes": GIB}, {"bytes": 2 * GIB}
    world.hold(1, OUR_PID, lambda now: ours["bytes"])
    world.hold(0, OTHER_PID, lambda now: theirs["bytes"])
    world.hold(2, OTHER_PID + 1, 4 * GIB)
    sampler, asked = own_entries_sampler(world, clock)
    lists = world.calls["processes"]

    ours["bytes"], theirs["bytes"] = 3 * GIB, 5 * GIB  # the cell and a neighbour allocate
    clock.now += 0.05
    _, sample = sampler.boundary_reading()
    assert world.calls["processes"] == lists  # no neighbour's list on the cell's path
    assert asked == [[0, 1]]  # GPU 2 did not move: nobody's bytes there did
    by_gpu = {g.index: g for g in sample.gpus}
    assert [by_gpu[i].self_bytes for i in (0, 1, 2)] == [0, 3 * GIB, 0]
    assert by_gpu[0].others_bytes == DRIVER_BYTES + 5 * GIB  # the used bytes less ours
    assert by_gpu[1].others_bytes == DRIVER_BYTES

    clock.now += 0.05  # nothing moved: nothing is asked again
    assert sampler.boundary_reading()[1].gpus[1].self_bytes == 3 * GIB
    assert asked == [[0, 1]]

    clock.now += 5.0  # the whole lists are due: on the thread's schedule, never at a boundary
    ours["bytes"] = 2 * GIB
    assert sampler.boundary_reading()[1].gpus[1].self_bytes == 2 * GIB
    assert world.calls["processes"] == lists and asked[-1] == [1]
    sampler.tick()
    assert world.calls["processes"] == lists + 1


def test_a_boundary_with_this_process_not_yet_known_reads_no_bytes_as_its_own(clock):
    world = GpuWorld(clock)
    held = {"bytes": GIB}
    world.hold(0, OUR_PID, lambda now: held["bytes"])
    asked = []
    source = dataclasses.replace(world.source(), pid=None, own_processes=own_entries(world, asked))
    sampler = Sampler(source, clock=lambda: 1.7e9 + clock.now, monotonic=clock)
    held["bytes"] = 2 * GIB
    _, sample = sampler.boundary_reading()
    assert asked == [] and sample.gpus[0].self_bytes is None  # unknown, never a guessed 0


def test_a_gpu_whose_process_list_failed_has_unknown_owners(world, clock):
    world.hold(0, OUR_PID, 4 * GIB).hold(0, 777, GIB)
    world.processes = lambda indices: [SimpleNamespace(gpu=0, processes=None, problem="UNKNOWN")]
    gpu = make_sampler(world, clock).tick().gpu(0)
    assert gpu.used_bytes == DRIVER_BYTES + 5 * GIB  # the memory counters still came
    assert gpu.self_bytes is None and gpu.others_bytes is None  # not 0: nobody knows


def test_per_gpu_lists_are_split_into_ours_and_theirs(world, clock):
    world.hold(0, OUR_PID, 4 * GIB)
    listed = [SimpleNamespace(pid=OUR_PID, gpu=0, used_bytes=4 * GIB)]
    listed += [SimpleNamespace(pid=1000 + i, gpu=0, used_bytes=MIB) for i in range(200)]
    world.processes = lambda indices: [SimpleNamespace(gpu=0, processes=tuple(listed))]
    gpu = make_sampler(world, clock).tick().gpu(0)
    assert gpu.self_bytes == 4 * GIB
    assert gpu.others_bytes == gpu.used_bytes - 4 * GIB


def test_nothing_a_cell_hook_calls_waits_for_a_hung_nvml(world):
    release = threading.Event()
    entered = threading.Event()
    memory = world.memory

    def hung_memory(indices):
        entered.set()
        release.wait(30)
        return memory(indices)

    world.memory = hung_memory
    sampler = Sampler(world.source(), interval=0.05)
    sampler.start()
    try:
        assert entered.wait(10), "the thread never reached NVML"
        arrived = []
        began = time.monotonic()
        sampler.latest()
        tracker = sampler.track()
        sampler.set_busy(True)
        sampler.quick_reading()
        sampler.quick_gpu_reading()
        sampler.request_after(lambda sample, started: arrived.append(sample))
        sampler.set_busy(False)
        tracker.close()
        assert time.monotonic() - began < 0.5  # while NVML hangs (it would for 30 s)
        assert arrived == []  # the after-reading waits its turn on the sampler's thread
        release.set()
        deadline = time.monotonic() + 10
        while not arrived and time.monotonic() < deadline:
            time.sleep(0.01)
        assert arrived and arrived[0].gpu(0) is not None
    finally:
        release.set()
        sampler.stop()


def test_a_cell_hook_reads_jaxs_gpu_counters_only_when_there_are_some(world, clock):
    sampler = make_sampler(world, clock)
    assert sampler.quick_gpu_reading() is None  # JAX not started
    world.jax_up = True
    world.jax_devices = [SimpleNamespace(id=0, platform="cpu", bytes_in_use=None)]
    assert sampler.quick_gpu_reading() is None  # the CPU keeps no counters
    assert sampler.quick_reading().jax == ()  # what the full reading says, at more cost
    world.jax_devices = [jax_gpu(1, 2 * GIB), jax_gpu(0, GIB)]
    reading = sampler.quick_gpu_reading()
    assert [d.id for d in reading.jax] == [0, 1] and reading.jax_in_use() == 3 * GIB
    assert reading.jax_up and (reading.t, reading.mono) == (1.7e9 + clock.now, clock.now)
    world.jax_up = False  # jax.clear_backends(): the counters are no longer JAX's now
    assert sampler.quick_gpu_reading() is None


def test_a_cell_hooks_reading_from_a_broken_source_is_none_and_said(world, clock):
    def broken():
        raise RuntimeError("backend torn down")

    world.jax_up = True
    source = dataclasses.replace(world.source(), quick_device_stats=broken)
    sampler = Sampler(source, clock=lambda: 1.7e9 + clock.now, monotonic=clock)
    assert sampler.quick_gpu_reading() is None
    assert sampler.last_error == "RuntimeError: backend torn down"


def test_cells_are_read_after_without_a_request_each_and_only_by_a_later_reading(world):
    """read_after_cells: the thread reads when cells wait, and a cell gets no earlier reading."""
    ended = []  # monotonic end times of "cells", as a ledger queues them
    delivered = []  # (started, [end times it answered])

    def deliver(sample, started):
        answered = [t for t in ended if t <= started]
        del ended[: len(answered)]
        delivered.append((started, answered, sample))

    sampler = Sampler(world.source(), interval=30.0)  # no scheduled tick gets in the way
    sampler.read_after_cells(lambda: bool(ended), deliver)
    sampler.start()
    try:
        assert sampler.serving
        deadline = time.monotonic() + 10
        while sampler.latest_sample is None and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(3):  # three cells end in quick succession: one wake is enough
            ended.append(time.monotonic())
            if ended[-1] >= sampler.wake_after_at:
                sampler.wake_for_reading()
        assert sampler.wake_after_at == float("inf")  # woken once, until the reading begins
        while not delivered and time.monotonic() < deadline:
            time.sleep(0.01)
        started, answered, sample = delivered[0]
        assert len(answered) == 3 and all(t <= started for t in answered)
        assert sample.gpu(0) is not None
        assert sampler._after_requests == deque()  # nothing was asked per cell
        # Cells came: the thread now polls for the next ones, whose end wakes nobody.
        while sampler.wake_after_at != float("inf") and time.monotonic() < deadline:
            time.sleep(0.001)
        assert sampler.wake_after_at == float("inf")
        for _ in range(3):  # cells a short pause apart, none waking the thread
            time.sleep(0.02)
            ended.append(time.monotonic())
            assert ended[-1] < sampler.wake_after_at
            while ended and time.monotonic() < deadline:
                time.sleep(0.001)
            started, answered, _ = delivered[-1]
            assert len(answered) == 1 and answered[0] <= started  # read by a poll, after it
        # A pause longer than a person's quickest: the next cell's end wakes the thread again.
        while sampler.wake_after_at == float("inf") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sampler.wake_after_at == -float("inf") and len(delivered) == 4
    finally:
        sampler.stop()
    assert not sampler.serving


def test_after_stop_a_request_is_answered_at_once_on_the_callers_thread(world, clock):
    sampler = make_sampler(world, clock, interval=30.0)
    sampler.start()
    sampler.stop()
    arrived = []
    sampler.request_after(lambda sample, started: arrived.append(threading.current_thread()))
    assert arrived == [threading.current_thread()]


def test_quick_gpus_says_when_a_cells_quick_reading_can_hold_nothing(clock):
    """JAX's own quick reading has GPU counters only where the sampler listed GPUs."""
    from jax_nbmem.gpu import jaxstats

    world = GpuWorld(clock)
    source = dataclasses.replace(world.source(), quick_device_stats=jaxstats.gpu_stats_now)
    sampler = Sampler(source, clock=lambda: 1.7e9 + clock.now, monotonic=clock)
    assert sampler.quick_gpus  # nothing known yet: asked
    sampler.tick()
    assert not sampler.quick_gpus  # JAX's backend is down
    world.jax_up, world.jax_devices = True, [SimpleNamespace(id=0, platform="cpu")]
    sampler.tick()
    assert not sampler.quick_gpus  # on the CPU
    world.jax_devices = [jax_gpu(0, GIB)]
    sampler.tick()
    assert sampler.quick_gpus
    # Another source's quick reading is always asked.
    other = make_sampler(GpuWorld(clock), clock)
    other.tick()
    assert other.quick_gpus


def test_a_boundary_where_nothing_moved_reuses_the_gpu_samples_and_reads_the_rss_anew(clock):
    world = GpuWorld(clock, gpus=(0, 1))
    ours = {"bytes": GIB}
    world.hold(0, OUR_PID, lambda now: ours["bytes"]).hold(1, OTHER_PID, 2 * GIB)
    rss = {"bytes": 2 * GIB}
    asked = []
    source = dataclasses.replace(
        world.source(), own_processes=own_entries(world, asked), host_rss_bytes=lambda: rss["bytes"]
    )
    sampler = Sampler(source, clock=lambda: 1.7e9 + clock.now, monotonic=clock)
    first = sampler.sample_now()
    stats_asked = world.calls["device_stats"]

    clock.now += 0.01
    rss["bytes"] = 3 * GIB  # the cell grew the host's memory only
    began, sample = sampler.boundary_reading()
    assert sample.gpus == first.gpus and sample.gpus[0] is first.gpus[0]  # the same samples
    assert sample.host.rss_bytes == 3 * GIB and sample.t == 1.7e9 + clock.now
    assert sampler.latest_sample is sample and sampler.latest_timed == (began, sample)
    assert asked == [] and world.calls["device_stats"] == stats_asked  # JAX is down

    ours["bytes"] = 4 * GIB  # the cell allocated: its own entries are read, never the last figure
    clock.now += 0.01
    assert sampler.boundary_reading()[1].gpus[0].self_bytes == 4 * GIB
    assert asked == [[0]]
    clock.now += 0.01  # and the boundary after that has its figure again, without a list
    assert sampler.boundary_reading()[1].gpus[0].self_bytes == 4 * GIB
    assert asked == [[0]]


def test_a_boundary_whose_figures_moved_asks_nvml_for_the_gpus_memory_once(clock):
    world = GpuWorld(clock, gpus=(0, 1))
    ours, theirs = {"bytes": GIB}, {"bytes": 2 * GIB}
    world.hold(0, OUR_PID, lambda now: ours["bytes"])
    world.hold(1, OTHER_PID, lambda now: theirs["bytes"])
    sampler, asked = own_entries_sampler(world, clock)
    before = world.calls["memory"]
    ours["bytes"], theirs["bytes"] = 3 * GIB, 5 * GIB  # the cell and a neighbour allocate
    clock.now += 0.01
    _, sample = sampler.boundary_reading()
    # The plan's look found the figures moved; the complete reading takes that look as its own.
    assert world.calls["memory"] == before + 1 and asked == [[0, 1]]
    by_gpu = {g.index: g for g in sample.gpus}
    assert by_gpu[0].self_bytes == 3 * GIB and by_gpu[0].used_bytes == DRIVER_BYTES + 3 * GIB
    assert by_gpu[1].self_bytes == 0 and by_gpu[1].others_bytes == DRIVER_BYTES + 5 * GIB
    clock.now += 0.01  # settled again: the next boundary takes the new samples as they are
    assert sampler.boundary_reading()[1].gpus == sample.gpus
    assert world.calls["memory"] == before + 2 and asked == [[0, 1]]


def test_a_boundary_reads_jaxs_counters_and_a_new_count_makes_a_new_sample(world, clock):
    world.hold(0, OUR_PID, GIB)
    world.jax_up = True
    in_use = {"bytes": 100 * MIB}
    world.jax_devices = [lambda now: jax_gpu(0, in_use["bytes"])]
    sampler = make_sampler(world, clock)
    sampler.sample_now()
    clock.now += 0.01
    assert sampler.boundary_reading()[1].gpus[0].jax_in_use == 100 * MIB
    in_use["bytes"] = 300 * MIB  # JAX's arrays grew within its pool: NVML says the same
    clock.now += 0.01
    assert sampler.boundary_reading()[1].gpus[0].jax_in_use == 300 * MIB


def test_a_boundary_where_the_split_or_the_pid_changed_takes_the_complete_reading(world, clock):
    world.hold(0, OUR_PID, GIB).hold(0, OTHER_PID, 2 * GIB)
    pid = {"now": None}  # in a container, before the node agent proves the host PID
    source = dataclasses.replace(world.source(), pid=lambda: pid["now"])
    sampler = Sampler(source, clock=lambda: 1.7e9 + clock.now, monotonic=clock)
    sampler.sample_now()
    clock.now += 0.01
    assert sampler.boundary_reading()[1].gpus[0].self_bytes is None  # unknown, not 0
    pid["now"] = OUR_PID  # proven: the next boundary is this process's own figure
    clock.now += 0.01
    assert sampler.boundary_reading()[1].gpus[0].self_bytes == GIB


def test_the_threads_reading_after_a_cell_reuses_a_plan_but_reads_whole_lists_when_due(
    world, clock
):
    world.hold(0, OUR_PID, GIB).hold(0, OTHER_PID, 2 * GIB)
    sampler = make_sampler(world, clock)
    first = sampler.sample_now()
    lists = world.calls["processes"]
    sampler.serving = True  # as the thread does: a request is queued, the thread serves it
    got = []
    sampler.request_after(lambda sample, started: got.append(sample))
    clock.now += 0.05
    assert sampler._serve_after() and got[-1].gpus[0] is first.gpus[0]
    assert world.calls["processes"] == lists  # nothing moved and nothing due
    clock.now += sampler.process_interval  # the whole lists are due on the thread's schedule
    sampler.request_after(lambda sample, started: got.append(sample))
    assert sampler._serve_after() and world.calls["processes"] == lists + 1
