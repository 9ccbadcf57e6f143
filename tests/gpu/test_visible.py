"""Which NVML GPUs a process's CUDA sees, from CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jax_nbmem.gpu.mig import MigInstance
from jax_nbmem.gpu.nvml import GpuMemory
from jax_nbmem.gpu.visible import VisibleGpus, visible_gpus

H200, A100 = "NVIDIA H200", "NVIDIA A100"
UUIDS = [
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
    "GPU-8932f0aa-0000-4000-8000-000000000001",
    "GPU-1b2c3d4e-0000-4000-8000-000000000002",
]


def machine(*names):
    """GPUs as NVML lists them (PCI bus order), with the given model names."""
    return [GpuMemory(i, UUIDS[i], name, 80, 1, 79) for i, name in enumerate(names)]


SAME = machine(H200, H200, H200)
MIXED = machine(A100, H200)
MIG_UUIDS = [
    "MIG-4b1d0c9e-1111-5a5a-9c9c-000000000001",
    "MIG-4b1d0c9e-2222-5a5a-9c9c-000000000002",
    "MIG-77aa0000-3333-5a5a-9c9c-000000000003",
]


def split_machine():
    """GPU 0 in MIG mode (instances 1 and 2 as NVML devices 2 and 3), GPU 1 whole."""
    split = GpuMemory(0, UUIDS[0], H200, None, None, None, mig_mode=True)
    whole = GpuMemory(1, UUIDS[1], H200, 80, 1, 79)
    instances = [
        GpuMemory(2 + n, MIG_UUIDS[n], f"{H200} MIG {profile}", 18, 1, 17,
                  mig=MigInstance(0, UUIDS[0], gi, 0, profile))
        for n, (gi, profile) in enumerate([(1, "1g.18gb"), (2, "3g.71gb")])
    ]  # fmt: skip
    return [split, whole, *instances]


MIG = split_machine()

CASES = {
    # name: (gpus, environment, expected indices, words the note must hold or None)
    "unset sees all": (SAME, {}, (0, 1, 2), None),
    "empty sees none": (SAME, {"CUDA_VISIBLE_DEVICES": ""}, (), None),
    "one number": (SAME, {"CUDA_VISIBLE_DEVICES": "1"}, (1,), None),
    "order of the list": (SAME, {"CUDA_VISIBLE_DEVICES": "2,0"}, (2, 0), None),
    "spaces and a trailing comma": (SAME, {"CUDA_VISIBLE_DEVICES": " 0, 2,"}, (0, 2), None),
    "stops at a negative number": (SAME, {"CUDA_VISIBLE_DEVICES": "0,2,-1,1"}, (0, 2), "'-1'"),
    "minus one hides all": (SAME, {"CUDA_VISIBLE_DEVICES": "-1"}, (), "hide every GPU"),
    "stops beyond the machine": (SAME, {"CUDA_VISIBLE_DEVICES": "1,3,0"}, (1,), "beyond the 3"),
    "stops at garbage": (SAME, {"CUDA_VISIBLE_DEVICES": "all"}, (), "neither"),
    "full uuid": (SAME, {"CUDA_VISIBLE_DEVICES": UUIDS[2]}, (2,), None),
    "unique uuid prefix": (SAME, {"CUDA_VISIBLE_DEVICES": "GPU-1b2c,GPU-8932f9"}, (2, 0), None),
    "ambiguous uuid prefix": (
        SAME,
        {"CUDA_VISIBLE_DEVICES": "1,GPU-8932f"},
        (1,),
        "matches 2 GPUs",
    ),
    "unknown uuid": (SAME, {"CUDA_VISIBLE_DEVICES": "GPU-ffff,0"}, (), "matches no GPU"),
    "repeat stops": (SAME, {"CUDA_VISIBLE_DEVICES": "0,0,1"}, (0,), "repeats"),
    "a MIG entry where no GPU is split stops": (
        SAME,
        {"CUDA_VISIBLE_DEVICES": f"MIG-{UUIDS[0]}/1/0,1"},
        (),
        "matches no MIG instance",
    ),
    "one MIG instance": (MIG, {"CUDA_VISIBLE_DEVICES": MIG_UUIDS[1]}, (3,), None),
    "MIG uuid prefix": (MIG, {"CUDA_VISIBLE_DEVICES": "MIG-4b1d0c9e-2"}, (3,), None),
    "ambiguous MIG prefix": (
        MIG,
        {"CUDA_VISIBLE_DEVICES": "MIG-4b1d"},
        (),
        "matches 2 MIG instances",
    ),
    "MIG instances in a list": (
        MIG,
        {"CUDA_VISIBLE_DEVICES": f"{MIG_UUIDS[1]},{MIG_UUIDS[0]}"},
        (3, 2),
        None,
    ),
    "MIG beside a GPU uuid": (
        MIG,
        {"CUDA_VISIBLE_DEVICES": f"{UUIDS[1]},{MIG_UUIDS[0]}"},
        (1, 2),
        None,
    ),
    "MIG by GPU uuid and ids": (MIG, {"CUDA_VISIBLE_DEVICES": f"MIG-{UUIDS[0]}/2/0"}, (3,), None),
    "unknown MIG stops": (
        MIG,
        {"CUDA_VISIBLE_DEVICES": f"{MIG_UUIDS[0]},{MIG_UUIDS[2]},1"},
        (2,),
        "no MIG instance",
    ),
    "MIG twice stops": (
        MIG,
        {"CUDA_VISIBLE_DEVICES": f"{MIG_UUIDS[0]},MIG-4b1d0c9e-1"},
        (2,),
        "repeats",
    ),
    "unset: instances for the split GPU": (MIG, {}, (2, 3, 1), "GPU 0 is in MIG mode"),
    "a split GPU by number": (MIG, {"CUDA_VISIBLE_DEVICES": "1,0"}, (1, 2, 3), "MIG mode"),
    "integers count whole GPUs only": (
        MIG,
        {"CUDA_VISIBLE_DEVICES": "2"},
        (),
        "beyond the 2 GPU(s)",
    ),
    "mixed models, unset": (MIXED, {}, (0, 1), "CUDA_DEVICE_ORDER=PCI_BUS_ID"),
    "mixed models, numbers": (MIXED, {"CUDA_VISIBLE_DEVICES": "1"}, (1,), "a guess"),
    "mixed models, PCI order": (
        MIXED,
        {"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        (1, 0),
        None,
    ),
    "mixed models, uuids are certain": (MIXED, {"CUDA_VISIBLE_DEVICES": UUIDS[1]}, (1,), None),
    "unknown device order": (SAME, {"CUDA_DEVICE_ORDER": "SLOWEST"}, (0, 1, 2), "'SLOWEST'"),
    "no GPUs from NVML": ([], {"CUDA_VISIBLE_DEVICES": "0"}, (), None),
}


@pytest.mark.parametrize("case", CASES)
def test_visible_gpus(case):
    gpus, environ, indices, note_words = CASES[case]
    seen = visible_gpus(gpus, environ)
    assert seen.indices == indices
    if note_words is None:
        assert seen.note is None
    else:
        assert note_words in seen.note


def test_invalid_entry_note_tells_what_cuda_does():
    seen = visible_gpus(SAME, {"CUDA_VISIBLE_DEVICES": "0,x,1"})
    assert seen == VisibleGpus(
        (0,),
        "CUDA_VISIBLE_DEVICES entry 'x' is neither a GPU number nor a GPU-... or MIG-... UUID; "
        "CUDA ignores it and every entry after it",
    )


def test_a_gpu_nvml_never_named_makes_numbers_and_uuids_uncertain():
    gpus = [GpuMemory(0, UUIDS[0], H200, 80, 1, 79), GpuMemory(1, None, None, None, None, None)]
    numbers = visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1"})
    assert numbers.indices == (1,) and "a guess" in numbers.note
    uuid = visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-1b2c"})
    assert uuid.indices == () and "UUID NVML could read" in uuid.note


def test_nvml_order_does_not_matter():
    shuffled = list(reversed(SAME))
    assert visible_gpus(shuffled, {"CUDA_VISIBLE_DEVICES": "0,1"}).indices == (0, 1)


def test_importing_touches_neither_jax_nor_nvml():
    code = "import sys, jax_nbmem.gpu.visible; print(sorted({'jax', 'pynvml'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
