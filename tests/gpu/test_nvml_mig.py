"""A GPU split into MIG instances, read through jax_nbmem.gpu.nvml and the real pynvml.

Each instance is a GPU of its own to jax_nbmem: numbered after the whole GPUs, with its own
memory and processes and where it lives (parent, instance ids, profile). The split GPU lists
no process of its own (they are its instances'), and a user other than root is told why its
memory cannot be read, as a problem, never an error.
"""

from __future__ import annotations

from jax_nbmem.simgpu import GIB
from tests.gpu.test_nvml import run_nvml

READ_ALL = "report(gpus=nvml.gpus(), lists=nvml.process_lists(), status=nvml.status())"


def split_gpu(state):
    """GPU 0 in MIG mode with instances 1 (1g.18gb) and 2 (3g.71gb), one process in each."""
    state.gpu(0, total=141 * GIB, mig=True).gpu(1, total=141 * GIB)
    state.mig(0, 1, 18 * GIB, name="NVIDIA H200 MIG 1g.18gb")
    state.mig(0, 2, 71 * GIB, name="NVIDIA H200 MIG 3g.71gb")
    state.process(0, 4001, 5 * GIB, mig=1).process(0, 4002, 30 * GIB, mig=2)
    state.process(1, 4003, 2 * GIB)
    return state


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
