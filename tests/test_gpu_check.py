"""benchmarks/gpu_check.py on a machine without a usable GPU: it says so and exits cleanly."""

import os
import stat
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def run_check(path: str, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_NBMEM"))}
    env.update(PATH=path, LD_LIBRARY_PATH="/nonexistent", JAX_PLATFORMS="")
    return subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_without_a_gpu_it_says_nothing_to_check_and_exits_zero(tmp_path):
    done = run_check(str(tmp_path), timeout=60)  # an empty PATH: no nvidia-smi anywhere
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no NVIDIA GPU: nothing to check (nvidia-smi not found)"


def test_a_gpu_that_jax_cannot_use_gives_exit_status_2(tmp_path):
    # nvidia-smi lists a GPU, but the installed JAX has only its CPU backend.
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\necho "NVIDIA H200"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    done = run_check(f"{tmp_path}{os.pathsep}{os.environ['PATH']}", timeout=240)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "installed JAX has no CUDA backend" in done.stdout
    # Every mode got its row, saying why it was not measured.
    for mode in ("on", "off", "platform", "cuda_async", "fraction 0.3"):
        assert f"| {mode} |" in done.stdout
