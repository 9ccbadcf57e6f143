"""The panel's figure as plain data: what the user would see in each trace, and its size."""

import json
import time

import pytest

from jax_nbmem.notebook.figure import (
    TIMELINE_TRACES,
    TRACE_NAMES,
    FigureLimits,
    LiveFigure,
    build_figure,
    figure_parts,
    gpu_indices,
    header_text,
    time_ms,
)
from jax_nbmem.record.ledger import CellRecord
from jax_nbmem.record.sampler import GpuSample, HostSample, Sample, SampleHistory

GIB = 1024**3
MIB = 1024**2
T0 = 1_700_000_000.0


def gpu(index=0, self_bytes=4 * GIB, others=10 * GIB, jax_in_use=None, total=80 * GIB, **kw):
    used = None if self_bytes is None or others is None else self_bytes + others
    return GpuSample(
        index=index,
        uuid=f"GPU-{index}",
        name=kw.get("name", "NVIDIA H200 (simulated)"),
        total_bytes=total,
        used_bytes=used,
        free_bytes=None if used is None else total - used,
        self_bytes=self_bytes,
        others_bytes=others,
        jax_in_use=jax_in_use,
        jax_peak=None,
        jax_reserved=kw.get("jax_reserved"),
        jax_limit=kw.get("jax_limit"),
        problem=kw.get("problem"),
        mig=kw.get("mig"),
    )


def sample(t, *gpus, rss=300 * MIB, live=None):
    return Sample(t=T0 + t, gpus=tuple(gpus), host=HostSample(rss, live))


def record(count, started, before, peak, after, success=True, oom=False, error=None, code=None):
    return CellRecord(
        execution_count=count, first_line=code or f"cell {count}", started_at=T0 + started,
        duration_s=1.0, success=success, error=error, oom=oom, gpu_count=1,
        gpu_self_before=before, gpu_self_peak=peak, gpu_self_after=after,
        jax_in_use_before=None, jax_in_use_peak=None, jax_in_use_after=None,
        peak_exact=False, free_at_start=None, free_min=None, host_rss_before=None,
        host_rss_peak=None, host_rss_after=None, live_array_bytes_before=None,
        live_array_bytes_after=None,
    )  # fmt: skip


def trace(figure, name):
    return next(t for t in figure["data"] if t["name"].startswith(name))


def test_gpu_timeline_shows_this_kernel_others_and_total_in_gib():
    samples = [sample(i * 0.1, gpu(self_bytes=(4 + i) * GIB)) for i in range(5)]
    figure = build_figure(samples, [], gpu_index=0)

    assert [t["name"] for t in figure["data"]] == list(TRACE_NAMES)
    mine = trace(figure, "this kernel")
    assert mine["visible"] and mine["y"] == [4.0, 5.0, 6.0, 7.0, 8.0]
    # Plotly reads the numbers as UTC: shifted by the local offset, the axis shows local time.
    offset_ms = time.localtime(T0).tm_gmtoff * 1000
    assert mine["x"][0] == T0 * 1000 + offset_ms and mine["x"][1] - mine["x"][0] == 100
    assert figure["layout"]["xaxis"]["type"] == "date"
    assert trace(figure, "other processes")["y"][-1] == 10.0
    assert trace(figure, "device total")["y"] == [80.0, 80.0]  # flat: drawn with two points
    # JAX has not started in this kernel: its series are hidden, not drawn as zero.
    assert not trace(figure, "JAX in use")["visible"]
    assert not trace(figure, "process RSS")["visible"]
    assert "GPU 0, GiB" == figure["layout"]["yaxis"]["title"]["text"]
    # The axis holds what is in use (the others' 10 GiB, this kernel's 8) with 20% headroom,
    # from 0; the device total is above it, marked with its value.
    assert y_range(figure) == pytest.approx([0.0, 12.0])
    assert off_scale(figure) == ["device total 80.0 GiB ↑"]
    assert "width" not in figure["layout"] and figure["layout"]["autosize"]  # full width


def y_range(figure) -> list[float]:
    return figure["layout"]["yaxis"]["range"]


def off_scale(figure) -> list[str]:
    """The marks of series above the timeline's axis (the first annotation is the bars')."""
    return [note["text"] for note in figure["layout"]["annotations"][1:]]


def test_a_notebooks_memory_shows_next_to_a_neighbours_pool_on_a_large_card():
    """The quickstart's story on a 150 GB card: 684 MiB of its own, a neighbour's 105 GiB."""
    card, pool = 150_000_000_000, 105 * GIB
    growing = [300, 300, 684, 684]  # MiB: the CUDA context, then six 64 MiB arrays
    samples = [
        sample(i, gpu(self_bytes=mine * MIB, others=pool, total=card))
        for i, mine in enumerate(growing)
    ]
    figure = build_figure(samples, [], gpu_index=0)
    layout = figure["layout"]
    assert layout["yaxis"]["title"]["text"] == "GPU 0, MiB"
    top = layout["yaxis"]["range"][1]
    assert layout["yaxis"]["range"][0] == 0 and 684 < top <= 684 * 1.25
    assert max(trace(figure, "this kernel")["y"]) / top > 0.8  # most of the plot's height
    assert off_scale(figure) == ["other processes 105 GiB ↑", "device total 140 GiB ↑"]
    notes = layout["annotations"][1:]
    assert [n["font"]["color"] for n in notes] == [
        trace(figure, name)["line"]["color"] for name in ("other processes", "device total")
    ]
    # The neighbour is shut down (issue 49): its 105 GiB falls to 0, and the axis holds the
    # fall in GiB rather than draw a line through the chart's top with nothing to say what it was.
    samples.append(sample(5, gpu(self_bytes=684 * MIB, others=0, total=card)))
    after = build_figure(samples, [], gpu_index=0)
    assert after["layout"]["yaxis"]["title"]["text"] == "GPU 0, GiB"
    assert 105 < y_range(after)[1] <= 105 * 1.25
    assert max(trace(after, "other processes")["y"]) == pytest.approx(105, abs=0.01)
    assert trace(after, "other processes")["y"][-1] == 0
    assert off_scale(after) == ["device total 140 GiB ↑"]
    # A minute on, the fall has left the recent window: the axis fits this kernel again, and a
    # note says how high the line went.
    samples += [sample(t, gpu(self_bytes=684 * MIB, others=0, total=card)) for t in (40, 70, 90)]
    later = build_figure(samples, [], gpu_index=0)
    assert later["layout"]["yaxis"]["range"] == layout["yaxis"]["range"]
    assert later["layout"]["yaxis"]["title"]["text"] == "GPU 0, MiB"
    assert off_scale(later) == ["device total 140 GiB ↑", "other processes earlier 105 GiB ↑"]


def test_others_share_the_axis_while_they_do_not_dwarf_this_kernel():
    near = build_figure([sample(0, gpu(self_bytes=4 * GIB, others=12 * GIB))], [], 0)
    assert y_range(near) == pytest.approx([0.0, 14.4])  # 12 GiB <= 4 x 4 GiB: both shown
    far = build_figure([sample(0, gpu(self_bytes=4 * GIB, others=20 * GIB))], [], 0)
    assert y_range(far) == pytest.approx([0.0, 4.8])  # 20 GiB > 4 x 4 GiB: marked above
    assert off_scale(far) == ["other processes 20.0 GiB ↑", "device total 80.0 GiB ↑"]


def test_before_this_kernel_holds_anything_the_axis_holds_what_is_in_use():
    idle = build_figure([sample(0, gpu(self_bytes=0, others=0))], [], 0)
    assert y_range(idle) == pytest.approx([0.0, 96.0])  # an empty card looks empty
    assert off_scale(idle) == []
    busy = build_figure([sample(0, gpu(self_bytes=0, others=60 * GIB))], [], 0)
    assert y_range(busy) == pytest.approx([0.0, 72.0])
    assert off_scale(busy) == ["device total 80.0 GiB ↑"]


def test_an_unknown_reading_is_a_gap_not_a_zero():
    samples = [sample(0, gpu()), sample(1, gpu(self_bytes=None)), sample(2, gpu())]
    assert trace(build_figure(samples, [], 0), "this kernel")["y"] == [4.0, None, 4.0]


def test_a_short_spike_survives_in_the_downsampled_history():
    history = SampleHistory(recent_s=30, bucket_s=1)
    for i in range(3600):  # an hour at 1 Hz, one 2-second spike to 70 GiB after 10 minutes
        spike = 600 <= i < 602
        history.add(sample(i, gpu(self_bytes=70 * GIB if spike else 4 * GIB)))
    limits = FigureLimits(window_s=60, window_points=60, history_points=40)
    mine = trace(build_figure(history.samples(), [], 0, limits=limits), "this kernel")
    assert max(mine["y"]) == 70.0
    assert len(mine["x"]) <= 5  # flat apart from the spike: steps drop repeated values


def test_a_long_noisy_session_stays_small():
    history = SampleHistory()
    for i in range(24 * 3600):  # a day at 1 Hz of values that change at every sample
        wobble = (i * 7919) % 1000 * MIB
        history.add(sample(i, gpu(self_bytes=4 * GIB + wobble, jax_in_use=GIB + wobble)))
    records = [record(n, n * 60.0, GIB, 3 * GIB, 2 * GIB) for n in range(1, 200)]
    limits = FigureLimits()
    figure = build_figure(history.samples(), records, 0, limits=limits)
    for line in figure["data"][:8]:
        assert len(line["x"]) <= limits.window_points + limits.history_points + 2
    assert len(trace(figure, "cell peak")["x"]) == limits.max_cells
    assert len(trace(figure, "cell records")["x"]) == min(199, limits.max_spans)
    # Each part a live view syncs stays within one update's budget.
    for name, part in figure_parts(figure).items():
        assert len(json.dumps(part)) <= 32 * 1024, name


def test_a_live_figure_reads_only_new_samples_and_draws_what_a_fresh_build_draws():
    samples = []
    asked = []

    def history(since):  # what Sampler.history(since) gives
        asked.append(since)
        return [s for s in samples if since is None or s.t >= since]

    def reading(i):  # 5 Hz; a spike, a stretch NVML could not read, JAX starting later
        wobble = (i * 7919) % 1000 * MIB
        mine = 70 * GIB if i == 250 else None if 500 <= i < 510 else 4 * GIB + wobble
        jax = GIB + wobble if i >= 300 else None
        return sample(i / 5, gpu(0, self_bytes=mine, jax_in_use=jax), gpu(1, self_bytes=GIB))

    limits = FigureLimits(window_s=30, window_points=50, history_points=20)
    live = LiveFigure(limits)
    records = []
    for i in range(1500):  # five minutes, a figure every 0.4 s, a cell every 20 s
        samples.append(reading(i))
        if i % 100 == 0:
            records.append(record(i // 100, i / 5, GIB, 3 * GIB, 2 * GIB))
        if i % 2 == 1:
            figure = live.build(history, records, 0)
        if i % 100 == 99:
            assert figure == build_figure(samples, records, 0, limits=limits), i
        if i == 599:  # the stretch without a reading is in the window: a gap
            assert None in trace(figure, "this kernel")["y"]
    assert asked.count(None) == 1  # the whole history was read once, at the first build
    assert live.window_start == samples[-1].t - 30

    mine = trace(figure, "this kernel")
    assert max(y for y in mine["y"] if y is not None) == 70.0  # 4 minutes ago, still there
    assert len(mine["x"]) <= 20 + 51
    assert trace(figure, "JAX in use")["visible"]

    # Choosing the other GPU starts over from every sample; so does a long pause.
    assert live.build(history, records, 1) == build_figure(samples, records, 1, limits=limits)
    samples.extend(reading(i) for i in range(1500, 1900))  # 80 s without a figure
    assert live.build(history, records, 1) == build_figure(samples, records, 1, limits=limits)


def test_no_gpu_shows_host_memory_labelled_as_such():
    samples = [sample(i, rss=(500 + i) * MIB, live=100 * MIB) for i in range(3)]
    figure = build_figure(samples, [], gpu_index=None)
    assert gpu_indices(samples) == []
    rss = trace(figure, "process RSS")
    assert rss["visible"] and rss["y"] == [500.0, 501.0, 502.0]
    assert trace(figure, "JAX live arrays")["y"][0] == 100.0
    assert not trace(figure, "this kernel")["visible"]
    assert figure["layout"]["yaxis"]["title"]["text"] == "host memory (no GPU seen), MiB"


def test_cell_bars_show_peak_and_retained_with_colours_for_errors_and_oom():
    samples = [sample(0, gpu()), sample(10, gpu())]
    records = [
        record(1, 1, 4 * GIB, 9 * GIB, 6 * GIB),
        record(2, 3, 6 * GIB, 7 * GIB, 6 * GIB, success=False, error="ValueError"),
        record(3, 5, 6 * GIB, 79 * GIB, 6 * GIB, success=False, oom=True, error="XlaRuntimeError"),
    ]
    figure = build_figure(samples, records, 0)
    peak, kept = trace(figure, "cell peak"), trace(figure, "cell retained")
    assert peak["x"] == ["[1]", "[2]", "[3]"]
    assert peak["y"] == [5.0, 1.0, 73.0]
    assert kept["y"] == [2.0, 0.0, 0.0]
    ok, error, oom = peak["marker"]["color"]
    assert len({ok, error, oom}) == 3
    assert "out of memory" in peak["hovertext"][2]
    ticks = trace(figure, "cell records")
    assert ticks["x"] == [time_ms(T0 + 1), time_ms(T0 + 3), time_ms(T0 + 5)]
    assert (
        "cell [2] cell 2" in ticks["hovertext"][1] and "error ValueError" in ticks["hovertext"][1]
    )
    assert "before 6.00 GiB · peak 79.0 GiB · after 6.00 GiB" in ticks["hovertext"][2]
    assert figure["layout"]["xaxis2"]["tickangle"] == 0  # upright labels
    # The bars' note names their measure in plain words, with no brackets within brackets.
    note = figure["layout"]["annotations"][0]["text"]  # the rest mark series above the axis
    assert note == "last 3 cells: peak rise and retained (GPU memory per NVML)", note
    assert "GPU memory per NVML: before 6.00 GiB" in ticks["hovertext"][2]


def test_cells_are_alternating_spans_and_many_cells_keep_few_upright_labels():
    records = [record(n, n * 0.5, GIB, 2 * GIB, GIB) for n in range(1, 201)]
    figure = build_figure([sample(0, gpu()), sample(100, gpu())], records, 0)
    even, odd = trace(figure, "cells"), trace(figure, "cells (alternate shade)")
    assert even["fill"] == odd["fill"] == "toself" and even["fillcolor"] != odd["fillcolor"]
    limits = FigureLimits()
    assert even["x"].count(None) + odd["x"].count(None) == limits.max_spans
    # A span covers the cell: from its start to its end, up to the top of the axis.
    start, end = time_ms(T0 + 200 * 0.5), time_ms(T0 + 200 * 0.5 + 1.0)
    last = odd if limits.max_spans % 2 == 0 else even
    assert last["x"][-6:-1] == [start, start, end, end, start]
    assert last["yaxis"] == "y3" and max(y for y in last["y"] if y is not None) == 1
    ticks = figure["layout"]["xaxis2"]
    assert ticks["tickangle"] == 0 and len(ticks["tickvals"]) <= 16
    assert ticks["tickvals"][-1] == "[200]"  # the newest cell is always labelled


def test_code_in_hover_text_is_escaped_and_zero_bars_get_a_plain_axis():
    records = [record(1, 1, GIB, GIB, GIB, code="if a < b: print('<b>x</b>')")]
    figure = build_figure([sample(0, gpu()), sample(2, gpu())], records, 0)
    text = trace(figure, "cell records")["hovertext"][0]
    assert "&lt;b&gt;x&lt;/b&gt;" in text and "<b>" not in text
    assert trace(figure, "cell peak")["y"] == [0.0]
    assert figure["layout"]["yaxis2"]["range"] == [0.0, 1.0]  # not plotly's -1..1


def test_figure_parts_split_what_changes_often_from_what_does_not():
    first = build_figure([sample(0, gpu()), sample(1, gpu())], [record(1, 0, 0, 0, 0)], 0)
    moved = build_figure(
        [sample(0, gpu()), sample(1, gpu()), sample(2, gpu(self_bytes=GIB))],
        [record(1, 0, 0, 0, 0)],
        0,
    )
    before, after = figure_parts(first), figure_parts(moved)
    assert len(after["timeline"]) == TIMELINE_TRACES
    assert before["timeline"] != after["timeline"]
    assert before["cells"] == after["cells"] and before["bars"] == after["bars"]
    assert after["timeline"] + after["cells"] + after["bars"] == moved["data"]


def test_header_names_the_gpu_the_mode_and_free_memory():
    latest = sample(0, gpu(name="NVIDIA H200 (simulated)"))
    line = header_text(latest, 0, "off (in effect)")
    assert line == (
        "GPU 0: NVIDIA H200 (simulated) · allocator: off (in effect) · free 66.0 GiB of 80.0 GiB"
    )
    unknown = sample(0, gpu(self_bytes=None))
    assert "free — of 80.0 GiB" in header_text(unknown, 0, None)
    assert "allocator: unknown" in header_text(unknown, 0, None)
    assert header_text(sample(0), None, "on").startswith("No GPU seen — host memory: RSS 300 MiB")


def test_a_mig_instance_is_named_in_the_timeline_and_the_header():
    from jax_nbmem.gpu.mig import MigInstance

    place = MigInstance(0, "GPU-0", 1, 0, "3g.71gb")
    instance = gpu(2, total=71 * GIB, name="NVIDIA H200 MIG 3g.71gb", mig=place)
    samples = [sample(0, instance), sample(1, instance)]
    figure = build_figure(samples, [], gpu_index=2)
    assert figure["layout"]["yaxis"]["title"]["text"] == "MIG 3g.71gb instance 1 of GPU 0, GiB"
    assert header_text(samples[-1], 2, "on").startswith(
        "MIG 3g.71gb instance 1 of GPU 0: NVIDIA H200 MIG 3g.71gb · allocator: on · free 57.0 GiB"
    )
