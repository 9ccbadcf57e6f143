"""The mirror's caps: what MPS and HAMi enforce, read as they read it (not as jax_nbmem does)."""

from jax_nbmem.simgpu.mirror import memory_cap

GIB, MIB = 1024**3, 1024**2


def test_mps_caps_device_zero_in_m_or_g():
    assert memory_cap({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20G,1=8G"}) == ("mps", 20 * GIB)
    assert memory_cap({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=8G, 0=512MB"}) == ("mps", 512 * MIB)
    assert memory_cap({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=8G"}) is None
    assert memory_cap({}) is None


def test_hami_reads_loosely_as_hami_core_does():
    def hami(text, **more):
        return memory_cap({"CUDA_DEVICE_MEMORY_LIMIT": text, **more})

    assert hami("20g") == ("hami", 20 * GIB)
    assert hami("20g", CUDA_DEVICE_MEMORY_LIMIT_0="8192m") == ("hami", 8 * GIB)
    assert hami("8.5g") == ("hami", 8 * GIB)  # strtoul stops at the dot
    assert hami("010m") == ("hami", 8 * MIB)  # base 0: a leading 0 is octal
    assert hami("0x10m") == ("hami", 16 * MIB)
    assert hami("1073741824") == ("hami", GIB)
    assert hami("0") is None and hami("") is None and hami("lots") is None


def test_with_both_the_smaller_binds():
    both = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20G", "CUDA_DEVICE_MEMORY_LIMIT": "8g"}
    assert memory_cap(both) == ("hami", 8 * GIB)
