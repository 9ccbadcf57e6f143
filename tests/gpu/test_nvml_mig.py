"""A GPU split into MIG instances, read through jax_nbmem.gpu.nvml and the real pynvml.

Each instance is a GPU of its own to jax_nbmem: numbered after the whole GPUs, with its own
memory and processes and where it lives (parent, instance ids, profile). The split GPU lists
no process of its own (they are its instances'), and a user other than root is told why its
memory cannot be read, as a problem, never an error.
"""

from __future__ import annotations

import os

import pytest

from jax_nbmem.simgpu import GIB
from tests.gpu.test_nvml import run_nvml

READ_ALL = "report(gpus=nvml.gpus(), lists=nvml.process_lists(), status=nvml.status())"
# NVML answers NO_PERMISSION to anyone but root for a GPU in MIG mode, and so does the simulated
# GPU: root's view is root's to test (another user's is the test that marks its state so).
as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="reads a GPU in MIG mode as root does: NVML lets only root"
)


def split_gpu(state):
    """GPU 0 in MIG mode with instances 1 (1g.18gb) and 2 (3g.71gb), one process in each."""
    state.gpu(0, total=141 * GIB, mig=True).gpu(1, total=141 * GIB)
    state.mig(0, 1, 18 * GIB, name="NVIDIA H200 MIG 1g.18gb")
    state.mig(0, 2, 71 * GIB, name="NVIDIA H200 MIG 3g.71gb")
    state.process(0, 4001, 5 * GIB, mig=1).process(0, 4002, 30 * GIB, mig=2)
    state.process(1, 4003, 2 * GIB)
    return state


@as_root
def test_each_instance_is_a_gpu_with_its_own_memory_and_processes(sim_state, simgpu_env):
    split_gpu(sim_state).write()
    seen, _ = run_nvml(READ_ALL, simgpu_env)
    split, whole, small, big = seen["gpus"]
    assert [g["index"] for g in seen["gpus"]] == [0, 1, 2, 3]
    assert split["mig_mode"] and split["mig"] is None and not whole["mig_mode"]
    assert split["total_bytes"] == 141 * GIB and split["problem"] is None  # root reads it
    assert small["uuid"].startswith("MIG-") and big["uuid"].startswith("MIG-")
    assert (small["total_bytes"], small["used_bytes"]) == (18 * GIB, 5 * GIB)
    assert (big["total_bytes"], big["used_bytes"]) == (71 * GIB, 30 * GIB)
    assert big["mig"] == {
        "parent_index": 0,
        "parent_uuid": split["uuid"],
        "gpu_instance_id": 2,
        "compute_instance_id": 0,
        "profile": "3g.71gb",
    }
    lists = {listing["gpu"]: listing for listing in seen["lists"]}
    assert lists[0] == {"gpu": 0, "processes": [], "problem": None}  # its instances' instead
    assert lists[2]["processes"] == [{"pid": 4001, "gpu": 2, "used_bytes": 5 * GIB}]
    assert lists[3]["processes"] == [{"pid": 4002, "gpu": 3, "used_bytes": 30 * GIB}]
    assert lists[1]["processes"] == [{"pid": 4003, "gpu": 1, "used_bytes": 2 * GIB}]
    assert seen["status"] == {"available": True, "reason": None}


def test_a_user_other_than_root_is_told_why_the_split_gpu_cannot_be_read(sim_state, simgpu_env):
    split_gpu(sim_state).unprivileged().write()
    seen, _ = run_nvml(READ_ALL, simgpu_env)
    split, whole, small, big = seen["gpus"]
    assert split["total_bytes"] is None and split["used_bytes"] is None
    assert split["problem"] == (
        "GPU 0 is in MIG mode: MIG instances other than yours cannot be read without root; "
        "the GPU's own memory and process list are root's"
    )
    assert small["used_bytes"] == 5 * GIB and big["used_bytes"] == 30 * GIB
    assert whole["problem"] is None
    assert [len(listing["processes"]) for listing in seen["lists"]] == [0, 1, 1, 1]
    assert seen["status"]["available"] is True


def test_a_gpu_without_mig_is_unchanged(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).process(0, 4242, GIB).write()
    seen, _ = run_nvml(READ_ALL, simgpu_env)
    [gpu] = seen["gpus"]
    assert gpu["mig"] is None and gpu["mig_mode"] is False


def _split_anew(state, big_uuid):
    """GPU 0 split again: instance 1 destroyed, instance 3 (2g.35gb) made, instance 2 kept."""
    state.path.write_text("")
    fresh = type(state)(state.path).gpu(0, total=141 * GIB, mig=True).gpu(1, total=141 * GIB)
    fresh.mig(0, 2, 71 * GIB, uuid=big_uuid, name="NVIDIA H200 MIG 3g.71gb")
    fresh.mig(0, 3, 35 * GIB, uuid=NEW_MIG, name="NVIDIA H200 MIG 2g.35gb")
    return fresh.process(0, 4005, 7 * GIB, mig=3).write()


NEW_MIG = "MIG-33333333-4444-5555-8666-777777777777"


def _seen(gpus):
    return {gpu.index: (gpu.label, gpu.used_bytes) for gpu in gpus}


@as_root
def test_a_gpu_split_anew_while_a_kernel_runs_is_listed_anew(simgpu_in_process, monkeypatch):
    from jax_nbmem.gpu import nvml

    nvml._reset_for_tests(retry_first_s=0.0, layout_check_s=0.0)  # look at every reading
    state = simgpu_in_process
    split_gpu(state).write()
    big_uuid = nvml.gpus()[3].uuid
    assert _seen(nvml.gpus()) == {
        0: ("GPU 0", 35 * GIB), 1: ("GPU 1", 2 * GIB),
        2: ("MIG 1g.18gb instance 1 of GPU 0", 5 * GIB),
        3: ("MIG 3g.71gb instance 2 of GPU 0", 30 * GIB),
    }  # fmt: skip

    _split_anew(state, big_uuid)
    # Instance 2 keeps its number (a panel drawing GPU 3 still draws it); the new one gets a
    # number never used before, the destroyed one's is not given to another.
    assert _seen(nvml.gpus()) == {
        0: ("GPU 0", 7 * GIB), 1: ("GPU 1", 0),
        3: ("MIG 3g.71gb instance 2 of GPU 0", 0),
        4: ("MIG 2g.35gb instance 3 of GPU 0", 7 * GIB),
    }  # fmt: skip
    assert [listing.gpu for listing in nvml.process_lists([4])] == [4]
    assert [p.pid for p in nvml.processes([4])] == [4005]

    state.path.write_text("")
    type(state)(state.path).gpu(0, total=141 * GIB).gpu(1, total=141 * GIB).write()  # MIG off
    [whole, other] = nvml.gpus()
    assert (whole.index, whole.mig_mode, whole.total_bytes, other.index) == (0, False, 141 * GIB, 1)
    assert nvml.status().reason is None


def test_the_layout_is_looked_at_only_every_few_seconds(simgpu_in_process):
    from jax_nbmem.gpu import nvml

    nvml._reset_for_tests(retry_first_s=0.0, layout_check_s=3600.0)
    state = simgpu_in_process
    split_gpu(state).write()
    assert len(nvml.gpus()) == 4
    _split_anew(state, nvml.gpus()[3].uuid)
    # Not looked at again yet: the readings keep the session (the destroyed instance's
    # handle fails, as before; nothing waits for a fresh listing).
    assert NEW_MIG not in [gpu.uuid for gpu in nvml.gpus()]


@as_root
def test_an_instance_that_cannot_be_read_is_said_under_its_gpu(simgpu_in_process, monkeypatch):
    import pynvml

    from jax_nbmem.gpu import nvml
    from jax_nbmem.tenants.status import collect, format_status

    split_gpu(simgpu_in_process).write()
    real_name = pynvml.nvmlDeviceGetName

    def name_failing_on_the_small_instance(handle):
        name = real_name(handle)
        if "1g.18gb" in name:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return name

    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", name_failing_on_the_small_instance)
    split, whole, big = nvml.gpus()
    assert big.label == "MIG 3g.71gb instance 2 of GPU 0" and whole.problem is None
    assert split.problem.startswith("GPU 0: MIG instance at position 0 cannot be read: ")
    assert split.total_bytes == 141 * GIB  # the GPU itself is still read
    assert split.problem in nvml.status().reason

    text = format_status(collect(environ={}))
    under_gpu_0 = text.split("GPU 0: ", 1)[1].split("\nGPU 1: ", 1)[0]
    assert "  GPU 0: MIG instance at position 0 cannot be read: " in under_gpu_0
    assert text.count("MIG instance at position 0 cannot be read") == 1  # said once

    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", real_name)  # readable again
    labels = [gpu.label for gpu in nvml.gpus()]  # retried like a lost GPU (no pause here)
    assert "MIG 1g.18gb instance 1 of GPU 0" in labels
    assert nvml.gpus()[0].problem is None and nvml.status().reason is None
