"""GPU sharing caps: MPS's and HAMi's variables read strictly, and what JAX takes under them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from jax_nbmem.allocator.caps import (
    CapError,
    MemoryCap,
    caps_by_gpu,
    cuda_view,
    parse_hami_limit,
    parse_mps_limit,
    pool_under_cap,
    read_caps,
)

GIB, MIB = 1024**3, 1024**2


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total_bytes: int | None = 80 * GIB


@pytest.mark.parametrize(
    ("text", "limits"),
    [
        ("0=20G", {0: 20 * GIB}),
        ("0=20G,1=8G", {0: 20 * GIB, 1: 8 * GIB}),
        ("0=512M", {0: 512 * MIB}),
        ("0=512MB, 1=2GB", {0: 512 * MIB, 1: 2 * GIB}),
        ("1=4g", {1: 4 * GIB}),
    ],
)
def test_mps_limits_in_each_unit(text, limits):
    assert parse_mps_limit(text) == limits


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0=20", "has no unit"),
        ("0=20T", "is not <CUDA device>"),
        ("20G", "is not <CUDA device>"),
        ("0=1.5G", "is not <CUDA device>"),
        ("0=020G", "is not <CUDA device>"),
        ("0=20G,0=8G", "named twice"),
        ("0=0G", "a limit of 0"),
        ("0=20G,", "is not <CUDA device>"),
        ("-1=20G", "is not <CUDA device>"),
        ("   ", "empty"),
    ],
)
def test_malformed_mps_limits_say_why(text, why):
    with pytest.raises(CapError, match=why):
        parse_mps_limit(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8192m", 8 * GIB),
        ("20g", 20 * GIB),
        ("20G", 20 * GIB),
        ("1048576k", GIB),
        ("1073741824", GIB),
        ("0", 0),
    ],
)
def test_hami_limits_in_each_unit(text, size):
    assert parse_hami_limit(text) == size


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("8.5g", "not an integer"),
        ("20gb", "not an integer"),
        ("20 GiB", "not an integer"),
        ("0x100m", "not an integer"),
        ("010m", "octal"),
        ("-1g", "not an integer"),
        ("lots", "not an integer"),
    ],
)
def test_malformed_hami_limits_say_why(text, why):
    with pytest.raises(CapError, match=why):
        parse_hami_limit(text)


def test_hami_indexed_variable_wins_over_the_fallback():
    caps = read_caps(
        {"CUDA_DEVICE_MEMORY_LIMIT": "20g", "CUDA_DEVICE_MEMORY_LIMIT_1": "8192m"}, devices=3
    )
    assert {o: c.bytes for o, c in caps.by_ordinal.items()} == {0: 20 * GIB, 1: 8 * GIB,
                                                                2: 20 * GIB}  # fmt: skip
    assert caps.by_ordinal[1].variable == "CUDA_DEVICE_MEMORY_LIMIT_1"
    assert all(c.cuda_total_is_cap for c in caps.by_ordinal.values()) and not caps.problems


def test_hami_zero_and_empty_mean_no_limit():
    caps = read_caps({"CUDA_DEVICE_MEMORY_LIMIT": "0", "CUDA_DEVICE_MEMORY_LIMIT_1": ""}, 2)
    assert caps.by_ordinal == {} and caps.problems == ()


def test_bad_variables_are_said_and_set_no_cap():
    caps = read_caps(
        {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20", "CUDA_DEVICE_MEMORY_LIMIT_0": "8.5g"}, 1
    )
    assert caps.by_ordinal == {}
    assert len(caps.problems) == 2
    assert "no unit" in caps.problems[0] and "8.5g" in caps.problems[1]


def test_a_cap_on_a_device_this_process_does_not_see_is_said():
    caps = read_caps({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20G,3=8G"}, devices=2)
    assert list(caps.by_ordinal) == [0]
    assert "caps CUDA device 3, but this process sees 2 CUDA devices" in caps.problems[0]


def test_with_both_the_smaller_cap_binds():
    caps = read_caps(
        {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20G", "CUDA_DEVICE_MEMORY_LIMIT": "8g"}, 1
    )
    assert caps.by_ordinal[0].kind == "hami" and caps.by_ordinal[0].bytes == 8 * GIB


def test_ordinals_count_after_cuda_visible_devices():
    gpus = [Gpu(0, "GPU-a"), Gpu(1, "GPU-b"), Gpu(2, "GPU-c")]
    environ = {"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20G,1=8G",
               "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # fmt: skip
    caps, problems = caps_by_gpu(environ, gpus)
    assert {i: c.bytes for i, c in caps.items()} == {2: 20 * GIB, 0: 8 * GIB}
    assert problems == ()


def test_a_cap_larger_than_the_card_is_no_cap_and_is_said():
    caps, problems = caps_by_gpu({"CUDA_DEVICE_MEMORY_LIMIT": "100g"}, [Gpu(0, "GPU-a")])
    assert caps == {}
    assert "at 100 GiB, more than its 80.0 GiB: no cap there" in problems[0]


def test_mps_default_pool_overruns_and_retries_end_just_under_the_cap():
    cap = MemoryCap(0, 20 * GIB, "mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    taken = pool_under_cap(0.75, 80 * GIB, cap)
    assert taken.asked == 60 * GIB and not taken.fits
    # 60 GiB x 0.9**11 = 18.8 GiB: the first retry under 20 GiB, nearly all of the cap.
    assert taken.pool == pytest.approx(60 * GIB * 0.9**11, rel=1e-6)
    assert 0.9 * 20 * GIB < taken.pool <= 20 * GIB


def test_hami_fraction_is_of_the_cap():
    cap = MemoryCap(0, 20 * GIB, "hami", "CUDA_DEVICE_MEMORY_LIMIT")
    taken = pool_under_cap(0.75, 80 * GIB, cap, reserve=512 * MIB)
    assert taken.asked == taken.pool == 15 * GIB and taken.fits
    assert not pool_under_cap(1.0, 80 * GIB, cap, reserve=512 * MIB).fits


def test_cuda_view_under_each():
    mps = MemoryCap(0, 20 * GIB, "mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    hami = MemoryCap(0, 20 * GIB, "hami", "CUDA_DEVICE_MEMORY_LIMIT")
    assert cuda_view(80 * GIB, 70 * GIB, mps) == (80 * GIB, 20 * GIB)
    assert cuda_view(80 * GIB, 70 * GIB, hami, held=2 * GIB) == (20 * GIB, 18 * GIB)
    assert cuda_view(80 * GIB, 5 * GIB, hami) == (20 * GIB, 5 * GIB)
    assert cuda_view(80 * GIB, 70 * GIB, None) == (80 * GIB, 70 * GIB)
