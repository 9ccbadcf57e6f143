"""NVML clients nobody here wrote, on the simulated GPU: they must not be able to tell it apart.

nvitop (its CLI and its Python API) and gpustat load the stand-in through the real pynvml, as
on a real GPU. They run without a single missing function, and report the same GPUs, bytes and
processes as ``jax-nbmem status --json`` does.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest

from jax_nbmem.simgpu import GIB, SimState

# Looked for, not imported: gpustat patches pynvml as it is imported, which would change the
# NVML of every in-process test after this one.
if importlib.util.find_spec("nvitop") is None or importlib.util.find_spec("gpustat") is None:
    pytest.skip("nvitop and gpustat (the test extra) are not installed", allow_module_level=True)

MIB = 1024**2
RESERVED = 500 * MIB  # the stand-in's default, as an R510+ driver reserves

_NVITOP_API = """
import json
from nvitop import Device
report = []
for device in Device.all():
    report.append({
        "index": device.index, "uuid": device.uuid(), "name": device.name(),
        "total": device.memory_total(), "free": device.memory_free(), "used": device.memory_used(),
        "util": device.gpu_utilization(), "temperature": device.temperature(),
        "power": device.power_usage(), "bus_id": device.bus_id(),
        "cuda": device.cuda_driver_version(), "mig": device.mig_mode(),
        "processes": {str(pid): p.gpu_memory() for pid, p in device.processes().items()},
        "by_uuid": Device(uuid=device.uuid()).index,
        "by_bus_id": Device(bus_id=device.bus_id()).index,
    })
print(json.dumps(report))
"""


@pytest.fixture
def busy_gpus(sim_state, simgpu_env):
    """Two simulated GPUs, three real (sleeping) processes on them; yields (state, env, pids)."""
    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) for _ in range(3)
    ]
    pids = [sleeper.pid for sleeper in sleepers]
    sim_state.gpu(0, total=80 * GIB, util=40).gpu(1, total=141 * GIB)
    sim_state.process(0, pids[0], 20 * GIB).process(0, pids[1], 3 * GIB)
    sim_state.process(1, pids[2], 60 * GIB).write()
    try:
        yield sim_state, simgpu_env, pids
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def _run(args, env, timeout=120):
    if shutil.which(args[0], path=env.get("PATH")) is None:
        pytest.skip(f"no {args[0]} command on PATH (the test extra: pip install -e '.[test]')")
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done


def _status(env) -> dict:
    done = _run([sys.executable, "-m", "jax_nbmem.cli", "status", "--json"], env)
    return json.loads(done.stdout)


def _processes_of(status: dict) -> dict[tuple[int, int], int]:
    return {(p["gpu"], p["pid"]): p["used_bytes"] for p in status["processes"]}


def test_nvitop_reports_what_jax_nbmem_reports(busy_gpus):
    state, env, pids = busy_gpus
    done = _run([sys.executable, "-c", _NVITOP_API], {**env, "TERM": "dumb"})
    assert "FunctionNotFound" not in done.stderr + done.stdout and "ERROR" not in done.stderr
    devices = json.loads(done.stdout)
    status = _status(env)
    assert [(d["index"], d["uuid"], d["name"]) for d in devices] == [
        (g["index"], g["uuid"], g["name"]) for g in status["gpus"]
    ]
    for device, gpu in zip(devices, status["gpus"], strict=True):
        assert (device["total"], device["free"]) == (gpu["total_bytes"], gpu["free_bytes"])
        # nvitop shows v2 `used`, as nvidia-smi does: reserved memory is not in it.
        assert device["used"] == gpu["total_bytes"] - gpu["free_bytes"] - RESERVED
        assert device["by_uuid"] == device["by_bus_id"] == device["index"]
        assert device["cuda"] == "12.4" and device["mig"] == "Disabled"
        assert device["bus_id"].startswith("00000000:")
    assert device["used"] == 60 * GIB
    assert (
        {(d["index"], int(pid)): used for d in devices for pid, used in d["processes"].items()}
        == (_processes_of(status))
        == {(0, pids[0]): 20 * GIB, (0, pids[1]): 3 * GIB, (1, pids[2]): 60 * GIB}
    )
    # the state's utilization, and what follows it
    assert [d["util"] for d in devices] == [40, 0]
    assert devices[0]["temperature"] > devices[1]["temperature"] > 20
    assert devices[0]["power"] > devices[1]["power"] > 50_000  # milliwatts


_NVITOP_PROCESSES = """
import json
from nvitop import Device
device = Device(0)
print(json.dumps({
    "util": device.gpu_utilization(),
    "processes": {
        str(pid): [p.type, p.gpu_sm_utilization()] for pid, p in device.processes().items()
    },
}))
"""


def test_nvitop_samples_every_process_with_a_context_graphics_ones_too(busy_gpus):
    state, env, pids = busy_gpus
    # One compute process, one graphics process, one on both lists: three contexts.
    state = SimState(state.path).gpu(0, total=80 * GIB, util=60)
    state.process(0, pids[0], 20 * GIB).process(0, pids[1], 2 * GIB, graphics=True)
    state.process(0, pids[2], 4 * GIB).process(0, pids[2], 4 * GIB, graphics=True).write()
    done = _run([sys.executable, "-c", _NVITOP_PROCESSES], {**env, "TERM": "dumb"})
    report = json.loads(done.stdout)
    # As nvidia-smi pmon shows them: a sample per process, whichever list it is on.
    assert report["processes"] == {
        str(pids[0]): ["C", 20],
        str(pids[1]): ["G", 20],
        str(pids[2]): ["C+G", 20],
    }
    assert report["util"] == 60


def test_the_nvitop_command_runs_without_a_missing_function(busy_gpus):
    _, env, pids = busy_gpus
    done = _run(["nvitop", "-1"], {**env, "TERM": "dumb", "COLUMNS": "120"})
    out = done.stdout + done.stderr
    assert "FunctionNotFound" not in out and "ERROR" not in out and "N/A" in out  # the fan only
    assert out.count("H200 (simulated)") == 2 and "CUDA Driver Version: 12.4" in out
    for pid in pids:
        assert str(pid) in out
    assert "20.00GiB" in out or "20480MiB" in out


def test_gpustat_reports_what_jax_nbmem_reports(busy_gpus):
    _, env, pids = busy_gpus
    done = _run(["gpustat", "--json"], env)
    assert "FunctionNotFound" not in done.stderr
    report = json.loads(done.stdout)
    status = _status(env)
    assert report["driver_version"] == status["nvml"]["driver_version"]
    assert [(g["index"], g["uuid"], g["name"]) for g in report["gpus"]] == [
        (g["index"], g["uuid"], g["name"]) for g in status["gpus"]
    ]
    for shown, gpu in zip(report["gpus"], status["gpus"], strict=True):
        assert shown["memory.total"] == gpu["total_bytes"] // MIB
        assert shown["memory.used"] == (gpu["total_bytes"] - gpu["free_bytes"] - RESERVED) // MIB
        for key in ("temperature.gpu", "utilization.gpu", "power.draw", "enforced.power.limit"):
            assert shown[key] is not None, key
    listed = {
        (g["index"], p["pid"]): p["gpu_memory_usage"]
        for g in report["gpus"]
        for p in g["processes"]
    }
    assert listed == {key: used // MIB for key, used in _processes_of(status).items()}
    assert set(listed) == {(0, pids[0]), (0, pids[1]), (1, pids[2])}


def test_a_lost_gpu_is_lost_for_every_client(busy_gpus):
    state, env, _ = busy_gpus
    state.lose(1).write()
    done = _run(["gpustat", "--json"], env)
    assert "FunctionNotFound" not in done.stderr
    status = _status(env)
    assert [g["problem"] is not None for g in status["gpus"]] == [False, True]


def test_the_failing_info_calls_are_said_as_a_driver_says_them(busy_gpus):
    state, env, _ = busy_gpus
    state.fail("info", "NOT_SUPPORTED").write()
    done = _run(["gpustat", "--json"], env)
    report = json.loads(done.stdout)
    assert [g["temperature.gpu"] for g in report["gpus"]] == [None, None]
    assert [g["memory.total"] for g in report["gpus"]] == [80 * 1024, 141 * 1024]
    assert (
        SimState.read(state.path).summary()
        == "2 GPU(s), 3 process(es), 0 slow and 1 failing call(s)"
    )
