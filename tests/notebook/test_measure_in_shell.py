"""Issue 3 end to end: real IPython shells, the real pynvml, a simulated GPU in a C library.

Each shell runs in its own process with the stand-in libnvidia-ml.so.1 on LD_LIBRARY_PATH, as a
kernel on a GPU machine would load the real one. Cells change the simulated state for their own
PID, which is what a JAX allocation looks like to NVML.
"""

import json

import pytest

from jax_nbmem.simgpu import GIB
from tests.ipython_session import run_cells

UUID = "GPU-11111111-2222-3333-4444-555555555555"
OTHER = "GPU-99999999-8888-7777-6666-555555555555"

SETUP = f"""
import json, os, time
import jax_nbmem
from jax_nbmem.simgpu import GIB, SimState
_path = os.environ["JAX_NBMEM_SIMGPU_STATE"]

def hold(n_bytes, lost=False):
    state = SimState(_path).gpu(0, total=80 * GIB, uuid="{UUID}")
    state.process(0, 4242, 2 * GIB)  # a neighbour
    if n_bytes:
        state.process(0, os.getpid(), n_bytes)
    if lost:
        state.lose(0)
    state.write()

hold(1 * GIB)
"""

RECORDS = "print(json.dumps([c.to_dict() for c in jax_nbmem.cells()]))"


def _json(output):
    return json.loads(output.stdout.strip().splitlines()[-1])


@pytest.fixture
def gpu_env(simgpu_env, sim_state):
    sim_state.gpu(0, total=80 * GIB, uuid=UUID).write()
    return simgpu_env


def test_cells_record_before_peak_after_including_a_300ms_transient(gpu_env):
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            SETUP + "time.sleep(0.3)  # the user reads the output",
            "hold(5 * GIB); time.sleep(0.3); hold(1 * GIB); time.sleep(0.05)",
            "time.sleep(0.3)",
            "hold(3 * GIB)",
            "time.sleep(0.3)",
            RECORDS,
            "%jaxmem cells",
        ],
        env=gpu_env,
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    records = {r["execution_count"]: r for r in _json(out[6])}
    transient, retained = records[3], records[5]
    assert transient["gpu_self_before"] == 1 * GIB
    assert transient["gpu_self_peak"] == 5 * GIB
    assert transient["gpu_self_after"] == 1 * GIB
    assert transient["gpu_self_retained"] == 0
    # Free memory at the start: 80 GiB − 500 MiB driver − 2 GiB neighbour − our 1 GiB.
    assert transient["free_at_start"] == 80 * GIB - (500 << 20) - 3 * GIB
    assert transient["free_min"] == transient["free_at_start"] - 4 * GIB
    assert retained["gpu_self_before"] == 1 * GIB
    assert retained["gpu_self_after"] == 3 * GIB
    assert retained["gpu_self_retained"] == 2 * GIB
    assert retained["success"] is True and retained["oom"] is False
    for record in (transient, retained):
        # The "after" reading is taken after the cell and before the next one starts, by the
        # sampler's thread or, when the next cell comes first (a script, not a person), by
        # the next cell's start: its delay says when, and nothing is left to note.
        following = records[record["execution_count"] + 1]
        ended = record["started_at"] + record["duration_s"]
        assert 0 <= record["gpu_after_delay_s"] <= following["started_at"] - ended, record
        assert record["notes"] == [] and record["span_start"] is None, record
    table = out[7].stdout
    assert "5.00 GiB" in table and "+2.00 GiB" in table


def test_status_attributes_this_kernel_and_the_neighbour(gpu_env):
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            SETUP,
            "print(json.dumps(jax_nbmem.status()))",
            "%jaxmem status",
        ],
        env=gpu_env,
    )
    report = _json(out[2])
    assert report["nvml"] == {"available": True, "reason": None, "driver_version": "550.54.15"}
    (gpu,) = report["gpus"]
    assert gpu["uuid"] == UUID and gpu["total_bytes"] == 80 * GIB and gpu["ours"] is True
    by_pid = {p["pid"]: p for p in report["processes"]}
    me = next(p for p in report["processes"] if p["kind"] == "self")
    assert me["used_bytes"] == 1 * GIB
    assert by_pid[4242]["used_bytes"] == 2 * GIB
    assert "NVIDIA H200 (simulated)" not in out[3].stdout or "GPU 0" in out[3].stdout
    # A terminal IPython session is named as such, not as a kernel.
    assert "this IPython session" in out[3].stdout and "1.00 GiB" in out[3].stdout
    assert "this kernel" not in out[3].stdout


def test_gpu_lost_mid_cell_costs_no_exception_and_is_said(gpu_env):
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            SETUP,
            "hold(2 * GIB, lost=True); time.sleep(0.5)",
            "%jaxmem status",
            "hold(1 * GIB); time.sleep(1.5)",
            RECORDS,
            "%jaxmem cells",
        ],
        env=gpu_env,
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    assert "Traceback" not in "".join(o.text for o in out)
    assert "lost" in out[3].stdout.lower()
    lost_cell = {r["execution_count"]: r for r in _json(out[5])}[3]
    assert lost_cell["gpu_self_after"] is None  # not known, and not guessed as 0
    assert "—" in out[6].stdout


def test_without_nvml_everything_still_runs_and_says_why():
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            "import jax.numpy as jnp; x = jnp.ones((512, 512))",
            "import jax_nbmem, json; print(json.dumps(jax_nbmem.status()))",
            "%jaxmem cells",
        ],
        env={"LD_LIBRARY_PATH": "/nonexistent"},
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    report = _json(out[2])
    assert report["nvml"]["available"] is False
    assert "not found" in report["nvml"]["reason"]
    assert report["host"]["live_array_bytes"] == 512 * 512 * 4
    assert "host memory" in out[3].stdout


def test_old_driver_without_newer_functions_still_measures(simgpu_old_driver_lib, sim_state):
    from jax_nbmem.simgpu import env_for_subprocess

    sim_state.gpu(0, total=80 * GIB, uuid=UUID).write()
    env = env_for_subprocess(simgpu_old_driver_lib.parent, sim_state.path)
    setup = SETUP + "time.sleep(0.3)"
    out = run_cells(["%load_ext jax_nbmem", setup, "hold(4 * GIB)", RECORDS], env=env)
    assert all(o.error is None for o in out), [o.text for o in out]
    cell = {r["execution_count"]: r for r in _json(out[3])}[3]
    import pynvml

    if hasattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v2"):
        assert (cell["gpu_self_before"], cell["gpu_self_after"]) == (1 * GIB, 4 * GIB)
    else:  # an nvidia-ml-py that only calls _v3, which this driver lacks: unknown, not 0
        assert (cell["gpu_self_before"], cell["gpu_self_after"]) == (None, None)


def test_unload_leaves_no_thread_and_reload_starts_one(gpu_env):
    threads = "import threading; print(sorted(t.name for t in threading.enumerate()))"
    out = run_cells(
        [
            "%load_ext jax_nbmem",
            threads,
            "%unload_ext jax_nbmem",
            threads,
            "%load_ext jax_nbmem",
            threads,
        ],
        env=gpu_env,
    )
    assert "jax_nbmem-sampler" in out[1].stdout
    assert "jax_nbmem" not in out[3].stdout
    assert out[5].stdout.count("jax_nbmem-sampler") == 1


def test_two_thousand_cells_stay_bounded(gpu_env):
    cells = [
        "%load_ext jax_nbmem",
        "get_ipython().config.JaxNbMem.max_cells = 500",
        "%reload_ext jax_nbmem",
        SETUP,
    ]
    cells += [f"y = {i}" for i in range(2000)]
    cells += [
        "from jax_nbmem.notebook.magics import session_of; s = session_of(get_ipython()); "
        "print(json.dumps([len(jax_nbmem.cells()), len(s.sampler.history()), "
        "jax_nbmem.cells()[-1].execution_count]))"
    ]
    out = run_cells(cells, env=gpu_env, timeout=300)
    assert all(o.error is None for o in out[-5:])
    n_cells, n_samples, last = _json(out[-1])
    assert n_cells == 500
    assert last == len(cells) - 1
    assert n_samples <= 20_000


def test_cli_status_without_nvml_exits_0_with_an_honest_reason():
    import subprocess
    import sys

    from tests.ipython_session import clean_environ

    env = {**clean_environ(), "LD_LIBRARY_PATH": "/nonexistent"}
    command = [sys.executable, "-m", "jax_nbmem.cli", "status"]
    as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env)
    as_text = subprocess.run(command, capture_output=True, text=True, env=env)
    assert as_json.returncode == 0 and as_text.returncode == 0
    report = json.loads(as_json.stdout)
    assert set(report) >= {"nvml", "gpus", "processes", "warnings"}
    assert report["nvml"]["available"] is False and "not found" in report["nvml"]["reason"]
    assert report["gpus"] == [] and report["processes"] == [] and report["warnings"] == []
    assert "NVML unavailable" in as_text.stdout and "not found" in as_text.stdout


def test_cli_status_on_the_simulated_gpu_lists_gpus_and_processes(gpu_env, sim_state):
    import subprocess
    import sys

    sim_state.gpu(0, total=80 * GIB, uuid=UUID).gpu(1, total=40 * GIB, uuid=OTHER)
    sim_state.process(1, 4242, 3 * GIB).write()
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "status", "--json"],
        capture_output=True, text=True, env={**gpu_env, "CUDA_VISIBLE_DEVICES": "1"},
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert [(g["index"], g["uuid"], g["ours"]) for g in report["gpus"]] == [
        (0, UUID, False),
        (1, OTHER, True),
    ]
    (process,) = report["processes"]
    assert (process["pid"], process["gpu"], process["used_bytes"]) == (4242, 1, 3 * GIB)


def test_deprecated_pynvml_package_warning_stays_out_of_cells(gpu_env, tmp_path):
    # The deprecated `pynvml` PyPI package wraps nvidia-ml-py's module and warns on import.
    # This stand-in does the same, on top of the real module, found first on the path.
    import importlib.util

    real_file = importlib.util.find_spec("pynvml").origin
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pynvml.py").write_text(
        "import importlib.util, sys, warnings\n"
        "warnings.warn('The pynvml package is deprecated. Please install nvidia-ml-py "
        "instead.', FutureWarning, stacklevel=2)\n"
        f"_spec = importlib.util.spec_from_file_location('_real_pynvml', {real_file!r})\n"
        "_real = sys.modules['_real_pynvml'] = importlib.util.module_from_spec(_spec)\n"
        "_spec.loader.exec_module(_real)\n"
        "globals().update({k: v for k, v in vars(_real).items() if not k.startswith('__')})\n"
    )
    out = run_cells(
        [
            "import warnings; warnings.simplefilter('default')",
            "%load_ext jax_nbmem",
            SETUP,
            "%jaxmem status",
            "import pynvml, sys; print(sys.modules['pynvml'].__file__)",
        ],
        env={**gpu_env, "PYTHONPATH": str(shim)},
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    assert str(shim) in out[4].stdout  # the stand-in was the module in use
    assert "GPU 0" in out[3].stdout and "this IPython session" in out[3].stdout
    ours = out[:4]  # the last cell prints a path, which holds this test's name
    assert not any("FutureWarning" in o.text or "deprecated" in o.text for o in ours)
