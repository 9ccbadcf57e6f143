"""What an error leaves behind: `%jaxmem top` names the frames' locals that keep arrays alive,
`%jaxmem free --last-error` lets them go, and the out-of-memory diagnosis says what the previous
error's frames held. In real IPython shells and a real kernel, with real JAX (on the CPU).
"""

from __future__ import annotations

import json

import pytest

from tests.ipython_session import run_cells
from tests.kernels import execute, running_kernel

MiB = 1024**2

SETUP = "%load_ext jax_nbmem\nimport json, jax, jax.numpy as jnp\nsmall = jnp.ones(1000)"
FAILS = (
    "def build():\n"
    "    big = jnp.ones((25 * 1024 * 1024,), jnp.float32)  # 100 MiB\n"
    "    parts = [big, small]\n"
    "    raise ValueError('the step failed')\n"
    "build()"
)
# Bytes of the live arrays' device buffers, each buffer once (an older jaxlib keeps per-shard
# Array objects on the same buffer after their first use).
LIVE = (
    "print(json.dumps(sum({a.unsafe_buffer_pointer(): a.nbytes "
    "for a in jax.live_arrays()}.values())))"
)
OOM = (
    "class JaxRuntimeError(Exception):\n    pass\n"
    "def step():\n"
    "    scratch = jnp.ones((20 * 1024 * 1024,), jnp.float32)  # 80 MiB\n"
    "    raise JaxRuntimeError('RESOURCE_EXHAUSTED: Out of memory allocating 96 GiB')\n"
    "step()"
)


def number(output) -> int:
    assert output.error is None, output.text
    return json.loads(output.stdout.strip().splitlines()[-1])


def test_top_names_the_failed_frame_and_free_last_error_gives_it_back():
    outputs = run_cells(
        [
            SETUP,
            FAILS,
            LIVE,
            "%jaxmem top",
            "%jaxmem free small",
            "%jaxmem free --last-error",
            LIVE,
            "%jaxmem top",
            "%jaxmem free --last-error",
            "%jaxmem free --last-error small",
            "small.sum()",  # still there: freeing the error's frames kept what names hold
        ]
    )
    assert outputs[1].error == "ValueError"
    before = number(outputs[2])
    top = outputs[3].stdout
    assert outputs[3].error is None, outputs[3].text
    row = next(line for line in top.splitlines() if "100 MiB" in line and "(26214400,)" in line)
    assert "only the last error's frames: big in build() (Cell In[2], line 4)" in row
    assert "parts[0] in build() (Cell In[2], line 4)" in row
    assert "1 array(s), 100 MiB, held only by the last error's frames" in top
    assert "`%jaxmem free --last-error` lets them go" in top
    # `small` is named, and the frame holds it too: free says who, and keeps it.
    kept = outputs[4].stdout
    assert "kept small" in kept and "parts[1] in build() (Cell In[2], line 4)" in kept
    released = outputs[5].stdout
    assert outputs[5].error is None, outputs[5].text
    assert released.startswith("released the frames of the last error (ValueError of cell [2])")
    assert "1 array(s), 100 MiB, held only there are gone" in released
    assert (
        "kept parts[1] in build() (Cell In[2], line 4)" in released
        and "also held by small" in released
    )
    assert "live JAX arrays: " in released
    assert before - number(outputs[6]) == 100 * MiB
    assert "100 MiB" not in outputs[7].stdout and "last error" not in outputs[7].stdout
    assert outputs[8].stdout.startswith("No error to free")
    assert outputs[9].error == "UsageError" and "small" in outputs[9].error_text
    assert outputs[10].error is None


def test_the_oom_diagnosis_says_what_the_previous_error_held():
    outputs = run_cells([SETUP, FAILS, OOM, "%jaxmem free --last-error", LIVE])
    oom = outputs[2]
    assert oom.error == "JaxRuntimeError"
    text = oom.text
    assert (
        "the error of cell [2] (ValueError) kept 100 MiB of arrays alive in its frames "
        "(big in build() (Cell In[2], line 4)" in text
    )
    # IPython's frame that ran cell 2 holds its result, which holds the error: a cycle, that
    # would keep the 100 MiB until Python's collector got to it.
    assert (
        "while cell [3] ran; they were left in a reference cycle, which jax_nbmem collected "
        "now, so running the cell again may fit" in text
    )
    assert (
        "this error's frames now hold 80.0 MiB of arrays (scratch in step() (Cell In[3], line 5))"
        in text
    )
    assert "`%jaxmem free --last-error` releases them" in text
    assert "80.0 MiB, held only there are gone" in outputs[3].stdout
    assert number(outputs[4]) == 4000  # only `small` is left


@pytest.mark.kernel
def test_free_last_error_in_a_real_kernel():
    with running_kernel() as (_, client):
        assert execute(client, SETUP)[1] is None
        assert execute(client, FAILS)[1] == "ValueError"
        live_before = int(execute(client, LIVE)[0].strip())
        top, error = execute(client, "%jaxmem top")
        assert error is None and "only the last error's frames: big in build()" in top
        released, error = execute(client, "%jaxmem free --last-error")
        assert error is None, released
        assert "1 array(s), 100 MiB, held only there are gone" in released
        assert live_before - int(execute(client, LIVE)[0].strip()) == 100 * MiB
