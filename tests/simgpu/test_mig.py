"""MIG on the simulated GPU: a GPU split into GPU instances, each a device of its own to NVML.

Asked through the real pynvml (in a child process, as a user's tool would), and through nvitop:
the instances' own MIG-... UUIDs, sizes and processes; the MIG queries; NO_PERMISSION on the
GPU's own memory and process lists for a user other than root, as real drivers answer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from jax_nbmem import simgpu
from jax_nbmem.simgpu import GIB
from tests.users import library_for_others

RESERVED = 500 * 1024**2  # the GPU's, which v1's "used" (pynvml's default) counts

_ASK = """
import json, pynvml
pynvml.nvmlInit()

def attempt(call, *args):
    try:
        return call(*args)
    except pynvml.NVMLError as error:
        return "error: " + str(error)

def number(value):
    return int(getattr(value, "value", value))  # some pynvml calls answer a ctypes number

def device(handle):
    memory = attempt(pynvml.nvmlDeviceGetMemoryInfo, handle)
    procs = attempt(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
    return {
        "uuid": pynvml.nvmlDeviceGetUUID(handle),
        "name": pynvml.nvmlDeviceGetName(handle),
        "memory": memory if isinstance(memory, str) else [memory.total, memory.used, memory.free],
        "procs": procs if isinstance(procs, str) else [
            [p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId] for p in procs
        ],
        "is_mig": number(pynvml.nvmlDeviceIsMigDeviceHandle(handle)),
    }

report = {"count": pynvml.nvmlDeviceGetCount(), "gpus": []}
for index in range(report["count"]):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    gpu = device(handle)
    gpu["mode"] = [number(mode) for mode in pynvml.nvmlDeviceGetMigMode(handle)]
    gpu["util"] = attempt(lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu, handle)
    gpu["attributes"] = attempt(pynvml.nvmlDeviceGetAttributes, handle)
    gpu["instances"] = []
    for position in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        mig = attempt(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, position)
        if isinstance(mig, str):
            gpu["after_the_last"] = mig
            break
        seen = device(mig)
        seen["gi"] = number(pynvml.nvmlDeviceGetGpuInstanceId(mig))
        seen["ci"] = number(pynvml.nvmlDeviceGetComputeInstanceId(mig))
        parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        seen["parent"] = number(pynvml.nvmlDeviceGetIndex(parent))
        by_uuid = pynvml.nvmlDeviceGetHandleByUUID(seen["uuid"])
        seen["by_uuid"] = pynvml.nvmlDeviceGetUUID(by_uuid)
        seen["temperature"] = attempt(pynvml.nvmlDeviceGetTemperature, mig, 0)
        attributes = attempt(pynvml.nvmlDeviceGetAttributes, mig)
        seen["attributes"] = attributes if isinstance(attributes, str) else [
            getattr(attributes, name) for name, _ in attributes._fields_
        ]
        gpu["instances"].append(seen)
    report["gpus"].append(gpu)
print(json.dumps(report))
"""


def ask(env) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _ASK], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def split_gpu(sim_state, simgpu_env):
    """GPU 0 in MIG mode with two instances and a process in each; GPU 1 whole."""
    sim_state.gpu(0, total=141 * GIB, mig=True).gpu(1, total=141 * GIB)
    sim_state.mig(0, 1, 18 * GIB, name="NVIDIA H200 MIG 1g.18gb")
    sim_state.mig(0, 2, 71 * GIB, name="NVIDIA H200 MIG 3g.71gb")
    sim_state.process(0, 4001, 5 * GIB, mig=1).process(0, 4002, 30 * GIB, mig=2)
    sim_state.process(1, 4003, 2 * GIB)
    return sim_state, simgpu_env


@pytest.mark.skipif(
    os.geteuid() != 0, reason="reads a GPU in MIG mode as root does: NVML lets only root"
)
def test_each_instance_is_a_device_of_its_own(split_gpu):
    state, env = split_gpu
    state.write()
    report = ask(env)
    assert report["count"] == 2  # NVML counts the GPUs; the instances hang below them
    split, whole = report["gpus"]
    assert split["mode"] == [1, 1] and whole["mode"] == [0, 0]
    assert whole["instances"] == [] and whole["util"] == 0
    assert split["util"] == "error: Not Supported"  # no utilization in MIG mode
    assert split["after_the_last"] == "error: Not Found"
    first, second = split["instances"]
    assert first["uuid"].startswith("MIG-") and first["uuid"] != second["uuid"]
    assert first["uuid"] != split["uuid"] and first["by_uuid"] == first["uuid"]
    assert (first["name"], second["name"]) == ("NVIDIA H200 MIG 1g.18gb", "NVIDIA H200 MIG 3g.71gb")
    assert first["memory"] == [18 * GIB, 5 * GIB, 13 * GIB]
    assert second["memory"] == [71 * GIB, 30 * GIB, 41 * GIB]
    assert first["procs"] == [[4001, 5 * GIB, 1, 0]] and second["procs"] == [[4002, 30 * GIB, 2, 0]]
    assert [(i["gi"], i["ci"], i["parent"], i["is_mig"]) for i in (first, second)] == [
        (1, 0, 0, 1),
        (2, 0, 0, 1),
    ]
    assert first["temperature"] == "error: Not Supported"
    # root sees the whole GPU, and every instance's processes with their instance ids
    assert split["memory"][:2] == [141 * GIB, 35 * GIB + RESERVED] and split["is_mig"] == 0
    assert split["procs"] == [[4001, 5 * GIB, 1, 0], [4002, 30 * GIB, 2, 0]]
    assert whole["procs"] == [[4003, 2 * GIB, 2**32 - 1, 2**32 - 1]]


def test_an_instance_says_its_engines_and_memory_as_its_profile_has_them(split_gpu):
    """nvmlDeviceGetAttributes: an H200's MIG profiles (1g, 3g; one named by memory alone)."""
    state, env = split_gpu
    state.mig(0, 3, 35 * GIB)  # no profile in its name: 2/8 of the memory, a 2g
    state.write()
    split, whole = ask(env)["gpus"]
    # SMs, copy engines, NVDEC, NVENC, NVJPG, OFA, GI slices, CI slices, memory in MiB
    assert [i["attributes"] for i in split["instances"]] == [
        [16, 1, 1, 0, 1, 0, 1, 1, 18 * 1024],
        [60, 3, 3, 0, 3, 0, 3, 3, 71 * 1024],
        [32, 2, 2, 0, 2, 0, 2, 2, 35 * 1024],
    ]
    # nvml.h: "currently only supports MIG device handles"
    assert split["attributes"] == whole["attributes"] == "error: Not Supported"


def test_a_user_other_than_root_may_not_ask_the_split_gpu_itself(split_gpu):
    state, env = split_gpu
    state.unprivileged().write()
    split, whole = ask(env)["gpus"]
    assert split["memory"] == split["procs"] == "error: Insufficient Permissions"
    assert [i["memory"][1] for i in split["instances"]] == [5 * GIB, 30 * GIB]  # its instances
    assert whole["memory"][1] == 2 * GIB + RESERVED and whole["procs"] == [
        [4003, 2 * GIB, 2**32 - 1, 2**32 - 1]
    ]


def test_a_real_user_other_than_root_gets_no_permission(split_gpu, other_user, simgpu_lib):
    state, _ = split_gpu
    _, uid, gid = other_user
    with library_for_others(simgpu_lib, "jnm-mig-") as folder:
        lib = folder / "lib" / simgpu.LIBRARY_NAME
        state.path = folder / "gpu.state"
        state.write()
        env = simgpu.env_for_subprocess(lib.parent, state.path)
        # what it needs of root's Python is imported first; NVML is opened as the other user
        code = (
            f"import json, os, pynvml; os.setgroups([]);os.setgid({gid}); os.setuid({uid})\n" + _ASK
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env={**env, "HOME": str(folder)},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        split, _ = json.loads(done.stdout)["gpus"]
        assert split["memory"] == split["procs"] == "error: Insufficient Permissions"
        assert [i["memory"][0] for i in split["instances"]] == [18 * GIB, 71 * GIB]


_NVITOP = """
import json
from nvitop import Device
report = []
for device in Device.all():
    report.append({
        "index": device.index, "mig": device.mig_mode(),
        "instances": [
            {"uuid": mig.uuid(), "total": mig.memory_total(), "used": mig.memory_used(),
             "processes": sorted(mig.processes())}
            for mig in device.mig_devices()
        ],
    })
print(json.dumps(report))
"""


def test_nvitop_shows_the_instances(split_gpu):
    if importlib.util.find_spec("nvitop") is None:  # not imported here: see test_real_clients
        pytest.skip("nvitop (the test extra) is not installed")
    state, env = split_gpu
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])]
    try:
        state.remove_process(4001).process(0, sleepers[0].pid, 5 * GIB, mig=1).write()
        done = subprocess.run(
            [sys.executable, "-c", _NVITOP], env={**env, "TERM": "dumb"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    assert done.returncode == 0 and "FunctionNotFound" not in done.stderr, done.stderr
    split, whole = json.loads(done.stdout)
    assert (split["mig"], whole["mig"]) == ("Enabled", "Disabled") and whole["instances"] == []
    assert [(i["total"], i["used"]) for i in split["instances"]] == [
        (18 * GIB, 5 * GIB),
        (71 * GIB, 30 * GIB),
    ]
    assert split["instances"][0]["processes"] == [sleepers[0].pid]
    assert all(i["uuid"].startswith("MIG-") for i in split["instances"])
