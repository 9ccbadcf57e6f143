"""On the simulated GPU, `%jaxmem cells`' "JAX peak" is the mirror's: live arrays at the boundaries.

A real kernel of the demo (the quickstart's --simulated-gpu): JAX on the CPU, the mirror
holding what JAX's allocator would on the simulated GPU. JAX's CPU devices keep no counters;
the mirror's stand for them, and the table says what that peak is.
"""

from __future__ import annotations

import json
import re

import pytest

from jax_nbmem.record.table import SIMULATED_NOTE, SIMULATED_PEAK_HEADER, SIMULATED_PEAK_NOTE
from tests.kernels import execute
from tests.simgpu.test_mirror import demo_env, demo_kernel, held_by  # noqa: F401 (a fixture)

MIB = 1024**2


def cell_rows(text: str) -> list[dict[str, str]]:
    """The table's rows as dicts keyed by its header (columns are 2+ spaces apart)."""
    lines = text.strip().splitlines()
    header = re.split(r"\s{2,}", lines[0].strip())
    rows = []
    for line in lines[2:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == len(header):
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


@pytest.mark.kernel
@pytest.mark.timeout(240)
def test_the_jax_peak_column_shows_the_live_arrays_at_the_boundaries(demo_env):  # noqa: F811
    with demo_kernel(demo_env) as (pid, client, state):
        execute(client, "%load_ext jax_nbmem\n%jaxalloc off")
        cells = [
            "import jax.numpy as jnp\na = jnp.ones((64, 1024, 1024), dtype=jnp.uint8)",
            "b = jnp.ones((128, 1024, 1024), dtype=jnp.uint8)",
            "del b",
            "c = (jnp.ones((256, 1024, 1024), dtype=jnp.uint8) + 1).sum()",  # temporaries
        ]
        for code in cells:
            out, error = execute(client, code)
            assert error is None, out
        held_by(state, pid, lambda held: held is not None)
        out, error = execute(client, "%jaxmem cells")
        assert error is None, out
        assert SIMULATED_PEAK_HEADER in out.splitlines()[0], out
        assert SIMULATED_NOTE in out and SIMULATED_PEAK_NOTE in out
        assert "live arrays at the boundaries" in SIMULATED_PEAK_NOTE
        assert "≥" not in out, out
        peaks = [row[SIMULATED_PEAK_HEADER] for row in cell_rows(out)]
        # a; a and b; b at the start of its del
        assert peaks[:3] == ["64.0 MiB", "192 MiB", "192 MiB"], out
        out, _ = execute(
            client,
            "import json, jax_nbmem\n"
            "print(json.dumps([c.to_dict()['jax_in_use_peak'] for c in jax_nbmem.cells()]))",
        )
    found = json.loads(out.strip().splitlines()[-1])
    assert found[:3] == [64 * MIB, 192 * MIB, 192 * MIB]
    # The temporaries: seen only where one of the mirror's looks (every 0.25 s) met them alive
    # (the ones, then the ones and their sum), never at a cell's ends. The sum's 4-byte result
    # is live at the cell's end: a look there may count it beside `a`.
    seen = (64 * MIB, 320 * MIB, 576 * MIB)
    assert found[3] in {figure + result for figure in seen for result in (0, 4)}, found
