"""What the panel says: its header's allocator mode on a real GPU, on the CPU, on the simulated one.

On the demo's simulated GPU JAX runs on the CPU, yet the mirror holds, on the simulated GPU, the
pool this kernel's mode would take: the header says that, not that the mode is unused.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from jax_nbmem.notebook.panel_text import (
    HeaderMode,
    code_html,
    context_line,
    header_details,
    header_line,
    is_simulated,
    sampler_status,
)
from jax_nbmem.simgpu import GIB, SimState
from jax_nbmem.units import format_gib
from tests.kernels import execute, running_kernel

MIB = 1 << 20
SIMULATED = "NVIDIA H200 (simulated)"


def gpu(name, self_bytes):
    return SimpleNamespace(name=name, self_bytes=self_bytes)


def test_the_mode_is_said_as_what_it_does_where_jax_runs():
    assert HeaderMode("off", "in effect").shown(gpu("NVIDIA H200", GIB)) == "off (in effect)"
    assert HeaderMode("on", "when JAX starts").shown(None) == "on (when JAX starts)"
    on_cpu = HeaderMode("off", "in effect", cpu_only="CPU")
    unused = "off, unused: JAX runs on CPU (allocator modes apply to GPUs)"
    assert on_cpu.shown(gpu("NVIDIA H200", 0)) == unused
    assert on_cpu.shown(gpu(SIMULATED, 0)) == unused  # nothing of ours there: no mirror
    assert on_cpu.shown(None) == unused
    mirrored = on_cpu.shown(gpu(SIMULATED, 300 << 20))
    assert mirrored.startswith("off, simulated: JAX runs on CPU") and "unused" not in mirrored
    assert "holds the pool this mode would take" in mirrored
    assert is_simulated(gpu("NVIDIA H200 MIG (simulated)", 0))
    assert not is_simulated(gpu("NVIDIA H200", 0)) and not is_simulated(None)


HEADER_WHEN_MIRRORED = """\
import time
from jax_nbmem.notebook.magics import session_of
live = session_of(get_ipython())._panel_state.live
for _ in range(100):
    live.refresh_after_cell()
    latest = live.sampler.latest()
    if latest is not None and (latest.gpu(0).self_bytes or 0) > 0:
        break
    time.sleep(0.1)
print(json.dumps({"header": live.header.value, "self": latest.gpu(0).self_bytes}))
"""


@pytest.mark.kernel
@pytest.mark.timeout(180)
def test_on_the_simulated_gpu_the_header_says_the_mirror_holds_the_pool(tmp_path):
    from tests.simgpu.test_mirror import shell_env

    env = {**shell_env(tmp_path / "sim"), "JAX_PLATFORMS": "cpu"}
    SimState(env["JAX_NBMEM_SIMGPU_STATE"]).gpu(0, total=80 * GIB).write()
    with running_kernel(env=env) as (_, client):
        cells = [
            "%load_ext jax_nbmem\n%jaxalloc off",
            "%jaxmem",
            "import json, jax.numpy as jnp\nx = jnp.ones((1024, 1024, 16)).block_until_ready()",
        ]
        for cell in cells:
            _, error = execute(client, cell)
            assert error is None, error
        out, error = execute(client, HEADER_WHEN_MIRRORED, timeout=60)
        assert error is None, error
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["self"] > 64 << 20, seen  # the mirror holds this kernel's pool
    header = seen["header"]
    assert SIMULATED in header
    assert "allocator: off, simulated: JAX runs on CPU" in header, header
    assert "unused" not in header, header


def test_the_header_is_one_short_line_and_its_hover_says_the_rest():
    from tests.notebook.test_figure import gpu as gpu_sample
    from tests.notebook.test_figure import sample

    mirrored = HeaderMode("off", "in effect", cpu_only="CPU")
    latest = sample(0, gpu_sample(self_bytes=684 * MIB, others=0, total=140 * GIB))
    line = header_line(latest, 0, mirrored)
    assert line == (
        "GPU 0: NVIDIA H200 (simulated) · allocator: off (simulated pool; JAX on CPU)"
        " · free 139.3 GiB of 140.0 GiB"
    )
    assert "holds the pool this mode would take" in header_details(latest, 0, mirrored)


def test_free_memory_is_one_figure_as_the_status_bar_writes_it():
    # labextension/src/format.ts gib(): toFixed(1) GiB from 1 GiB, else toFixed(0) MiB.
    source = (Path(__file__).parents[2] / "labextension/src/format.ts").read_text()
    assert "(bytes / 2 ** 30).toFixed(1)} GiB" in source
    assert "(bytes / 2 ** 20).toFixed(0)} MiB" in source
    assert format_gib(int(138.5 * GIB)) == "138.5 GiB"  # format_bytes says "139 GiB"
    assert format_gib(int(1.25 * GIB)) == "1.3 GiB"  # a tie goes up, as toFixed's does
    assert format_gib(300 * MIB) == "300 MiB" and format_gib(None) == "—"


def test_code_in_a_warning_is_shown_as_code_and_nothing_else_is_html():
    line = "Shut it down: `%jaxmem shutdown 23743` <now> & `jax-nbmem status`."
    assert code_html(line) == (
        "Shut it down: <code>%jaxmem shutdown 23743</code> &lt;now&gt; &amp; "
        "<code>jax-nbmem status</code>."
    )


def test_the_kernels_memory_beyond_its_arrays_is_said_to_be_the_cuda_context():
    from tests.notebook.test_figure import gpu as gpu_sample
    from tests.notebook.test_figure import sample

    # The demo: JAX on the CPU, 384 MiB of live arrays mirrored, plus the simulated context.
    demo = sample(0, gpu_sample(self_bytes=684 * MIB), live=384 * MIB)
    assert context_line(demo, 0) == (
        "This kernel holds 684 MiB of GPU 0: 384 MiB of JAX arrays; the rest, 300 MiB, is "
        "the simulated CUDA context and what JAX's allocator keeps for reuse."
    )
    held = gpu_sample(self_bytes=2 * GIB, jax_in_use=GIB, jax_reserved=1536 * MIB, name="H200")
    real = sample(0, held)
    said = context_line(real, 0)
    assert "1.00 GiB of JAX arrays in a pool of 1.50 GiB" in said
    assert "the rest, 512 MiB, is the CUDA context and XLA's own buffers" in said
    assert context_line(sample(0, gpu_sample(self_bytes=0)), 0) is None  # nothing held
    assert context_line(sample(0, gpu_sample()), 0) is None  # arrays unknown: not guessed


def test_only_the_live_widget_says_live():
    sampler = SimpleNamespace(interval=0.1)
    assert sampler_status(sampler, None, "widget") == ["Live: sampling every 100 ms."]
    for kind in ("cells", "static", "text", "terminal"):
        said = " ".join(sampler_status(sampler, None, kind))
        assert said and "Live" not in said, kind
    assert sampler_status(sampler, None, "snapshot") == []
