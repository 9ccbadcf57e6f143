"""Per-cell records, driven the way the magics' pre/post_run_cell callbacks drive them."""

import json
import re

import pytest

from jax_nbmem.record.ledger import CellRecord, Ledger, format_table
from jax_nbmem.record.sampler import Sampler
from tests.record.test_sampler import DRIVER_BYTES, GIB, MIB, OUR_PID, FakeClock, GpuWorld, jax_gpu
from tests.waiting import wait_for


class Notebook:
    """A kernel session: a scripted GPU, a sampler on a fake clock, and the ledger."""

    def __init__(self, gpus=(0,), **ledger_options):
        self.clock = FakeClock(start=1000.0)
        self.world = GpuWorld(self.clock, gpus=gpus)
        self.sampler = Sampler(
            self.world.source(), clock=self.wall, monotonic=self.clock, interval=0.1
        )
        self.ledger = Ledger(self.sampler, clock=self.wall, monotonic=self.clock, **ledger_options)
        self.count = 0

    def wall(self):
        return 1.7e9 + self.clock.now

    def run_cell(self, source, seconds=1.0, error=None):
        """Run one cell: pre_run_cell, the sampler ticking while it runs, post_run_cell."""
        self.count += 1
        self.ledger.cell_started(self.count, source)
        start = self.clock.now
        for step in range(1, int(round(seconds / 0.1))):
            self.clock.now = start + step * 0.1
            self.sampler.tick()
        self.clock.now = start + seconds
        self.ledger.cell_finished(error is None, error)
        self.clock.now += 0.5  # the user reads the output
        return self.ledger.last()


def spike(start, length, low, high):
    return lambda t: high if start <= t < start + length else low


def test_a_short_spike_inside_a_cell_is_its_peak_while_it_retains_nothing():
    nb = Notebook()
    # JAX's all-time peak (8 GiB, from earlier work) stays above this cell's spike.
    nb.world.jax_up = True
    nb.world.hold(0, OUR_PID, spike(1000.45, 0.3, GIB, 5 * GIB))
    nb.world.jax_devices = [lambda t: jax_gpu(0, spike(1000.45, 0.3, GIB, 5 * GIB)(t), 8 * GIB)]

    record = nb.run_cell("\n\n   loss = train_step(params)   \nprint(loss)\n")

    assert record.execution_count == 1
    assert record.first_line == "loss = train_step(params)"
    assert record.duration_s == pytest.approx(1.0)
    assert record.started_at == pytest.approx(1.7e9 + 1000.0)
    assert record.success is True and record.error is None and record.oom is False
    assert record.gpu_count == 1
    assert record.gpu_self_before == record.gpu_self_after == GIB
    assert record.gpu_self_peak == 5 * GIB
    assert record.gpu_self_retained == 0
    assert record.jax_in_use_before == record.jax_in_use_after == GIB
    assert record.jax_in_use_peak == 5 * GIB  # sampled: JAX's own peak did not move
    assert record.peak_exact is False
    assert record.free_at_start == 80 * GIB - DRIVER_BYTES - GIB
    assert record.free_min == 80 * GIB - DRIVER_BYTES - 5 * GIB


def test_when_jaxs_own_peak_rises_during_a_cell_the_peak_is_exact():
    nb = Notebook()
    nb.world.jax_up = True
    nb.world.hold(0, OUR_PID, 14 * GIB)
    # A 12 GiB temporary lives between two samples: the samples never see it, JAX's peak does.
    nb.world.jax_devices = [lambda t: jax_gpu(0, 2 * GIB, 2 * GIB if t < 1000.5 else 12 * GIB)]
    record = nb.run_cell("y = big_intermediate(x).sum()")
    assert record.jax_in_use_peak == 12 * GIB
    assert record.peak_exact is True
    assert record.jax_retained == 0


def test_the_cell_that_starts_jax_has_an_exact_peak_but_no_before():
    nb = Notebook()
    nb.world.hold(0, OUR_PID, lambda t: 0 if not nb.world.jax_up else 61 * GIB)
    nb.ledger.cell_started(1, "import jax.numpy as jnp; x = jnp.ones(10)")
    nb.world.jax_up = True  # the backend came up inside the cell (and preallocated)
    nb.world.jax_devices = [jax_gpu(0, 40, 3 * MIB)]
    nb.clock.now += 2.0
    nb.ledger.cell_finished(True, None)
    record = nb.ledger.last()
    assert record.jax_in_use_before is None  # JAX could not be asked: unknown
    assert record.jax_in_use_after == 40
    assert record.jax_retained is None
    assert (record.jax_in_use_peak, record.peak_exact) == (3 * MIB, True)
    assert (record.gpu_self_before, record.gpu_self_after) == (0, 61 * GIB)
    assert record.gpu_self_retained == 61 * GIB


def test_post_run_cell_without_pre_run_cell_is_harmless():
    nb = Notebook()
    nb.ledger.cell_finished(True, None)
    nb.ledger.cell_finished(False, ValueError("x"))
    assert nb.ledger.records() == []
    assert nb.ledger.last_error is None
    assert nb.world.calls["memory"] == 0


class SpySampler:
    """Passes calls to a real sampler and notes what the ledger opened and closed."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.busy_set = []  # what the ledger set the busy flag to, in order
        self.open_trackers = 0

    def __getattr__(self, name):  # everything else goes straight to the sampler
        return getattr(self.sampler, name)

    @property
    def busy(self):
        return self.sampler.busy

    @busy.setter
    def busy(self, busy):
        self.busy_set.append(busy)
        self.sampler.busy = busy

    def set_busy(self, busy):
        self.busy = busy

    def sample_now(self):
        return self.sampler.sample_now()

    def track(self):
        spy, tracker = self, self.sampler.track()
        spy.open_trackers += 1

        class Closing:
            def close(self):
                spy.open_trackers -= 1
                return tracker.close()

        return Closing()


def test_a_syntax_error_still_closes_what_the_cell_opened():
    nb = Notebook()
    spy = SpySampler(nb.sampler)
    ledger = Ledger(spy, clock=nb.wall, monotonic=nb.clock)
    ledger.cell_started(7, "def broken(:")
    ledger.cell_finished(False, SyntaxError("invalid syntax"))
    (record,) = ledger.records()
    assert (record.success, record.error, record.oom) == (False, "SyntaxError", False)
    assert spy.busy_set == [True, False]
    assert spy.open_trackers == 0


def test_a_cell_whose_end_never_came_is_kept_as_unfinished():
    nb = Notebook()
    spy = SpySampler(nb.sampler)
    ledger = Ledger(spy, clock=nb.wall, monotonic=nb.clock)
    ledger.cell_started(1, "a = 1")
    ledger.cell_started(2, "b = 2")
    ledger.cell_finished(True, None)
    first, second = ledger.records()
    assert (first.execution_count, first.success) == (1, None)
    assert (second.execution_count, second.success) == (2, True)
    assert spy.open_trackers == 0
    assert spy.busy_set[-1] is False


class JaxRuntimeError(RuntimeError):
    pass


def test_an_out_of_memory_cell_is_marked_oom():
    nb = Notebook()
    nb.world.jax_up = True
    nb.world.jax_devices = [jax_gpu(0, GIB)]
    error = JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 90 GiB.")
    record = nb.run_cell("x = jnp.zeros((90, 2**30), jnp.uint8)", error=error)
    assert (record.success, record.error, record.oom) == (False, "JaxRuntimeError", True)
    assert "OOM" in format_table([record])


class BrokenSampler:
    def __getattr__(self, name):
        def fail(*args):
            raise RuntimeError(f"{name} failed")

        return fail


def test_a_broken_sampler_costs_the_numbers_not_the_cell():
    clock = FakeClock()
    ledger = Ledger(BrokenSampler(), clock=clock, monotonic=clock)
    ledger.cell_started(3, "x = 1")
    clock.now += 0.25
    ledger.cell_finished(True, None)
    (record,) = ledger.records()
    assert record.duration_s == pytest.approx(0.25)
    assert record.gpu_count == 0 and record.gpu_self_peak is None and record.host_rss_peak is None
    assert ledger.last_error.startswith("RuntimeError:")


def test_without_a_sampler_the_ledger_keeps_timings_and_outcomes():
    ledger = Ledger(None)
    ledger.cell_started(1, "")
    ledger.cell_finished(True)
    (record,) = ledger.records()
    assert record.first_line == "" and record.success is True
    assert record.gpu_self_before is None and record.host_rss_before is None


def test_without_a_gpu_the_host_fields_say_what_happened():
    nb = Notebook()
    nb.world.visible = ()  # CUDA_VISIBLE_DEVICES="": CPU-only kernel
    nb.world.jax_up = True
    record = nb.run_cell("x = np.ones(10**8)")
    assert record.gpu_count == 0
    assert record.gpu_self_before is None and record.free_min is None
    assert record.host_rss_before == record.host_rss_after == record.host_rss_peak == 2 * GIB
    assert record.live_array_bytes_after == 3 * GIB
    table = format_table([record])
    assert "RSS before" in table and "GPU before" not in table
    assert "2.00 GiB" in table


def test_two_gpus_add_up():
    nb = Notebook(gpus=(0, 1))
    nb.world.jax_up = True
    nb.world.hold(0, OUR_PID, 2 * GIB).hold(1, OUR_PID, 3 * GIB)
    nb.world.jax_devices = [jax_gpu(0, GIB), jax_gpu(1, 2 * GIB)]
    record = nb.run_cell("pmap_step()")
    assert record.gpu_count == 2
    assert record.gpu_self_after == 5 * GIB
    assert record.jax_in_use_after == 3 * GIB
    assert record.free_min == 160 * GIB - 2 * DRIVER_BYTES - 5 * GIB


def test_two_thousand_cells_stay_bounded():
    nb = Notebook(max_records=500)
    nb.world.hold(0, OUR_PID, GIB)
    for _ in range(2000):
        nb.count += 1
        nb.ledger.cell_started(nb.count, f"step({nb.count})")
        nb.clock.now += 0.05
        nb.ledger.cell_finished(True, None)
    records = nb.ledger.records()
    assert len(records) == 500 == nb.ledger.max_records
    assert [r.execution_count for r in records] == list(range(1501, 2001))
    assert Ledger(None).max_records == 10_000


def test_records_turn_into_json():
    nb = Notebook()
    nb.world.hold(0, OUR_PID, GIB)
    record = nb.run_cell("x = 1")
    data = json.loads(json.dumps(record.to_dict()))
    assert data["execution_count"] == 1
    assert data["gpu_self_retained"] == 0
    assert data["jax_retained"] is None
    assert set(data) >= {f for f in CellRecord.__dataclass_fields__}


def table_rows(text):
    """Split a rendered table into dicts keyed by its header (columns are 2+ spaces apart)."""
    lines = text.splitlines()
    header = re.split(r"\s{2,}", lines[0].strip())
    return [
        dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=True)) for line in lines[2:-1]
    ]


def test_the_cells_table_reads_like_a_report_and_never_shows_unknown_as_zero():
    nb = Notebook()
    nb.world.jax_up = True
    usage = {"bytes": GIB}
    nb.world.hold(0, OUR_PID, lambda t: usage["bytes"])
    nb.world.jax_devices = [lambda t: jax_gpu(0, usage["bytes"], 40 * GIB)]
    nb.run_cell("params = init(key)")
    nb.count += 1
    nb.ledger.cell_started(nb.count, "grads = " + "x" * 80)
    usage["bytes"] = 3 * GIB
    nb.clock.now += 65
    nb.ledger.cell_finished(True, None)
    nb.world.jax_up = False  # e.g. the backend was torn down: JAX numbers unknown
    nb.run_cell("del params", error=KeyError("params"))

    text = format_table(nb.ledger.records())
    first, second, third = table_rows(text)
    assert first == {
        "#": "1",
        "cell": "params = init(key)",
        "duration": "1.00 s",
        "status": "ok",
        "GPU before": "1.00 GiB",
        "GPU peak": "1.00 GiB",
        "GPU after": "1.00 GiB",
        "retained": "0 B",
        "JAX peak": "≥1.00 GiB",  # sampled, JAX's own peak (40 GiB) is older
        "free min": "78.5 GiB",
    }
    assert second["cell"] == "grads = " + "x" * 19 + "…"
    assert second["duration"] == "1 min 05 s"
    assert (second["GPU peak"], second["retained"]) == ("3.00 GiB", "+2.00 GiB")
    assert third["status"] == "error: KeyError"
    assert third["JAX peak"] == "—"  # unknown, not "0 B"
    assert text.splitlines()[-1].startswith("GPU = this process per NVML")
    assert format_table([]) == "No cells recorded yet."


def test_a_column_nothing_can_fill_is_left_out_and_a_simulated_peak_says_what_it_is():
    """Issue 46 item 6: JAX on the CPU (the simulated GPU's kernels) has no JAX peak."""
    from jax_nbmem.record.table import SIMULATED_NOTE

    nb = Notebook()
    nb.world.jax_up = False  # JAX on the CPU: the GPU's bytes are the mirror's
    usage = {"bytes": GIB}
    nb.world.hold(0, OUR_PID, lambda t: usage["bytes"])
    nb.run_cell("a = make()")
    usage["bytes"] = 2 * GIB
    nb.run_cell("b = make()")
    text = format_table(nb.ledger.records())
    assert "JAX peak" not in text and "≥" not in text, text
    (first, second) = table_rows(text)
    assert second["retained"] == "+1.00 GiB" and second["GPU peak"] == "2.00 GiB"
    assert SIMULATED_NOTE not in text
    simulated = format_table(nb.ledger.records(), simulated=True)
    assert simulated.splitlines()[-1] == SIMULATED_NOTE
    assert "its peak is the live arrays' at the boundaries" in SIMULATED_NOTE


def test_whether_a_cell_runs_and_when_the_last_one_ended_for_the_beacon():
    nb = Notebook()
    assert (nb.ledger.cell_running, nb.ledger.last_finished_at) == (False, None)
    nb.ledger.cell_finished(True, None)  # the cell that loaded the extension: no record
    assert nb.ledger.last_finished_at == nb.wall()
    nb.ledger.cell_started(1, "x = 1")
    assert nb.ledger.cell_running
    nb.clock.now += 2.0
    nb.ledger.cell_finished(True, None)
    ended = nb.wall()
    assert not nb.ledger.cell_running
    nb.clock.now += 30.0
    assert nb.ledger.last_finished_at == pytest.approx(ended)


def test_with_the_thread_serving_a_cells_end_asks_nothing_and_its_reading_still_comes():
    world = GpuWorld(FakeClock())  # real clocks; the world's only scripts the bytes
    world.hold(0, OUR_PID, GIB)
    sampler = Sampler(world.source(), interval=0.1)
    ledger = Ledger(sampler)
    sampler.start()
    try:
        # Its first reading imports NVML's module: cells during it would be one span.
        wait_for("the sampler's first reading", lambda: sampler.latest_sample)
        for count in (1, 2, 3):  # Run All: cells end faster than a reading
            ledger.cell_started(count, f"x = {count}")
            ledger.cell_finished(True, None, count)
        assert not sampler._after_requests  # queued by the ledger, no request per cell
        assert ledger.settle(10)
        records = ledger.records()
        assert [r.execution_count for r in records] == [1, 2, 3]
        for record in records:
            assert record.gpu_self_after == GIB and record.gpu_after_delay_s >= 0, record
            assert not any("not read" in note for note in record.notes), record
    finally:
        sampler.stop()


def serving_notebook():
    """A notebook whose sampler acts as if its thread served (cells queue for a reading),
    while the test plays the thread by calling ``_serve_after`` itself. This process holds
    ``nb.held["bytes"]`` on GPU 0 (1 GiB to begin with), and a first sample is taken."""
    nb = Notebook()
    nb.sampler.serving = True
    nb.held = {"bytes": GIB}
    nb.world.hold(0, OUR_PID, lambda t: nb.held["bytes"])
    nb.sampler.tick()
    return nb


def test_a_cell_started_before_its_predecessors_reading_reads_the_boundary_itself():
    nb = serving_notebook()
    held = nb.held
    nb.ledger.cell_started(1, "a = alloc()")
    held["bytes"] = 3 * GIB
    nb.ledger.cell_finished(True, None, 1)
    nb.clock.now += 0.0001  # Run All: the next cell a tenth of a millisecond later
    nb.ledger.cell_started(2, "del a")
    held["bytes"] = GIB
    nb.ledger.cell_finished(True, None, 2)
    # The thread's reading, begun now, is after cell 2: cell 1 must not take it.
    assert nb.sampler._serve_after()
    first, second = nb.ledger.records()
    assert (first.gpu_self_before, first.gpu_self_after) == (GIB, 3 * GIB)
    assert (second.gpu_self_before, second.gpu_self_after) == (3 * GIB, GIB)
    assert first.gpu_self_retained == 2 * GIB and second.gpu_self_retained == -2 * GIB
    assert first.notes == () and second.notes == ()
    assert first.span_start is None and second.span_start is None


def test_cells_back_to_back_leave_the_thread_asleep_and_paced_cells_wake_it_each_once():
    nb = serving_notebook()
    woken = []
    nb.sampler.wake_for_reading = lambda: woken.append(nb.clock.now)

    def cell(count, gap, allocate):
        nb.clock.now += gap
        nb.ledger.cell_started(count, "a = alloc()")
        nb.held["bytes"] += allocate
        nb.ledger.cell_finished(True, None, count)
        if gap > 0.010:  # paced: the woken thread reads in the pause
            nb.clock.now += 0.001
            nb.sampler._serve_after()

    cell(1, 1.0, GIB)  # the first after a pause: the thread is woken for its reading
    assert len(woken) == 1
    for count in (2, 3, 4):  # Run All: each start reads the boundary, nobody wakes the thread
        cell(count, 0.0002, GIB)
    assert len(woken) == 1
    for count in (5, 6):  # a kernel's round trip between cells: the starts read, too
        cell(count, 0.006, GIB)
    # and the thread, if it polls, takes such cells as running: its polls would take the GIL
    assert len(woken) == 1 and nb.sampler.back_to_back
    for count in (7, 8):  # a person's pace again: each end wakes the thread once
        cell(count, 0.02, -GIB)
    assert len(woken) == 3 and not nb.sampler.back_to_back
    records = nb.ledger.records()
    retained = [r.gpu_self_retained for r in records]
    assert retained == [GIB] * 6 + [-GIB, -GIB], records
    assert all(r.notes == () and r.span_start is None for r in records[:-1]), records


def test_a_reading_the_thread_delivers_after_the_next_start_is_not_the_cells():
    nb = serving_notebook()
    held = nb.held
    nb.ledger.cell_started(1, "x = 1")
    nb.ledger.cell_finished(True, None, 1)
    nb.clock.now += 0.001
    # The thread's reading began after cell 1 ended, but it hands the reading over only
    # after cell 2 started (and allocated): the start claimed cell 1 and read it itself.
    began = nb.clock.now
    nb.ledger.cell_started(2, "b = alloc()")
    held["bytes"] = 5 * GIB
    late = nb.sampler.sample_now()
    nb.ledger._readings_arrived(late, began)
    nb.ledger.cell_finished(True, None, 2)
    first = nb.ledger.records()[0]
    assert (first.gpu_self_after, first.gpu_self_retained) == (GIB, 0)


def test_when_readings_are_slow_back_to_back_cells_are_one_span_said_as_such():
    nb = serving_notebook()
    held = nb.held
    nb.ledger.cell_started(1, "a = alloc()")
    held["bytes"] = 3 * GIB
    nb.ledger.cell_finished(True, None, 1)
    memory_calls = nb.world.calls["memory"]
    nb.sampler.reading_since = nb.clock.now - 2.0  # the thread is 2 s into an NVML call
    nb.ledger.cell_started(2, "del a")
    assert nb.world.calls["memory"] == memory_calls  # the cell did not wait for NVML
    nb.sampler.reading_since = None
    held["bytes"] = 2 * GIB
    nb.ledger.cell_finished(True, None, 2)
    nb.clock.now += 0.5
    assert nb.sampler._serve_after()
    first, second = nb.ledger.records()
    assert first.gpu_self_after is None and first.gpu_self_retained is None  # not another's
    assert "covers both" in first.notes[0]
    assert second.span_start == 1
    assert (second.gpu_self_before, second.gpu_self_after) == (GIB, 2 * GIB)
    assert "first of a span" in second.notes[0]
    assert second.to_dict()["span_start"] == 1
    text = format_table([first, second])
    assert text.splitlines()[-1].startswith("a–b = cells with no reading between them")
    rows = table_rows(text.rsplit("\n", 1)[0])
    assert (rows[0]["#"], rows[1]["#"]) == ("1", "1–2")
    assert rows[0]["retained"] == "—" and rows[1]["retained"] == "+1.00 GiB"


def test_live_arrays_are_the_cells_only_when_walked_at_its_boundaries():
    nb = Notebook()
    nb.sampler.serving = True  # as in serving_notebook, on a kernel without a GPU
    nb.world.visible = ()
    nb.world.jax_up = True
    nb.sampler.tick()
    nb.sampler.live_walk.cost = 1.0  # very many arrays: the boundaries do not walk them
    walked_at = nb.wall()
    nb.ledger.cell_started(1, "x = 1")
    nb.clock.now += 0.01
    nb.ledger.cell_finished(True, None, 1)
    nb.clock.now += 0.01
    nb.ledger.cell_started(2, "y = 2")
    nb.ledger.cell_finished(True, None, 2)
    first = nb.ledger.records()[0]
    assert first.live_array_bytes_after is None  # the last walk was before the cell
    assert first.live_array_bytes_seen == 3 * GIB
    assert first.live_array_seen_at == pytest.approx(walked_at)
    assert "3.00 GiB as of" in format_table([first])


def test_a_listener_hears_each_record_once_its_after_reading_is_in():
    nb = serving_notebook()
    held = nb.held
    heard = []
    nb.ledger.add_closed_listener(heard.append)
    nb.ledger.add_closed_listener(heard.append)  # once only
    nb.ledger.cell_started(1, "a = alloc()")
    held["bytes"] = 2 * GIB
    nb.ledger.cell_finished(True, None, 1)
    assert heard == []  # its reading is not in yet
    nb.clock.now += 0.0001
    nb.ledger.cell_started(2, "x = 1")  # back to back: the start reads the boundary
    assert [(r.execution_count, r.gpu_self_after) for r in heard] == [(1, 2 * GIB)]
    nb.ledger.cell_finished(True, None, 2)
    nb.clock.now += 0.5
    assert nb.sampler._serve_after()  # the thread's reading, between cells
    assert [(r.execution_count, r.gpu_self_retained) for r in heard] == [(1, GIB), (2, 0)]
    nb.ledger.remove_closed_listener(heard.append)
    nb.run_cell("y = 2")
    nb.sampler._serve_after()
    assert len(heard) == 2
