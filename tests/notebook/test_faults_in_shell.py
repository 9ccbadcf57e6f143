"""The extension in real IPython shells when things go wrong: a hung NVML, an interrupt in a
hook, failing cells, a process list NVML refuses, numbers that make no sense, a terminal.

Each scenario is one defect that a user met; each runs in its own IPython process on the
simulated GPU, through the public interfaces (magics, ``jax_nbmem.cells()``/``status()``).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from jax_nbmem.simgpu import GIB
from tests.ipython_session import run_cells

pytestmark = pytest.mark.kernel

TIMED = """
import time
_began = time.monotonic()
x = 1
"""
ELAPSED = "print(json.dumps(time.monotonic() - _began))"
RECORDS = "import json, jax_nbmem; print(json.dumps([c.to_dict() for c in jax_nbmem.cells()]))"


def _last_json(output):
    return json.loads(output.stdout.strip().splitlines()[-1])


def _by_cell(output):
    return {record["execution_count"]: record for record in _last_json(output)}


def test_a_hung_nvml_does_not_hold_up_cells_and_status_says_it_is_slow(sim_state, simgpu_env):
    # Every NVML memory call takes 3 s; before, each cell waited on it several times.
    sim_state.gpu(0, total=80 * GIB).process(0, 4242, 2 * GIB).slow("memory", 3.0).write()
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "import json, time",
            "_began = time.monotonic()",
            "x = 1",
            "y = 2",
            "print(json.dumps(time.monotonic() - _began))",
            "%jaxmem status",
        ],
        env=simgpu_env,
        timeout=120,
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    # Three cells, hooks included, while NVML answers once every 3 s: no cell waited for it.
    assert _last_json(out[5]) < 1.0
    slow = re.search(r"NVML is slow: reading memory took (\d+\.\d) s", out[6].stdout)
    assert slow, out[6].stdout
    # The call sleeps 3 s; a loaded machine may add a little, never take less.
    assert 3.0 <= float(slow.group(1)) < 6.0, slow.group(0)


def test_an_interrupt_inside_a_hook_shows_no_traceback_of_ours(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    interrupt = (
        "from jax_nbmem.notebook.magics import session_of\n"
        "_session = session_of(get_ipython())\n"
        "def _interrupted(*args, **kwargs):\n"
        "    raise KeyboardInterrupt\n"
        "_session.ledger.cell_started = _interrupted\n"
        "_session.ledger.cell_finished = _interrupted\n"
    )
    out = run_cells(["%load_ext jax_nbmem", interrupt, "x = 41", "print(x + 1)"], env=simgpu_env)
    assert out[3].stdout.strip() == "42"
    for cell in out[2:]:
        assert cell.error is None
        assert "Error in callback" not in cell.text and "KeyboardInterrupt" not in cell.text


def test_failed_cells_keep_none_of_their_frames_alive(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    setup = (
        "import gc, weakref\n"
        "class Block:  # stands for a 40 MiB array held by a function that then fails\n"
        "    pass\n"
        "refs = []\n"
        "def fails():\n"
        "    block = Block()\n"
        "    refs.append(weakref.ref(block))\n"
        "    raise ValueError('bad shape')\n"
    )
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            setup,
            *["fails()"] * 5,
            "import jax_nbmem; records = jax_nbmem.cells(); gc.collect()\n"
            "last = records[-1]\n"
            "print(sum(r() is not None for r in refs), last.error, last.error_message)",
        ],
        env=simgpu_env,
    )
    assert [o.error for o in out[2:7]] == ["ValueError"] * 5
    alive, kind, message = out[7].stdout.split(maxsplit=2)
    # IPython itself keeps the last exception (sys.last_value) and its frames: one block.
    assert int(alive) <= 1
    assert (kind, message.strip()) == ("ValueError", "bad shape")


def test_a_process_list_nvml_refuses_leaves_our_bytes_unknown_with_a_reason(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).process(0, 4242, 2 * GIB).fail("processes", "UNKNOWN")
    sim_state.write()
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "import time; time.sleep(0.3)",
            RECORDS,
            "import jax_nbmem; s = jax_nbmem.status(); print(json.dumps(s['gpus'][0]['problem']))",
            "%jaxmem status",
        ],
        env=simgpu_env,
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    record = _by_cell(out[2])[2]
    assert record["gpu_count"] == 1
    assert record["gpu_self_before"] is None and record["gpu_self_after"] is None  # not 0 B
    assert "process list unreadable" in _last_json(out[3])
    assert "process list unreadable" in out[4].stdout and "no processes" not in out[4].stdout


def test_nonsense_from_nvml_is_flagged_and_status_still_answers(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB, used=2**64 - 1, free=0, raw=True, name=b"H200 \xff\x1b[2J")
    sim_state.process(0, os.getpid(), GIB)  # a real neighbour: this test's own process
    sim_state.process(0, 2**31 + 5, GIB).write()  # and a PID no process here can have
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "import json, jax_nbmem; s = jax_nbmem.status()\n"
            "print(json.dumps([s['gpus'][0], s['processes'][1]]))",
            "%jaxmem status",
        ],
        env=simgpu_env,
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    gpu, process = _last_json(out[1])
    assert gpu["used_bytes"] is None and "cannot be" in gpu["problem"]
    assert gpu["name"] == "H200 \\xff\x1b[2J"  # the data as NVML gave it, bad byte escaped
    assert process["kind"] == "unknown" and "outside this system's range" in process["reason"]
    text = out[2].stdout
    assert "\x1b" not in text and "H200 \\xff\\x1b[2J" in text  # shown inert


def test_the_text_panel_in_a_terminal_prints_once_when_asked(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    out = run_cells(["%load_ext jax_nbmem", "%jaxmem", "x = 1", "y = 2"], env=simgpu_env)
    assert "GPU 0: NVIDIA H200 (simulated)" in out[1].stdout
    assert out[2].stdout == "" and out[3].stdout == ""


def test_a_peak_is_never_below_its_cells_before_or_after(sim_state, simgpu_env):
    # Host memory falls during the cell (a big list is freed at once): the samples taken
    # while it ran are all lower than "before", which still counts as the peak.
    sim_state.gpu(0, total=80 * GIB).write()
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "blocks = [bytearray(64 << 20) for _ in range(6)]",
            "import time; time.sleep(0.3)",
            "del blocks; import gc; gc.collect(); time.sleep(0.5)",
            RECORDS,
        ],
        env=simgpu_env,
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    freed = _by_cell(out[4])[4]
    assert freed["host_rss_after"] < freed["host_rss_before"]
    assert freed["host_rss_peak"] >= freed["host_rss_before"]
    for record in _last_json(out[4]):
        for prefix in ("host_rss", "gpu_self"):
            ends = [record[f"{prefix}_before"], record[f"{prefix}_after"]]
            if record[f"{prefix}_peak"] is not None:
                assert record[f"{prefix}_peak"] >= max(e for e in ends if e is not None)


def test_the_cell_that_started_jax_is_the_one_named(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "x = 1",
            "import jax.numpy as jnp; y = jnp.ones(4)",
            "z = 3",
            "%jaxalloc off",
            "%jaxalloc",
        ],
        env=simgpu_env,
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    assert "started in cell [3]" in out[4].stdout
    assert "started in cell [3]" in out[5].stdout
