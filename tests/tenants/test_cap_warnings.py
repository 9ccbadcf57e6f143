"""prealloc-exceeds-cap: a mode that will not fit under this kernel's MPS or HAMi cap."""

from __future__ import annotations

from jax_nbmem.allocator.caps import MemoryCap
from jax_nbmem.gpu.nvml import GpuMemory
from jax_nbmem.tenants.advice import warnings_for
from jax_nbmem.tenants.attribution import Tenant

GIB = 1024**3
MPS = MemoryCap(0, 20 * GIB, "mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
HAMI = MemoryCap(0, 20 * GIB, "hami", "CUDA_DEVICE_MEMORY_LIMIT")


def gpu(free: int) -> GpuMemory:
    return GpuMemory(0, "GPU-a", "NVIDIA H100", 80 * GIB, 80 * GIB - free, free)


def kinds(fraction, cap, free=80 * GIB, tenants=()):
    found = warnings_for(tenants, [gpu(free)], own_backend_started=False,
                         own_requested_fraction=fraction, own_caps={0: cap})  # fmt: skip
    return [(w.kind, w.message) for w in found]


def test_mps_default_exceeds_the_cap_and_says_what_fits():
    [(kind, message)] = kinds(0.75, MPS)
    assert kind == "prealloc-exceeds-cap"
    assert "ask for 75% of the whole of GPU 0, as CUDA reports it (60.0 GiB)" in message
    assert (
        "MPS caps this process at 20.0 GiB on GPU 0 (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)" in message
    )
    assert "its 0.9x retries end at 18.8 GiB" in message
    assert "`%jaxalloc fraction 0.2`, which fits" in message
    assert kinds(0.2, MPS) == []  # 16 GiB of the card fits under 20 GiB


def test_hami_fraction_is_of_the_cap():
    assert kinds(0.75, HAMI) == []
    [(kind, message)] = kinds(1.0, HAMI)
    assert kind == "prealloc-exceeds-cap" and "ask for 100% of the cap (20.0 GiB)" in message
    assert "`%jaxalloc fraction 0.95`, which fits" in message


def test_a_mode_that_fits_the_cap_is_judged_against_what_is_free_under_it():
    other = Tenant(pid=7, gpu=0, used_bytes=70 * GIB, kind="process", notebook=None,
                   preallocated=True)  # fmt: skip
    found = dict(kinds(0.75, HAMI, free=10 * GIB, tenants=[other]))
    assert "prealloc-exceeds-cap" not in found
    message = found["prealloc-will-fail"]
    assert "ask for 75% of GPU 0 (15.0 GiB), but only 10.0 GiB is free" in message
