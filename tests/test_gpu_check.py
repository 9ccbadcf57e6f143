"""benchmarks/gpu_check.py on a machine without a usable GPU: it says so and exits cleanly."""

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

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


# --- a MIG instance (the lent GPU may have MIG on) ------------------------------------------

MIG_TOTAL = 71 * GIB


def mig_reading(self_bytes, pool=None, parent_total=TOTAL, listed=True):
    """readings() on a MIG instance: the instance's own NVML figures, nothing from nvidia-smi."""
    found = reading(self_bytes, pool=pool, limit=pool, listed=listed)
    used = found["nvml_used"]
    found.update(
        nvml_total=MIG_TOTAL, nvml_free=MIG_TOTAL - used, smi_used=None, smi_total=None,
        smi_self=None, smi_pids=[],
        mig={"label": "MIG 3g.71gb instance 1 of GPU 0", "profile": "3g.71gb",
             "gpu_instance_id": 1, "parent_index": 0, "uuid": "MIG-x",
             "parent_total": parent_total,
             "parent_problem": None if parent_total else "GPU 0 is in MIG mode: ..."},
    )  # fmt: skip
    return found


def test_on_a_mig_instance_the_share_is_of_the_instance_and_smi_is_unknown():
    check = _gpu_check()
    pool = int(0.75 * MIG_TOTAL) - 200 * MIB
    on = mig_reading(pool + 400 * MIB, pool=pool)
    results = [mode_result("on", on, on, on)]
    found = {c[0]: c for c in check.checks(results[0])}
    assert found["footprint at start in [70%, 80%]"][1] is True  # of 71 GiB, not of the GPU
    assert found["MIG: jax_nbmem names the instance"][1:] == (
        True,
        "MIG 3g.71gb instance 1 of GPU 0",
    )
    assert found["MIG: the instance's total is below the GPU's"][1] is True
    assert found["MIG: NVML lists this process on the instance"][1] is True
    assert found["start: GPU used = nvidia-smi"][1] is None  # nvidia-smi has no instance figure
    verdicts = [("on", *c) for c in check.checks(results[0])]
    assert check.verdict(results, verdicts) == (0, None)
    # A user other than root: the GPU's own total is unread, so that check is unknown, said why.
    hidden = mig_reading(pool + 400 * MIB, pool=pool, parent_total=None)
    below = {c[0]: c for c in check.checks(mode_result("on", hidden, hidden, hidden))}
    assert below["MIG: the instance's total is below the GPU's"][1:] == (
        None, "GPU 0 is in MIG mode: ..."
    )  # fmt: skip
    # A pool that is not 75% of the instance's memory fails, judged by the instance's figures.
    wrong = mig_reading(int(0.3 * MIG_TOTAL), pool=int(0.3 * MIG_TOTAL))
    failed = [c for c in check.checks(mode_result("on", wrong, wrong, wrong)) if c[1] is False]
    assert {c[0] for c in failed} == {
        "footprint at start in [70%, 80%]", "jax_nbmem's preallocation window holds this process"
    }  # fmt: skip


def test_a_gpu_in_mig_mode_is_checked_on_its_first_instance(monkeypatch):
    check = _gpu_check()
    from jax_nbmem.gpu.mig import MigInstance
    from jax_nbmem.gpu.nvml import GpuMemory

    place = MigInstance(0, "GPU-0aaaa", 1, 0, "3g.71gb")
    gpus = [
        GpuMemory(0, "GPU-0aaaa", "H200", None, None, None, mig_mode=True),
        GpuMemory(1, "GPU-1aaaa", "H200", TOTAL, 0, TOTAL),
        GpuMemory(2, "MIG-2bbbb", "H200 MIG 3g.71gb", MIG_TOTAL, 0, MIG_TOTAL, mig=place),
    ]
    monkeypatch.setattr(check.nvml, "gpus", lambda: gpus)
    index, devices, how = check.target_gpu(0, {})
    assert (index, devices) == (2, {"CUDA_VISIBLE_DEVICES": "MIG-2bbbb"})
    assert "MIG 3g.71gb instance 1 of GPU 0" in how
    assert check.target_gpu(0, {"CUDA_VISIBLE_DEVICES": "MIG-2bbbb"})[:2] == (2, {})
    assert check.target_gpu(1, {})[:2] == (1, {"CUDA_VISIBLE_DEVICES": "GPU-1aaaa"})
    no_instance = [gpus[0], gpus[1]]
    monkeypatch.setattr(check.nvml, "gpus", lambda: no_instance)
    index, _, how = check.target_gpu(0, {})
    assert index is None and "lists no instance" in how


@pytest.mark.skipif(
    os.geteuid() != 0, reason="reads a GPU in MIG mode as root does: NVML lets only root"
)
def test_readings_on_the_simulated_mig_instance_ask_nvidia_smi_nothing(
    simgpu_in_process, monkeypatch
):
    check = _gpu_check()
    sim = simgpu_in_process
    sim.gpu(0, total=141 * GIB, mig=True).mig(0, 1, MIG_TOTAL, name="NVIDIA H200 MIG 3g.71gb")
    sim.process(0, os.getpid(), 54 * GIB, mig=1).write()
    monkeypatch.setattr(check, "smi", lambda *a: pytest.fail(f"nvidia-smi asked: {a}"))

    class Device:
        def memory_stats(self):
            return {"bytes_in_use": MIB, "pool_bytes": 53 * GIB, "bytes_limit": 53 * GIB}

    found = check.readings(Device(), 1)
    assert (found["nvml_total"], found["nvml_self"]) == (MIG_TOTAL, 54 * GIB)
    assert found["smi_used"] is None and found["smi_self"] is None
    assert found["mig"]["label"] == "MIG 3g.71gb instance 1 of GPU 0"
    assert found["mig"]["parent_total"] == 141 * GIB
    result = mode_result("on", found, found, found)
    assert all(c[1] is not False for c in check.checks(result)), check.checks(result)


# --- the source's cases (benchmarks/gpu_check_cases.py), on recorded readings ---------------


def _cases():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        return _gpu_check().gpu_check_cases
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_each_case_is_judged_by_what_the_source_says():
    cases = _cases()
    vmm = {"case": "vmm", "total": TOTAL, "stats_start": None, "self_start": 500 * MIB,
           "self_grown": 1524 * MIB, "self_freed": 1524 * MIB}  # fmt: skip
    assert all(passed for _, passed, _ in cases.case_checks(vmm))
    vmm_with_stats = {**vmm, "stats_start": {"bytes_in_use": 0}}
    assert [p for _, p, _ in cases.case_checks(vmm_with_stats)] == [False, True]
    lazy = {"case": "off, cuda_async", "total": TOTAL, "self_start": 600 * MIB}
    assert cases.case_checks(lazy)[0][1] is True
    eager = {**lazy, "self_start": int(0.75 * TOTAL)}
    assert cases.case_checks(eager)[0][1] is False
    grown = {"bytes_limit": int(0.1 * TOTAL), "bytes_in_use": int(0.2 * TOTAL)}
    past = {"case": "cuda_async past its limit", "total": TOTAL, "stats_grown": grown}
    assert cases.case_checks(past)[0][1] is True
    kept = {"case": "changed after start", "total": TOTAL,
            "stats_after_clear": {"bytes_limit": int(0.75 * TOTAL)}}  # fmt: skip
    assert cases.case_checks(kept)[0][1] is True
    assert cases.case_checks({**kept, "stats_after_clear": None})[0][1] is None  # platform: none


def test_framework_cases_are_skipped_with_the_reason_where_not_installed(monkeypatch):
    cases = _cases()
    monkeypatch.setattr(cases.importlib.util, "find_spec", lambda name: None)
    assert cases.skip_reason("torch + JAX", ("default",)) == "torch is not installed"
    assert cases.skip_reason("address", ("default", "vmm")) == (
        "the installed jaxlib does not accept address"
    )
    rows = cases.case_verdicts([{"case": "cupy + JAX", "skipped": "cupy is not installed"}])
    assert rows == [("cupy + JAX", "ran", None, "cupy is not installed")]
    row = {"parts": {"torch": GIB, "jax_pool": GIB}, "other_bytes": 500 * MIB}
    split = {"case": "torch + JAX", "untouched": True, "framework_says": GIB, "split": [row]}
    assert [p for _, p, _ in cases.case_checks(split)] == [True, True, True]


def test_bytes_reserved_is_checked_in_every_bfc_mode():
    cases = _cases()
    results = [{"mode": "on", "start": {"jax_bytes_reserved": 0}},
               {"mode": "platform", "start": {"jax_bytes_reserved": None}},
               {"mode": "off", "start": {"jax_bytes_reserved": 4096}}]  # fmt: skip
    judged = [(mode, passed) for mode, _, passed, _ in cases.reserved_checks(results)]
    assert judged == [("on", True), ("off", False)]
