"""What the panel says: its header's allocator mode on a real GPU, on the CPU, on the simulated one.

On the demo's simulated GPU JAX runs on the CPU, yet the mirror holds, on the simulated GPU, the
pool this kernel's mode would take: the header says that, not that the mode is unused.
"""

import json
from types import SimpleNamespace

import pytest

from jax_nbmem.notebook.panel_text import HeaderMode, is_simulated
from jax_nbmem.simgpu import GIB, SimState
from tests.kernels import execute, running_kernel

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
