"""The status report as a person and a machine read it: `jax-nbmem status`, `%jaxmem status`.

Real processes against the simulated GPU: the CLI in a fresh Python, the magics in a real
IPython session.
"""

from __future__ import annotations

import json
import subprocess
import sys

from jax_nbmem.simgpu import GIB
from tests.ipython_session import run_cells

MIB = 1024**2
BASE_USED = 0  # R510+ drivers (the simulated one's default): used is the processes' memory


def _cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "status", *args],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_used_is_what_nvidia_smi_shows_and_the_reserved_memory_is_said_apart(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB, reserved=512 * MIB).process(0, 4242, 4 * GIB).write()
    [gpu] = json.loads(_cli("--json", env=simgpu_env))["gpus"]
    assert gpu["used_bytes"] == 4 * GIB + BASE_USED  # nvidia-smi's "used", without reserved
    assert gpu["reserved_bytes"] == 512 * MIB
    assert gpu["free_bytes"] == 80 * GIB - 512 * MIB - 4 * GIB - BASE_USED
    assert gpu["used_bytes"] + gpu["reserved_bytes"] + gpu["free_bytes"] == gpu["total_bytes"]
    line = (
        "GPU 0: NVIDIA H200 (simulated) — 4.00 GiB used of 80.0 GiB, 75.5 GiB free, "
        "512 MiB reserved by the driver"
    )
    assert line in _cli(env=simgpu_env).splitlines()
    out = run_cells(
        ["%load_ext jax_nbmem", "import time; time.sleep(0.3)", "%jaxmem status", "%jaxmem"],
        env=simgpu_env,
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    assert line in out[2].stdout.splitlines()
    header = out[3].stdout.splitlines()[0]  # the panel, as a frontend without widgets shows it
    assert header.endswith("free 75.5 GiB of 80.0 GiB · 512 MiB reserved by the driver")


def test_a_lost_gpu_is_said_once(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).gpu(1, total=80 * GIB).process(0, 4242, GIB)
    sim_state.process(1, 4343, GIB).fail("memory", "GPU_IS_LOST", 1).write()
    report = json.loads(_cli("--json", env=simgpu_env))
    lost = report["gpus"][1]
    assert lost["used_bytes"] is None and lost["problem"].count("GPU 1 is lost") == 1
    assert "process list unreadable" in lost["problem"]  # who is on it is unknown too
    assert report["gpus"][0]["problem"] is None
    text = _cli(env=simgpu_env)
    assert text.count("GPU 1 is lost") == 1
    after = text.split("GPU 1: ", 1)[1]
    assert "no processes" not in after.split("\nGPU ", 1)[0]  # unknown, not none
    out = run_cells(["%load_ext jax_nbmem", "import time; time.sleep(0.3)", "%jaxmem"], simgpu_env)
    [panel_line] = [line for line in out[2].stdout.splitlines() if line.startswith("GPU 1: GPU")]
    assert panel_line.count("GPU 1 is lost") == 1 and "process list unreadable" in panel_line
