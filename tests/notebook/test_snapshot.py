"""The panel's static picture (an exported notebook's): what the live plot shows, in plain SVG."""

import re

from jax_nbmem.notebook.figure import build_figure
from jax_nbmem.notebook.snapshot import figure_svg
from tests.notebook.test_figure import GIB, MIB, gpu, sample


def test_a_series_above_the_axis_stays_in_the_timeline_and_is_marked():
    samples = [
        sample(i, gpu(self_bytes=mine * MIB, others=105 * GIB, total=150_000_000_000))
        for i, mine in enumerate([300, 684, 684])
    ]
    svg = figure_svg(build_figure(samples, [], gpu_index=0))
    assert "other processes 105 GiB ↑" in svg and "device total 140 GiB ↑" in svg
    lines = re.findall(r'<path d="(M[^"]*)" fill="none" stroke="([^"]+)"', svg)
    assert len(lines) == 3  # this kernel, other processes, device total
    ys = [float(y) for path, _ in lines for y in re.findall(r"(?:M-?[\d.]+,|V)(-?[\d.]+)", path)]
    assert min(ys) >= 40  # the timeline's top edge (_TOP), not above it into the legend
