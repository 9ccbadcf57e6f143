"""benchmarks/gpu_check.py on a machine without a usable GPU: it says so and exits cleanly."""

import importlib.util
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


# --- the decision logic, on recorded readings (it cannot run here) ---------------------------

GIB = 1 << 30
MIB = 1 << 20
TOTAL = 143_771 * MIB  # an H200 as NVML counts it


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reading(self_bytes, pool=None, in_use=1 << 20, limit=None, listed=True):
    """One row of readings(), as a healthy driver and nvidia-smi would give it."""
    used = self_bytes + 2 * GIB if self_bytes is not None else 2 * GIB
    return {
        "jax_bytes_in_use": in_use, "jax_peak_bytes_in_use": in_use, "jax_bytes_reserved": 0,
        "jax_bytes_limit": limit, "jax_pool_bytes": pool, "jax_peak_pool_bytes": pool,
        "jax_largest_free_block_bytes": None,
        "nvml_used": used, "nvml_reserved": 0, "nvml_total": TOTAL, "nvml_free": TOTAL - used,
        "nvml_self": self_bytes if listed else None, "nvml_pids": [77] if listed else [1, 2],
        "smi_used": used, "smi_total": TOTAL, "smi_self": self_bytes if listed else None,
        "smi_pids": ["77"], "pid": 77,
    }  # fmt: skip


def mode_result(name, start, grown, freed):
    return {"mode": name, "start_s": 3.0, "wall_s": 20.0, "start": start,
            "after_1gib": grown, "after_free": freed}  # fmt: skip


def healthy_results(context=400 * MIB):
    on_pool = int(0.75 * TOTAL) - 300 * MIB  # CUDA's total is a little under NVML's
    async_pool = int(0.75 * TOTAL)
    on = reading(on_pool + context, pool=on_pool, limit=on_pool)
    off = reading(context + 2 * MIB, pool=2 * MIB, limit=on_pool)
    off_grown = reading(context + GIB + 2 * MIB, pool=GIB + 2 * MIB, limit=on_pool)
    platform = reading(context)
    platform_grown = reading(context + GIB)
    cuda_async = reading(async_pool + context, limit=async_pool)  # no pool_bytes reported
    return [
        mode_result("on", on, on, on),
        mode_result("off", off, off_grown, off_grown),
        mode_result("platform", platform, platform_grown, platform),
        mode_result("cuda_async", cuda_async, cuda_async, cuda_async),
    ]


def test_healthy_readings_pass_and_cuda_async_is_expected_to_preallocate():
    check = _gpu_check()
    results = healthy_results()
    verdicts = [(r["mode"], *c) for r in results for c in check.checks(r)]
    assert [v for v in verdicts if v[2] is False] == []
    status, reason = check.verdict(results, verdicts)
    assert (status, reason) == (0, None)
    footprint = [v for v in verdicts if v[0] == "cuda_async" and v[1].startswith("footprint")]
    assert footprint and footprint[0][2] is True  # its pool, ~75%, is what it should hold


def test_the_window_is_calibrated_from_pool_bytes_and_the_context():
    check = _gpu_check()
    rows = {row["mode"]: row for row in check.calibration(healthy_results(context=700 * MIB))}
    assert rows["on"]["context"] == 700 * MIB
    assert rows["on"]["below"] == int(0.75 * TOTAL) - rows["on"]["pool"]
    assert rows["cuda_async"]["pool"] == int(0.75 * TOTAL)  # its limit stands for the pool
    # A context too large for jax_nbmem's window shows up as a failed check, not a pass.
    big = healthy_results(context=3 * GIB)
    failed = [c for c in check.checks(big[0]) if c[1] is False]
    assert any("preallocation window" in c[0] for c in failed)


def test_a_process_nvml_does_not_list_cannot_be_verified():
    check = _gpu_check()
    hidden = reading(int(0.75 * TOTAL), pool=int(0.75 * TOTAL), listed=False)
    results = [mode_result("on", hidden, hidden, hidden)]
    verdicts = [(r["mode"], *c) for r in results for c in check.checks(r)]
    status, reason = check.verdict(results, verdicts)
    assert status == 3 and reason.startswith("cannot verify: NVML does not list this process")


def test_a_mode_that_holds_the_wrong_share_or_crashes_fails():
    check = _gpu_check()
    results = healthy_results()
    results[1] = mode_result("off", *[reading(int(0.75 * TOTAL), pool=int(0.75 * TOTAL))] * 3)
    results.append({"mode": "fraction 0.3", "error": "timed out after 60 s"})
    verdicts = [(r["mode"], *c) for r in results if "start" in r for c in check.checks(r)]
    status, reason = check.verdict(results, verdicts)
    assert status == 1
    assert "off: footprint at start" in reason and "fraction 0.3: timed out" in reason


def test_cuda_visible_devices_set_by_the_user_is_kept(monkeypatch):
    check = _gpu_check()
    from jax_nbmem.gpu.nvml import GpuMemory

    gpus = [GpuMemory(i, f"GPU-{i}aaaa", "H200", TOTAL, 0, TOTAL) for i in range(2)]
    monkeypatch.setattr(check.nvml, "gpus", lambda: gpus)
    index, devices, how = check.target_gpu(0, {"CUDA_VISIBLE_DEVICES": "GPU-1aaaa"})
    assert (index, devices) == (1, {})  # passed on untouched: the UUID picks GPU 1
    index, devices, how = check.target_gpu(0, {})
    assert (index, devices) == (0, {"CUDA_VISIBLE_DEVICES": "GPU-0aaaa"})  # by UUID, not index
