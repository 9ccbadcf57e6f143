"""jax_nbmem.gpu.nvml through the real pynvml, against the simulated GPU.

Most tests run a short script in a fresh Python whose LD_LIBRARY_PATH holds the stand-in
libnvidia-ml.so.1, as a kernel on a GPU machine would; the mid-session tests (lost GPU, driver
gone and back, threads) run in this process with the stub preloaded.
"""

from __future__ import annotations

import ctypes.util
import functools
import json
import os
import subprocess
import sys
import threading

import pytest

from jax_nbmem.gpu import nvml
from jax_nbmem.gpu.nvml_processes import one_process_list
from jax_nbmem.simgpu import GIB

MIB = 1024**2
# R510+ drivers (the simulated one's default): a GPU's used memory is its processes', nothing more.
BASE_USED = 0

REPORT = """
import dataclasses, json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="LOG %(message)s")
from jax_nbmem.gpu import nvml

def plain(value):
    if hasattr(value, "_asdict"):  # a named tuple (GpuProcess)
        return value._asdict()
    if isinstance(value, (list, tuple, nvml.ProcessTable)):
        return [plain(item) for item in value]
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value

def report(**values):
    print(json.dumps({key: plain(value) for key, value in values.items()}))
"""


def run_nvml(code: str, env: dict[str, str]) -> tuple[dict, str]:
    """Run ``code`` after REPORT in a fresh Python; return what it reported and its log."""
    done = subprocess.run(
        [sys.executable, "-c", REPORT + code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def no_nvml_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_LIBRARY_PATH", "JAX_NBMEM_SIMGPU_STATE")
    }
    return env


def test_one_gpu_with_a_process(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB, reserved=GIB).process(0, 4242, 4 * GIB).write()
    seen, log = run_nvml(
        "report(status=nvml.status(), gpus=nvml.gpus(), procs=nvml.processes(),"
        " driver=nvml.driver_version())",
        simgpu_env,
    )
    assert seen["status"] == {"available": True, "reason": None}
    assert seen["driver"] == "550.54.15"
    [gpu] = seen["gpus"]
    assert gpu["index"] == 0 and gpu["uuid"].startswith("GPU-")
    assert gpu["name"] == "NVIDIA H200 (simulated)"
    assert gpu["total_bytes"] == 80 * GIB
    assert gpu["used_bytes"] == 4 * GIB + BASE_USED  # as nvidia-smi shows it: reserved apart
    assert gpu["reserved_bytes"] == GIB
    assert gpu["used_bytes"] + gpu["reserved_bytes"] + gpu["free_bytes"] == gpu["total_bytes"]
    assert gpu["problem"] is None
    assert seen["procs"] == [{"pid": 4242, "gpu": 0, "used_bytes": 4 * GIB}]
    assert "LOG" not in log


def test_several_gpus_and_processes_nvml_cannot_measure(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).gpu(1, total=40 * GIB, name="NVIDIA A100 (simulated)")
    sim_state.process(0, 100, 2 * GIB).process(1, 101, None).process(1, 102, GIB, graphics=True)
    sim_state.process(1, 103, 3 * GIB).process(1, 103, 3 * GIB, graphics=True).write()
    seen, _ = run_nvml(
        "report(all=nvml.gpus(), picked=nvml.memory([1, 0]), missing=nvml.memory([7]),"
        " procs=nvml.processes(), procs1=nvml.processes([1]))",
        simgpu_env,
    )
    assert [(g["index"], g["name"]) for g in seen["all"]] == [
        (0, "NVIDIA H200 (simulated)"),
        (1, "NVIDIA A100 (simulated)"),
    ]
    assert len({g["uuid"] for g in seen["all"]}) == 2
    assert [g["index"] for g in seen["picked"]] == [1, 0]
    assert seen["picked"][0]["used_bytes"] == 3 * GIB + GIB + BASE_USED
    assert seen["missing"] == []
    procs = {(p["gpu"], p["pid"]): p["used_bytes"] for p in seen["procs"]}
    assert procs == {(0, 100): 2 * GIB, (1, 101): None, (1, 102): GIB, (1, 103): 3 * GIB}
    assert len(seen["procs"]) == 4  # 103 is on both lists of GPU 1 but listed once
    assert {p["gpu"] for p in seen["procs1"]} == {1}


def test_old_driver_falls_back_without_raising(sim_state, simgpu_old_driver_lib):
    from jax_nbmem import simgpu

    env = simgpu.env_for_subprocess(simgpu_old_driver_lib.parent, sim_state.path)
    sim_state.gpu(0, total=80 * GIB, reserved=GIB).process(0, 7, 2 * GIB).write()
    seen, log = run_nvml(
        "first = nvml.memory(); report(status=nvml.status(), gpus=nvml.memory(),"
        " first=first, procs=nvml.processes(), again=nvml.processes(), lists=nvml.process_lists())",
        env,
    )
    assert seen["status"] == {"available": True, "reason": None}
    [gpu] = seen["gpus"]
    assert seen["first"] == seen["gpus"]
    assert gpu["reserved_bytes"] is None  # the old call cannot tell reserved from used
    assert gpu["used_bytes"] == GIB + 2 * GIB
    assert gpu["used_bytes"] + gpu["free_bytes"] == 80 * GIB
    assert log.count("v2 memory") == 1
    assert log.count("compute process list _v3") == 1
    # The lists are read through the driver's own _v2 calls (pynvml's function pointers), also
    # with an nvidia-ml-py before 12.550, whose Python calls know only _v3, which it lacks.
    assert seen["procs"] == seen["again"] == [{"pid": 7, "gpu": 0, "used_bytes": 2 * GIB}]


def test_missing_library_is_said_not_raised():
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real NVML library")
    seen, _ = run_nvml(
        "report(status=nvml.status(), gpus=nvml.gpus(), procs=nvml.processes(),"
        " driver=nvml.driver_version())",
        no_nvml_env(),
    )
    assert seen["status"]["available"] is False
    assert "libnvidia-ml.so.1" in seen["status"]["reason"]
    assert "no NVIDIA driver" in seen["status"]["reason"]
    assert seen["gpus"] == seen["procs"] == [] and seen["driver"] is None


def test_missing_pynvml_is_said_not_raised():
    seen, _ = run_nvml(
        "sys.modules['pynvml'] = None\nreport(status=nvml.status(), gpus=nvml.gpus())",
        no_nvml_env(),
    )
    assert seen["status"] == {
        "available": False,
        "reason": "nvidia-ml-py (pynvml) is not installed, so GPU memory cannot be read",
    }
    assert seen["gpus"] == []


def test_driver_not_loaded(sim_state, simgpu_env):
    sim_state.gpu(0, total=GIB).no_driver().write()
    seen, _ = run_nvml("report(status=nvml.status(), gpus=nvml.gpus())", simgpu_env)
    assert seen["status"]["available"] is False
    assert "driver is not loaded" in seen["status"]["reason"]
    assert seen["gpus"] == []


def test_gpu_lost_mid_session_then_back(simgpu_in_process):
    state = simgpu_in_process.gpu(0, total=80 * GIB).gpu(1, total=80 * GIB)
    state.process(0, 10, GIB).process(1, 11, GIB).write()
    before = nvml.gpus()
    assert [g.problem for g in before] == [None, None]

    state.lose(1).write()
    during = nvml.memory()
    assert during[0] == before[0]
    lost = during[1]
    assert (lost.index, lost.uuid, lost.name) == (1, before[1].uuid, before[1].name)
    assert lost.total_bytes is lost.used_bytes is lost.free_bytes is None
    assert "GPU 1 is lost" in lost.problem
    assert nvml.status() == nvml.NvmlStatus(True, lost.problem)
    assert [p.gpu for p in nvml.processes()] == [0]
    assert nvml.memory() == during  # still polite on the next call

    state.recover(1).write()
    assert nvml.memory() == before
    assert nvml.status() == nvml.NvmlStatus(True, None)
    assert sorted(p.gpu for p in nvml.processes()) == [0, 1]


def test_a_lost_gpu_is_not_retried_before_the_pause(simgpu_in_process):
    nvml._reset_for_tests(retry_first_s=3600.0)
    state = simgpu_in_process.gpu(0, total=GIB)
    state.write()
    assert nvml.memory()[0].problem is None
    state.lose(0).write()
    assert "lost" in nvml.memory()[0].problem
    state.recover(0).write()
    assert "lost" in nvml.memory()[0].problem  # next try is an hour away
    nvml.shutdown()  # an explicit shutdown starts afresh
    assert nvml.memory()[0].problem is None


def test_driver_gone_mid_session_then_back(simgpu_in_process):
    state = simgpu_in_process.gpu(0, total=GIB)
    state.write()
    assert nvml.status().available
    state.no_driver().write()
    [found_out] = nvml.memory()  # the call that finds out says so on each GPU
    assert found_out.problem == "the NVIDIA driver is not loaded, so NVML cannot read the GPUs"
    assert found_out.used_bytes is None
    assert nvml.memory() == []
    assert nvml.status() == nvml.NvmlStatus(
        False, "the NVIDIA driver is not loaded, so NVML cannot read the GPUs"
    )
    assert nvml.processes() == [] and nvml.driver_version() is None
    state.no_driver(False).write()
    assert [g.total_bytes for g in nvml.memory()] == [GIB]
    assert nvml.status() == nvml.NvmlStatus(True, None)


def test_memory_reuses_handles_names_and_uuids(simgpu_in_process, monkeypatch):
    simgpu_in_process.gpu(0, total=GIB).gpu(1, total=GIB).write()
    first = nvml.gpus()
    pynvml = sys.modules["pynvml"]
    calls = []
    for name in (
        "nvmlInit",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
    ):
        original = getattr(pynvml, name)
        monkeypatch.setattr(
            pynvml, name, lambda *a, _n=name, _f=original: calls.append(_n) or _f(*a)
        )
    for _ in range(3):
        assert nvml.memory() == first
    assert calls == []


def test_memory_read_again_in_one_pass_is_each_gpus_reading_as_one_by_one(
    simgpu_in_process, monkeypatch
):
    """After the first reading, the GPUs are read in one pass (read_memories): the same figures
    give the same reading objects, new figures a new reading, checked as ever, and a GPU with
    a problem of its own (or an error) sends the pass back to the reading one by one."""
    state = simgpu_in_process
    state.gpu(0, total=80 * GIB).gpu(1, total=80 * GIB).process(0, 4242, GIB).write()
    first = nvml.memory()
    one_by_one = []
    real = nvml.read_memory
    monkeypatch.setattr(nvml, "read_memory", lambda *a: one_by_one.append(a) or real(*a))
    again = nvml.memory()
    assert again == first and all(a is b for a, b in zip(again, first, strict=True))
    assert one_by_one == []  # one pass
    state.process(1, 4343, 2 * GIB).write()
    moved = nvml.memory()
    assert moved[0] is first[0] and moved[1] is not first[1]
    assert moved[1].used_bytes == 2 * GIB + first[1].used_bytes and moved[1].problem is None
    state.gpu(1, total=80 * GIB, used=90 * GIB, raw=True).write()  # more than it has: said
    [_, impossible] = nvml.memory()
    assert impossible.used_bytes is None and "cannot be" in impossible.problem
    state.gpu(1, total=80 * GIB).fail("memory", "GPU_IS_LOST", 1).write()
    [kept, lost] = nvml.memory()
    assert kept is first[0] and lost.used_bytes is None and lost.problem
    assert len(one_by_one) == 2  # the error sent that pass back to the GPUs one by one


def test_threads_share_one_session(simgpu_in_process):
    state = simgpu_in_process.gpu(0, total=80 * GIB).gpu(1, total=80 * GIB)
    state.write()
    errors, results = [], []

    def poll():
        try:
            for _ in range(100):
                results.append((nvml.memory(), nvml.processes(), nvml.status()))
        except Exception as error:  # the test fails below if anything escapes
            errors.append(error)

    threads = [threading.Thread(target=poll) for _ in range(3)]
    for thread in threads:
        thread.start()
    for pid in range(50):
        state.process(pid % 2, 1000 + pid, MIB).write()
    for thread in threads:
        thread.join()
    assert errors == []
    assert all(len(memory) == 2 and status.available for memory, _, status in results)
    assert nvml.status() == nvml.NvmlStatus(True, None)


def test_shutdown_then_use_again(simgpu_in_process):
    simgpu_in_process.gpu(0, total=GIB).write()
    first = nvml.gpus()
    nvml.shutdown()
    nvml.shutdown()  # twice is harmless
    assert nvml.gpus() == first


def test_importing_loads_nothing_until_asked():
    seen, _ = run_nvml(
        "before = sorted({'jax', 'pynvml'} & set(sys.modules)); nvml.status()\n"
        "report(before=before, after=sorted({'jax', 'pynvml'} & set(sys.modules)))",
        no_nvml_env(),
    )
    assert seen == {"before": [], "after": ["pynvml"]}


# --- other tools in the process: they replace pynvml's functions ------------------------------


def _replace_memory_call(monkeypatch) -> None:
    """Replace pynvml's memory call with a one-argument wrapper, as gpustat does on import."""
    import pynvml

    original = pynvml.nvmlDeviceGetMemoryInfo

    @functools.wraps(original)
    def nvmlDeviceGetMemoryInfo(handle):
        return original(handle)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", nvmlDeviceGetMemoryInfo)


def test_memory_is_read_when_another_tool_replaced_the_call(simgpu_in_process, monkeypatch):
    simgpu_in_process.gpu(0, total=80 * GIB, reserved=GIB).process(0, 4242, 4 * GIB).write()
    _replace_memory_call(monkeypatch)
    [gpu] = nvml.gpus()
    assert gpu.problem is None and nvml.status() == nvml.NvmlStatus(True, None)
    assert (gpu.used_bytes, gpu.reserved_bytes) == (4 * GIB + BASE_USED, GIB)
    assert gpu.free_bytes == 80 * GIB - GIB - 4 * GIB - BASE_USED
    assert [p.pid for p in nvml.processes()] == [4242]


def test_a_pynvml_that_cannot_ask_for_v2_falls_back_to_v1_and_says_so_once(
    simgpu_in_process, monkeypatch, caplog
):
    import pynvml

    simgpu_in_process.gpu(0, total=80 * GIB, reserved=GIB).process(0, 4242, 4 * GIB).write()
    _replace_memory_call(monkeypatch)
    monkeypatch.delattr(pynvml, "c_nvmlMemory_v2_t")  # no way left to the v2 call
    with caplog.at_level("INFO", logger=nvml.__name__):
        readings = [nvml.gpus() for _ in range(3)]
    assert readings[0] == readings[1] == readings[2]
    [gpu] = readings[0]
    assert gpu.problem is None and gpu.reserved_bytes is None
    assert gpu.used_bytes == GIB + 4 * GIB + BASE_USED  # v1 counts reserved as used
    assert gpu.used_bytes + gpu.free_bytes == gpu.total_bytes
    said = [r.getMessage() for r in caplog.records if "v1" in r.getMessage()]
    assert len(said) == 1 and "replaced" in said[0]


def test_importing_gpustat_loses_no_reading(sim_state, simgpu_env):
    pytest.importorskip("gpustat")
    sim_state.gpu(0, total=80 * GIB, reserved=GIB).process(0, 4242, 4 * GIB).write()
    seen, _ = run_nvml(
        "import gpustat, pynvml\n"
        "replaced = pynvml.nvmlDeviceGetMemoryInfo.__code__.co_argcount == 1\n"
        "report(replaced=replaced, status=nvml.status(), gpus=nvml.gpus(), procs=nvml.processes())",
        simgpu_env,
    )
    assert seen["replaced"] is True  # this gpustat still replaces the call
    assert seen["status"] == {"available": True, "reason": None}
    [gpu] = seen["gpus"]
    assert (gpu["used_bytes"], gpu["reserved_bytes"]) == (4 * GIB + BASE_USED, GIB)
    assert seen["procs"] == [{"pid": 4242, "gpu": 0, "used_bytes": 4 * GIB}]


# --- faults a real driver shows: failed lists, impossible numbers, bad names, slowness ------


@pytest.mark.parametrize(
    "error", ["UNKNOWN", "INSUFFICIENT_SIZE", "NOT_SUPPORTED", "NO_PERMISSION"]
)
def test_a_process_list_nvml_cannot_give_is_unknown_not_empty(sim_state, simgpu_env, error):
    sim_state.gpu(0, total=80 * GIB).gpu(1, total=80 * GIB)
    sim_state.process(0, 4242, 4 * GIB).process(1, 4343, GIB).fail("processes", error, gpu=0)
    sim_state.write()
    seen, _ = run_nvml("report(lists=nvml.process_lists(), flat=nvml.processes())", simgpu_env)
    broken, fine = seen["lists"]
    assert broken["gpu"] == 0 and broken["processes"] is None
    assert "process list unreadable" in broken["problem"]
    assert fine == {"gpu": 1, "processes": [{"pid": 4343, "gpu": 1, "used_bytes": GIB}],
                    "problem": None}  # fmt: skip
    assert seen["flat"] == [{"pid": 4343, "gpu": 1, "used_bytes": GIB}]


@pytest.mark.parametrize("reader", ["raw", "pynvml"])
def test_a_list_that_changed_size_between_the_two_calls_is_asked_again(
    simgpu_in_process, monkeypatch, reader
):
    import pynvml

    simgpu_in_process.gpu(0, total=80 * GIB).process(0, 4242, 4 * GIB).write()
    assert nvml.processes() == [nvml.GpuProcess(4242, 0, 4 * GIB)]
    calls = []
    if reader == "raw":  # the list read into our buffer through pynvml's function pointer
        original_pointer = pynvml._nvmlGetFunctionPointer

        def pointer(name):
            function = original_pointer(name)
            if name != "nvmlDeviceGetComputeRunningProcesses_v3":
                return function

            def grew_once(handle, count, array):  # a process started meanwhile
                calls.append(handle)
                if len(calls) == 1:
                    count._obj.value = 2
                    return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
                return function(handle, count, array)

            return grew_once

        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", pointer)
    else:  # pynvml's own call (a pynvml without function pointers is read so)
        monkeypatch.setattr(nvml, "whole_process_list", one_process_list)
        original = pynvml.nvmlDeviceGetComputeRunningProcesses_v3

        def grew_once(handle):  # a process started between NVML's count and its copy
            calls.append(handle)
            if len(calls) == 1:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            return original(handle)

        monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v3", grew_once)
    [listing] = nvml.process_lists()
    assert listing == nvml.GpuProcesses(0, (nvml.GpuProcess(4242, 0, 4 * GIB),))
    assert len(calls) == 2 and nvml.status() == nvml.NvmlStatus(True, None)


def test_impossible_numbers_are_dropped_and_said(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB, used=90 * GIB, free=0, raw=True)  # used above total
    sim_state.gpu(1, total=2**64 - 1, raw=True)  # "not available" as a total
    sim_state.gpu(2, total=80 * GIB).process(2, 4242, 2**62).write()  # 4 EiB for one process
    seen, _ = run_nvml("report(gpus=nvml.gpus(), lists=nvml.process_lists())", simgpu_env)
    over, nonsense, fine = seen["gpus"]
    assert over["total_bytes"] == 80 * GIB and over["used_bytes"] is None
    assert "cannot be" in over["problem"] and "not shown" in over["problem"]
    assert nonsense["total_bytes"] is None and "impossible total" in nonsense["problem"]
    assert fine["problem"] is None
    listed = seen["lists"][2]
    assert listed["processes"] == [{"pid": 4242, "gpu": 2, "used_bytes": None}]
    assert "impossible process bytes" in listed["problem"]


def test_a_name_that_is_not_utf8_is_shown_escaped(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB, name=b"NVIDIA \xff\xfe H200").write()
    seen, _ = run_nvml("report(status=nvml.status(), gpus=nvml.gpus())", simgpu_env)
    assert seen["status"]["available"] is True
    assert seen["gpus"][0]["name"] == "NVIDIA \\xff\\xfe H200"
    assert seen["gpus"][0]["total_bytes"] == 80 * GIB


def test_a_slow_nvml_is_said_and_last_status_never_waits(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).slow("memory", 0.6).write()
    seen, _ = run_nvml(
        "import threading, time\n"
        "nvml.status()\n"
        "reader = threading.Thread(target=nvml.gpus); reader.start()\n"
        "time.sleep(0.1)\n"
        "began = time.monotonic(); quick = nvml.last_status(); waited = time.monotonic() - began\n"
        "reader.join()\n"
        "report(quick=quick, waited=waited, after=nvml.status())",
        simgpu_env,
    )
    assert seen["quick"]["available"] is True
    assert seen["waited"] < 0.3  # answered while another thread sat in NVML
    assert "NVML is slow: reading memory took 0.6 s" in seen["after"]["reason"]
