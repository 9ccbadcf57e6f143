"""`%jaxalloc auto`'s rule, the claims kernels starting together leave, and the site's policy."""

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from jax_nbmem.node.claims import Claim, claim_book
from jax_nbmem.tenants.auto import Policy, choose_mode, policy_refusal
from tests.waiting import wait_for

GIB = 1024**3


@dataclass
class Gpu:
    index: int = 0
    uuid: str = "GPU-a"
    total_bytes: int = 80 * GIB
    free_bytes: int = 79 * GIB


@dataclass
class Tenant:
    pid: int
    gpu: int = 0
    kind: str = "kernel"
    used_bytes: int = 60 * GIB


def test_alone_with_room_takes_jax_default_and_says_why():
    choice = choose_mode([Gpu()], [])
    assert str(choice.mode) == "on"
    assert "alone on GPU 0" in choice.reason and "fastest" in choice.reason
    assert choice.claim == {"GPU-a": int(0.75 * 80 * GIB)}


def test_another_framework_in_the_kernel_means_no_pool_even_alone():
    choice = choose_mode([Gpu()], [], frameworks=["torch"])
    assert str(choice.mode) == "off" and choice.claim == {}
    assert "PyTorch imported in this kernel" in choice.reason and "starve" in choice.reason
    assert str(choose_mode([Gpu()], [], frameworks=[]).mode) == "on"


def test_a_preallocated_neighbour_means_off_or_a_fraction_that_fits():
    gpu, hog = Gpu(free_bytes=19 * GIB), Tenant(pid=4242)
    choice = choose_mode([gpu], [hog])
    assert str(choice.mode) == "off" and choice.claim == {}
    assert "GPU 0 is shared (PID 4242 holds 60.0 GiB; 19.0 GiB free)" in choice.reason
    assert str(choose_mode([gpu], [hog], auto_fraction=0.2).mode) == "fraction 0.2"
    # Never a pool larger than what is free (with a margin).
    assert str(choose_mode([gpu], [hog], auto_fraction=0.25).mode) == "off"


def test_too_little_free_for_the_default_pool_is_off_even_alone():
    choice = choose_mode([Gpu(free_bytes=50 * GIB)], [])
    assert str(choice.mode) == "off" and "too little free" in choice.reason


def test_no_gpu_leaves_jax_default_and_says_why():
    choice = choose_mode([], [], no_gpu_reason="NVML unavailable (no driver)")
    assert str(choice.mode) == "on" and choice.reason.startswith("NVML unavailable (no driver)")


def test_another_kernels_claim_counts_until_nvml_shows_its_pool():
    claim = Claim(pid=77, started_at=0.0, bytes_by_gpu={"GPU-a": 60 * GIB}, expires_at=1e12)
    seen_free = Gpu(free_bytes=79 * GIB)  # the claimant has not allocated yet
    choice = choose_mode([seen_free], [], [claim])
    assert str(choice.mode) == "off" and "kernels starting now claim 60.0 GiB" in choice.reason
    # Once NVML lists it holding its pool, the claim is in `free` already: not counted twice.
    landed = choose_mode([Gpu(free_bytes=19 * GIB)], [Tenant(pid=77)], [claim], auto_fraction=0.2)
    assert str(landed.mode) == "fraction 0.2"


def test_policy_caps_the_fraction_and_can_forbid_preallocating_a_shared_gpu():
    capped = Policy.from_setting({"max_fraction": 0.5, "reason": "shared node"})
    choice = choose_mode([Gpu()], [], policy=capped)
    assert str(choice.mode) == "fraction 0.5" and "policy" in choice.reason
    from jax_nbmem.allocator.modes import parse_mode

    refusal = policy_refusal(parse_mode("on"), capped, [Gpu()], [])
    assert "at most 50%" in refusal and "(shared node)" in refusal
    assert policy_refusal(parse_mode("fraction 0.4"), capped, [Gpu()], []) is None
    assert policy_refusal(parse_mode("off"), capped, [Gpu()], []) is None
    strict = Policy.from_setting({"shared_preallocation": False})
    assert "forbids preallocating on a shared GPU" in policy_refusal(
        parse_mode("fraction 0.1"), strict, [Gpu()], [Tenant(pid=9)]
    )
    assert str(choose_mode([Gpu(free_bytes=19 * GIB)], [Tenant(pid=9)], auto_fraction=0.1,
                           policy=strict).mode) == "off"  # fmt: skip
    with pytest.raises(ValueError, match="max_fraction"):
        Policy.from_setting({"max_fraction": 2})
    with pytest.raises(ValueError, match="unknown keys"):
        Policy.from_setting({"maxfraction": 0.5})


def test_claims_are_seen_by_others_expire_and_die_with_their_process(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with claim_book(str(tmp_path)) as book:
            book.claim(sleeper.pid, {"GPU-a": 10 * GIB}, ttl_s=30)
            # Long enough to be seen below on a loaded machine, short enough to wait out.
            made = time.monotonic()
            book.claim(os.getpid(), {"GPU-a": 5 * GIB}, ttl_s=3)
        with claim_book(str(tmp_path)) as book:
            others = book.others(own_pid=-1)
            assert {c.pid for c in others} == {sleeper.pid, os.getpid()}
            assert [c.pid for c in book.others(own_pid=sleeper.pid)] == [os.getpid()]

        def only_the_sleepers_claim_left():
            with claim_book(str(tmp_path)) as book:
                return [c.pid for c in book.others(own_pid=-1)] == [sleeper.pid]

        wait_for("the 3 s claim to expire", only_the_sleepers_claim_left, timeout=30)
        assert time.monotonic() - made >= 2.9  # by its time to live, not before (clocks differ)
        sleeper.kill()
        sleeper.wait()
        with claim_book(str(tmp_path)) as book:
            assert book.others(own_pid=-1) == []  # its process is gone
    finally:
        sleeper.kill()


def test_the_lock_is_exclusive_and_a_stuck_holder_is_not_waited_for_long(tmp_path):
    with claim_book(str(tmp_path)) as first:
        assert first is not None
        began = time.monotonic()
        with claim_book(str(tmp_path), wait_s=0.3) as second:
            assert second is None  # decided without claims, after a bounded wait
        assert 0.25 < time.monotonic() - began < 2
    with claim_book(None) as nowhere:
        assert nowhere is None


_DECIDE = """
import json
from jax_nbmem.allocator.modes import AllocatorMode
from jax_nbmem.tenants.auto import Policy, decide
mode, choice = decide(AllocatorMode("auto"), policy=Policy(), claims_dir=None)
print(json.dumps([str(mode), choice.reason, dict(choice.claim)]))
"""


def test_on_a_mig_instance_the_room_is_the_instance_s(sim_state, simgpu_env, sleeper):
    small, big = "MIG-11111111-2222-5333-8444-555555555555", "MIG-66666666-7777-5888-8999-0000"
    sim_state.gpu(0, total=141 * GIB, mig=True).gpu(1, total=141 * GIB)
    sim_state.mig(0, 1, 18 * GIB, uuid=small, name="NVIDIA H200 MIG 1g.18gb")
    sim_state.mig(0, 2, 71 * GIB, uuid=big + "00000000", name="NVIDIA H200 MIG 3g.71gb")
    sim_state.process(0, sleeper, 30 * GIB, mig=2).write()

    def decide_on(visible):
        env = {**simgpu_env, "CUDA_VISIBLE_DEVICES": visible}
        done = subprocess.run(
            [sys.executable, "-c", _DECIDE], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    mode, reason, claim = decide_on(small)
    assert mode == "on" and claim == {small: int(0.75 * 18 * GIB)}
    assert "alone on MIG 1g.18gb instance 1 of GPU 0 with 18.0 GiB of 18.0 GiB free" in reason
    mode, reason, claim = decide_on(big)
    assert mode == "off" and claim == {}
    assert (
        f"MIG 3g.71gb instance 2 of GPU 0 is shared (PID {sleeper} holds 30.0 GiB; 41.0 GiB free)"
        in reason
    )
