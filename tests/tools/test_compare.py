"""`%%jaxalloc compare`'s engine: real subprocesses on the CPU, and on the simulated GPU.

Each mode is a fresh Python that imports jax (about a second here), so every test runs as few
modes as it needs. The GPU side of JAX cannot run on this machine: where a test needs it, the
cell itself stands in for JAX's allocator statistics (see test_simulated_gpu...).
"""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from jax_nbmem.allocator.jaxlib import ALLOCATOR, PREALLOCATE
from jax_nbmem.allocator.modes import ModeError
from jax_nbmem.simgpu import GIB, STATE_ENV_VAR
from jax_nbmem.tools.compare.advice import recommend
from jax_nbmem.tools.compare.report import compare_figure, format_compare
from jax_nbmem.tools.compare.results import CompareResult, ModeResult
from jax_nbmem.tools.compare.run import CompareError, parse_modes, run_compare

MIB = 1024**2

CELL = f"""
import os
import jax.numpy as jnp
x = jnp.ones((256, 256))
print("sum", float((x @ x).sum()))
print("preallocate", os.environ.get("{PREALLOCATE}"), "allocator", os.environ.get("{ALLOCATOR}"))
print("cwd", os.getcwd())
def typed(x: int): ...
print("annotation", typed.__annotations__["x"].__name__)
"""


@pytest.fixture(scope="module")
def cpu_env():
    """The notebook's environment on a CPU-only machine, with a stale allocator variable."""
    env = {k: v for k, v in os.environ.items() if k != STATE_ENV_VAR}
    return {**env, "JAX_PLATFORMS": "cpu", ALLOCATOR: "platform"}


@pytest.fixture(scope="module")
def on_and_off(cpu_env):
    progress = []
    result = run_compare(
        CELL, ["on", "off"], env=cpu_env, on_progress=lambda *step: progress.append(step)
    )
    return result, progress


def _not_running(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for_file(path, process=None, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never appeared"
        assert process is None or process.poll() is None, process.communicate()
        time.sleep(0.05)
    return path.read_text()


def test_two_modes_on_cpu_report_times_and_host_memory(on_and_off):
    result, progress = on_and_off
    assert progress == [("on", "running"), ("on", "ok"), ("off", "running"), ("off", "ok")]
    assert [mode.mode for mode in result.modes] == ["on", "off"]
    assert not result.on_gpu
    for mode in result.modes:
        assert mode.state == "ok" and not mode.oom and mode.error is None
        assert 0 < mode.wall_s < mode.total_s
        assert mode.host_peak_rss_bytes > 50 * MIB  # Python with jax imported
        assert "sum 16777216.0" in mode.stdout_tail
        # What a CPU cannot tell, left empty and said.
        assert mode.jax_peak_bytes is None and mode.gpu_peak_bytes is None
        assert mode.fragmentation is None
        assert any("JAX ran on cpu" in note for note in mode.notes)
        assert any(note.startswith("no GPU memory per process (NVML)") for note in mode.notes)


def test_each_mode_runs_with_its_own_allocator_variables_only(on_and_off):
    on, off = on_and_off[0].modes
    # The notebook's stale XLA_PYTHON_CLIENT_ALLOCATOR=platform reached neither mode.
    assert "preallocate None allocator None" in on.stdout_tail
    assert "preallocate false allocator None" in off.stdout_tail
    # In the notebook's folder, so relative paths in the cell mean what they mean there.
    assert f"cwd {os.getcwd()}" in on.stdout_tail
    # As a plain script: no `from __future__` of ours leaks into the cell.
    assert "annotation int" in on.stdout_tail


def test_the_table_says_what_could_not_be_measured(on_and_off):
    result, _ = on_and_off
    lines = format_compare(result).splitlines()
    assert lines[0].split() == ["mode", "result", "time", "JAX", "peak", "GPU", "held", "peak",
                                "JAX", "pool", "free", "block", "/", "free", "in", "pool",
                                "host", "RSS", "peak"]  # fmt: skip
    on_row = lines[2].split()
    assert on_row[:2] == ["on", "ok"] and on_row[-1] == "MiB" and on_row.count("—") == 4
    assert any(line.startswith("Note: no JAX allocator figures: JAX ran on cpu") for line in lines)
    assert lines[-1] == (
        "No GPU: allocator modes do not apply on the CPU; times are shown, "
        "memory figures are host RSS."
    )
    assert result.recommendation == lines[-1]


def test_the_figure_shows_time_and_host_memory_per_mode(on_and_off):
    result, _ = on_and_off
    figure = json.loads(json.dumps(compare_figure(result)))  # plain data all the way down
    time_bars, memory_bars = figure["data"]
    assert time_bars["x"] == ["on", "off"]
    assert time_bars["y"] == [mode.wall_s for mode in result.modes]
    assert memory_bars["name"] == "host RSS peak (no GPU)"
    assert memory_bars["y"] == [mode.host_peak_rss_bytes / MIB for mode in result.modes]
    assert figure["layout"]["yaxis2"]["title"]["text"] == "MiB"


def test_a_failing_cell_reports_its_error_and_a_traceback_into_the_cell(cpu_env):
    code = "def load(shape):\n    raise ValueError(f'bad shape {shape}')\n\nload((3, 4))\n"
    result = run_compare(code, ["off"], env=cpu_env)
    (off,) = result.modes
    assert off.state == "error" and off.error == "ValueError: bad shape (3, 4)"
    assert 'File "<cell>", line 2, in load' in off.traceback
    assert "raise ValueError(f'bad shape {shape}')" in off.traceback
    assert "compare/child.py" not in off.traceback
    text = format_compare(result)
    assert "off: error: ValueError: bad shape (3, 4)" in text
    assert text.endswith(
        "Nothing to compare: no mode ran the cell to the end (see the errors above)."
    )


def test_a_name_defined_in_the_notebook_gets_the_self_contained_message(cpu_env):
    result = run_compare("doubled = notebook_array * 2\n", ["on"], env=cpu_env)
    (on,) = result.modes
    assert on.state == "error" and on.error.startswith("NameError")
    hint = (
        "the cell must be self-contained: notebook_array is not defined in the subprocess "
        "(define or import it inside the cell)"
    )
    assert on.hint == hint
    assert f"  {hint}." in format_compare(result).splitlines()
    assert result.recommendation == f"Nothing to compare: {hint}."


def test_out_of_memory_in_one_mode_is_told_apart_from_other_errors(cpu_env):
    code = (
        "import os\nfrom jax.errors import JaxRuntimeError\n"
        f"if os.environ.get('{PREALLOCATE}') != 'false':\n"
        "    raise JaxRuntimeError('RESOURCE_EXHAUSTED: Out of memory allocating 16 GiB')\n"
    )
    result = run_compare(code, ["on", "off"], env=cpu_env)
    on, off = result.modes
    assert on.state == "oom" and on.oom and on.state_text == "out of memory"
    assert off.state == "ok" and not off.oom
    assert "on: out of memory: JaxRuntimeError: RESOURCE_EXHAUSTED" in format_compare(result)


def test_a_timeout_stops_the_cell_and_what_it_started(cpu_env, tmp_path):
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, sys, time\n"
        "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{helper.pid}}')\n"
        "print('helper started', flush=True)\n"
        "time.sleep(120)\n"
    )
    result = run_compare(code, ["off"], env=cpu_env, timeout_s=5)
    (off,) = result.modes
    assert off.state == "timeout" and "timeout" in off.error
    assert "helper started" in off.stdout_tail
    assert off.wall_s is not None  # stopped gently: it still reported what it measured
    child, helper = map(int, pids.read_text().split())
    assert _not_running(child) and _not_running(helper)


def test_ctrl_c_stops_the_running_mode_and_is_raised_again(cpu_env, tmp_path):
    pids = tmp_path / "pids"
    cell = (
        "import os, subprocess, sys, time\n"
        "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{helper.pid}}')\n"
        "time.sleep(120)\n"
    )
    notebook = (
        "from jax_nbmem.tools.compare.run import run_compare\n"
        f"run_compare({cell!r}, ['on', 'off'], on_progress=lambda *step: print(*step, flush=True))"
    )
    kernel = subprocess.Popen(
        [sys.executable, "-c", notebook], env=cpu_env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for_file(pids, kernel)
        kernel.send_signal(signal.SIGINT)
        out, err = kernel.communicate(timeout=30)
    finally:
        kernel.kill()
    assert kernel.returncode != 0 and "KeyboardInterrupt" in err
    assert out.splitlines() == ["on running", "on interrupted"]  # off never started
    child, helper = map(int, pids.read_text().split())
    assert _not_running(child) and _not_running(helper)


def test_bad_modes_and_cells_are_refused_before_anything_runs():
    progress = []
    with pytest.raises(ModeError, match="unknown mode 'turbo'"):
        run_compare("print(1)", ["on", "turbo"], on_progress=lambda *step: progress.append(step))
    with pytest.raises(ModeError, match="given twice"):
        run_compare("print(1)", ["off", "off"], on_progress=lambda *step: progress.append(step))
    with pytest.raises(CompareError, match="magics"):
        run_compare("%timeit sum(range(10))", on_progress=lambda *step: progress.append(step))
    with pytest.raises(CompareError, match="empty"):
        run_compare("  \n", on_progress=lambda *step: progress.append(step))
    assert progress == []
    # As the magic hands them over: split on spaces, "fraction" keeps its number.
    assert [str(mode) for mode in parse_modes(["off", "fraction", "0.5", "platform"])] == [
        "off", "fraction 0.5", "platform",
    ]  # fmt: skip
    assert [str(mode) for mode in parse_modes([])] == ["on", "off", "platform"]


# The cell writes the simulated GPU's state for its own pid (what a JAX allocation looks like to
# NVML) and, since JAX itself runs on the CPU here, stands in for JAX's GPU allocator statistics.
SIM_CELL = f"""
import os, time
import jax_nbmem.gpu.jaxstats as jaxstats
from jax_nbmem.simgpu import SimState

GIB = 1024**3
preallocating = os.environ.get("{PREALLOCATE}") != "false"

def hold(n_bytes):
    state = SimState(os.environ["{STATE_ENV_VAR}"]).gpu(0, total=80 * GIB)
    state.process(0, 4242, 10 * GIB)  # a neighbour: not ours
    state.process(0, os.getpid(), n_bytes).write()

hold(60 * GIB if preallocating else 3 * GIB)
time.sleep(0.3)
hold(60 * GIB if preallocating else 1 * GIB)
time.sleep(0.1)

# Preallocated: a 60 GiB pool, 59 GiB free in it, in pieces of 20. Off: the pool grew to the
# 3 GiB peak; 2 GiB free in it, in one piece. XLA's bytes_reserved is 0 on every GPU.
stats = jaxstats.DeviceStats(0, "gpu", "H200 (simulated)", bytes_in_use=1 * GIB,
    peak_bytes_in_use=3 * GIB, bytes_reserved=0, bytes_limit=60 * GIB,
    largest_free_block_bytes=(20 if preallocating else 2) * GIB,
    pool_bytes=(60 if preallocating else 3) * GIB)
jaxstats.device_stats = lambda: [stats]
"""


def test_simulated_gpu_nvml_peak_is_this_subprocess_own(simgpu_env, sim_state):
    sim_state.gpu(0, total=80 * GIB).process(0, 4242, 10 * GIB).write()
    result = run_compare(SIM_CELL, ["on", "off"], env={**simgpu_env, "JAX_PLATFORMS": "cpu"})
    on, off = result.modes
    assert (on.state, off.state) == ("ok", "ok") and result.on_gpu
    assert on.gpu_peak_bytes == 60 * GIB and off.gpu_peak_bytes == 3 * GIB
    assert on.gpu_total_bytes == off.gpu_total_bytes == 80 * GIB
    assert on.jax_peak_bytes == off.jax_peak_bytes == 3 * GIB
    assert on.fragmentation == "largest free block 20.0 GiB of 59.0 GiB free in the pool (34%)"
    # `off` is not fragmented: its free room inside its small pool is all one block.
    assert off.fragmentation == "largest free block 2.00 GiB of 2.00 GiB free in the pool (100%)"
    assert (on.jax_pool_bytes, off.jax_pool_bytes) == (60 * GIB, 3 * GIB)
    assert not any("NVML" in note for note in on.notes + off.notes)
    rows = format_compare(result).splitlines()[2:4]
    assert rows[0].split()[:8] == ["on", "ok", *rows[0].split()[2:4], "3.00", "GiB", "60.0", "GiB"]
    assert rows[0].split()[8:10] == ["60.0", "GiB"]  # the pool
    assert "20.0 GiB / 59.0 GiB" in rows[0] and "2.00 GiB / 2.00 GiB" in rows[1]
    names = [trace["name"] for trace in compare_figure(result)["data"]]
    assert names == ["time (s)", "JAX peak", "GPU held peak (NVML)"]


def _gpu_mode(name, wall_s, held, state="ok"):
    return ModeResult(name, state, wall_s=wall_s, on_gpu=True, gpu_peak_bytes=held,
                      gpu_total_bytes=140 * GIB)  # fmt: skip


def test_recommendation_takes_a_little_time_for_a_lot_of_memory():
    on = _gpu_mode("on", 1.00, 105 * GIB)
    off = _gpu_mode("off", 1.03, int(1.2 * GIB))
    platform = _gpu_mode("platform", 2.5, int(1.1 * GIB))
    assert recommend([on, off, platform]) == (
        "Use off: 3% slower than on but peaks at 1.20 GiB instead of holding 105 GiB "
        "(75% of the GPU)."
    )
    # Too slow for what it saves: the fastest stays, and the trade-off is named.
    assert recommend([on, platform]) == (
        "Use on: fastest; platform peaks at 1.10 GiB instead of 105 GiB (75% of the GPU) "
        "but is 150% slower."
    )


def test_recommendation_names_modes_that_failed_and_unknown_footprints():
    on = _gpu_mode("on", 1.0, None, state="oom")
    off = _gpu_mode("off", 1.2, 2 * GIB)
    platform = _gpu_mode("platform", 1.1, 2 * GIB)
    assert recommend([on, off, platform]) == (
        "Use platform: fastest (1.10 s) and it holds no more GPU memory than the others "
        "(2.00 GiB); on out of memory."
    )
    assert recommend([off, _gpu_mode("platform", 1.5, None)]) == (
        "Use off: fastest (1.20 s); memory footprints not compared, NVML could not measure "
        "them all."
    )
    assert recommend([on, _gpu_mode("off", None, None, state="oom")]) == (
        "Every mode ran out of GPU memory: the cell needs more than this GPU has free."
    )
    assert isinstance(CompareResult((off,), recommend([off])).to_dict()["modes"][0], dict)


def test_the_gpu_table_marks_lower_bounds_and_says_which_modes_a_note_concerns():
    peak_note = "no JAX peak: this allocator does not report peak_bytes_in_use"
    modes = (
        ModeResult("on", "ok", wall_s=1.0, on_gpu=True, jax_peak_bytes=GIB,
                   gpu_peak_bytes=105 * GIB, jax_free_bytes=100 * GIB,
                   largest_free_block_bytes=30 * GIB),
        ModeResult("platform", "timeout", wall_s=600.0, on_gpu=True, notes=(peak_note,),
                   error="stopped after the 10 min 00 s timeout"),
    )  # fmt: skip
    lines = format_compare(CompareResult(modes, recommend(modes))).splitlines()
    assert lines[2].split()[:3] == ["on", "ok", "1.00"]
    assert "30.0 GiB / 100 GiB" in lines[2]
    assert lines[3].split()[:5] == ["platform", "timed", "out", "≥10", "min"]
    assert f"Note (platform): {peak_note}." in lines
    assert "platform: timed out: stopped after the 10 min 00 s timeout" in lines
    assert lines[-1] == "Use on: the only mode that finished the cell; platform timed out."
    assert modes[0].fragmentation == "largest free block 30.0 GiB of 100 GiB free in the pool (30%)"


def test_the_kernel_s_own_memory_on_a_mig_instance_is_named_by_its_label(
    simgpu_in_process, cpu_env
):
    sim = simgpu_in_process
    sim.gpu(0, total=141 * GIB, mig=True)
    sim.mig(0, 1, 18 * GIB, name="NVIDIA H200 MIG 1g.18gb")
    sim.mig(0, 2, 71 * GIB, name="NVIDIA H200 MIG 3g.71gb")
    sim.process(0, os.getpid(), 2 * GIB, mig=2).write()
    result = run_compare("x = 1", ["off"], env=cpu_env)
    assert (
        "this kernel holds 2.00 GiB on MIG 3g.71gb instance 2 of GPU 0 while the modes run; "
        "modes that preallocate have that much less room"
    ) in result.notes
