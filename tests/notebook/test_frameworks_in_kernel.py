"""A real kernel that runs PyTorch beside JAX on the simulated GPU: the split, the OOM, the panel.

PyTorch is a documented stand-in (``tests/framework_standins.py``: only the counters jax_nbmem
reads, and torch's ``OutOfMemoryError``), placed in the kernel's ``sys.modules``; JAX is real
(on the CPU), and the simulated GPU's mirror holds the pool JAX's default mode would take plus
what the stand-in says PyTorch holds, as a real driver counts the kernel's bytes.
"""

import json

import pytest

from tests.kernels import execute, running_kernel

pytestmark = pytest.mark.kernel

GiB = 1024**3


def test_torch_beside_jax_is_split_explained_and_shown(sim_state, simgpu_env):
    sim_state.gpu(0, total=16 * GiB).write()
    with running_kernel(env=simgpu_env) as (_, client):
        for code in (
            "%load_ext jax_nbmem",
            "from jax_nbmem.simgpu.mirror import start_from_environment\n"
            "mirror = start_from_environment()",
            "import sys\nfrom tests.framework_standins import GiB, torch_standin\n"
            "sys.modules['torch'] = torch_standin(True, {0: 2 * GiB}, {0: GiB})",
            "import jax.numpy as jnp\njnp.ones(4).block_until_ready()\nmirror.step()",
        ):
            out, error = execute(client, code)
            assert error is None, out

        status, error = execute(client, "%jaxmem status")
        assert error is None, status
        assert "This kernel's GPU memory by holder:" in status
        # The default mode's 12 GiB pool (75% of 16 GiB), PyTorch's
        # 2 GiB, and the 300 MiB context left as the rest.
        assert "JAX pool 12.0 GiB + PyTorch 2.00 GiB + CUDA contexts and the rest 300 MiB" in status

        out, _ = execute(
            client, "import json, jax_nbmem\nprint(json.dumps(jax_nbmem.status()['own_split']))"
        )
        [row] = json.loads(out.strip().splitlines()[-1])
        assert row["parts"]["torch"] == 2 * GiB and row["other_bytes"] == 300 * 1024**2

        oom, error = execute(client, "raise sys.modules['torch'].OutOfMemoryError('CUDA OOM')")
        assert error == "OutOfMemoryError"
        assert "PyTorch ran out of GPU memory in this kernel." in oom
        assert "JAX's pool in this same kernel holds 12.0 GiB" in oom
        assert "`%jaxalloc off`" in oom and "`%jaxalloc platform`" in oom
        assert "restart this kernel" in oom  # JAX had started: its settings are taken
        assert oom.count("ran out of GPU memory") == 1

        # JAX arrays an error's frames keep alive are said too: they take the GPU from torch.
        held, error = execute(
            client,
            "def step():\n"
            "    batch = jnp.ones((128 * 1024 * 1024,), jnp.uint8)\n"
            "    raise sys.modules['torch'].OutOfMemoryError('CUDA OOM')\n"
            "step()",
        )
        assert error == "OutOfMemoryError"
        assert "this error's frames now hold 128 MiB" in held and "batch in step()" in held

        panel, error = execute(client, "%jaxmem panel text")
        assert error is None, panel
        assert "This kernel by holder: GPU 0:" in panel and "PyTorch 2.00 GiB" in panel
