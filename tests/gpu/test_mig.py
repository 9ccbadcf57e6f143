"""How a MIG instance is named: its profile from NVML's name, and its label for people."""

from __future__ import annotations

import pytest

from jax_nbmem.gpu.mig import MigInstance, gpu_label, mig_dict, profile_from_name
from jax_nbmem.gpu.nvml import GpuMemory


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H200 MIG 3g.71gb", "3g.71gb"),
        ("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb", "1c.3g.40gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
        ("MIG 2g.20gb", "2g.20gb"),
        ("NVIDIA H200", None),
        ("NVIDIA MIGHTY 3g.71gb", None),
        (None, None),
    ],
)
def test_profile_from_the_instance_name(name, profile):
    assert profile_from_name(name) == profile


def test_labels_a_person_reads():
    whole = GpuMemory(1, "GPU-1", "NVIDIA H200", 80, 1, 79)
    place = MigInstance(0, "GPU-0", 1, 0, "3g.71gb")
    instance = GpuMemory(2, "MIG-a", "NVIDIA H200 MIG 3g.71gb", 71, 1, 70, mig=place)
    unnamed = GpuMemory(3, "MIG-b", "odd", 9, 1, 8, mig=MigInstance(0, None, 5, None, None))
    assert (whole.label, instance.label) == ("GPU 1", "MIG 3g.71gb instance 1 of GPU 0")
    assert gpu_label(unnamed) == "MIG instance 5 of GPU 0"
    second_ci = GpuMemory(4, "MIG-c", "x", 9, 1, 8, mig=MigInstance(0, "GPU-0", 1, 1, "1c.3g.40gb"))
    assert second_ci.label == "MIG 1c.3g.40gb instance 1 compute instance 1 of GPU 0"
    assert mig_dict(None) is None and mig_dict(place)["gpu_instance_id"] == 1
