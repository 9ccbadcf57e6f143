"""`%jaxalloc auto`'s claims across PID namespaces (containers sharing one share directory).

Each "container" is a Python process as PID 1 of a PID namespace of its own (so every
container's claimant has the same PID there), deciding ``auto`` against one simulated GPU with
:func:`jax_nbmem.tenants.auto.decide`, as a kernel does at start. Root only (as CI runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from jax_nbmem.node.claims import ClaimBook, claim_book
from tests.agent.namespaces import contained, need_namespaces

GiB = 1 << 30
TOTAL = 80 * GiB

# Waits for the go file, decides `auto` under the claims lock, says what it chose, and lives on
# (its claim with it) until killed.
_KERNEL = """
import json, os, sys, time
from jax_nbmem.allocator.modes import AllocatorMode
from jax_nbmem.tenants.auto import Policy, decide
from jax_nbmem.node.identity import beacon_key
share, go = sys.argv[1], sys.argv[2]
print(json.dumps({"key": beacon_key(), "pid": os.getpid()}), flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
mode, choice = decide(AllocatorMode("auto"), policy=Policy(), claims_dir=share)
print(json.dumps([str(mode), choice.reason, dict(choice.claim)]), flush=True)
time.sleep(120)
"""


@pytest.fixture
def share(tmp_path, sim_state):
    need_namespaces()
    directory = tmp_path / "share"
    directory.mkdir(mode=0o1777)
    sim_state.gpu(0, TOTAL).write()
    return directory


def kernel(name, share, go, simgpu_env):
    env = {**os.environ, **simgpu_env, "PYTHONPATH": os.getcwd()}
    return contained([sys.executable, "-c", _KERNEL, str(share), str(go)], hostname=name, env=env)


def claims_in(share) -> list[str]:
    return sorted(p.name for p in share.iterdir() if p.name.startswith("jax_nbmem-claim-"))


def counted_on_the_host(share) -> list[tuple[str, dict]]:
    with claim_book(str(share)) as book:
        return [(c.key, dict(c.bytes_by_gpu)) for c in book.others(own_pid=-1)]


def test_two_containers_deciding_at_once_see_each_other_and_a_sigkill_ends_a_claim(
    share, sim_state, simgpu_env, tmp_path
):
    go = tmp_path / "go"
    alice_box = kernel("alice-box", share, go, simgpu_env)
    with alice_box as alice, kernel("bob-box", share, go, simgpu_env) as bob:
        said = [json.loads(alice.line()), json.loads(bob.line())]
        assert [s["pid"] for s in said] == [1, 1]  # the same PID in both containers
        assert said[0]["key"] != said[1]["key"]
        go.touch()  # both decide now
        choices = [json.loads(alice.line()), json.loads(bob.line())]
        modes = sorted(c[0] for c in choices)
        assert modes[0] != "on" or modes[1] != "on", choices  # not both 75% of one GPU
        first, second = sorted(choices, key=lambda c: c[0] != "on")
        assert first[0] == "on" and first[2] == {sim_state._gpus[0].uuid: int(0.75 * TOTAL)}
        assert "kernels starting now claim 60.0 GiB" in second[1], second
        winner = alice if choices[0][0] == "on" else bob
        key = said[0 if winner is alice else 1]["key"]
        # Its claim under its own name (namespace inode and PID there), not a bare "1" that
        # any other container's PID 1 would replace; the other claims nothing (it took none).
        assert second[2] == {} and claims_in(share) == [f"jax_nbmem-claim-{key}.json"]
        assert key.endswith("-1")
        # The host (another namespace) counts it by its lock, not by a PID 1 of its own.
        assert counted_on_the_host(share) == [(key, first[2])]
        winner.kill()  # SIGKILL: its files stay, its lock goes
        assert claims_in(share) == [f"jax_nbmem-claim-{key}.json"]
        assert counted_on_the_host(share) == []


def forge(share, key, *, pid, ns):
    now = time.time()
    content = {"key": key, "pid": pid, "started_at": now, "pid_ns": ns,
               "bytes_by_gpu": {"GPU-x": 10 * GiB}, "expires_at": now + 20}  # fmt: skip
    path = share / f"jax_nbmem-claim-{key}.json"
    path.write_text(json.dumps(content))
    return path


def test_another_namespace_s_claim_counts_only_by_its_writer_s_lock(tmp_path):
    share = tmp_path
    dev = os.stat("/proc/self/ns/pid").st_dev
    host = {"pid_ns": [dev, 0xEFFFFFFC], "pid_in_ns": os.getpid()}
    other = [dev, 4026999999]
    # Forged for another container's key, nobody holding it: no claim, though its PID is ours.
    forge(share, f"4026999999-{os.getpid()}", pid=os.getpid(), ns=other)
    # Its name and content disagree: no claim.
    forge(share, "4026999998-7", pid=8, ns=[dev, 4026999998])
    forge(share, "4026999997-7", pid=7, ns=other)
    assert ClaimBook(str(share), host).others(own_pid=-1) == []
    # Written (and held) by a live process of another namespace: a claim, never matched to a
    # local PID of its number, nor to NVML's; beyond the TTL from now, no claim.
    reader = ClaimBook(str(share), host)
    writer = ClaimBook(str(share), {"pid_ns": other, "pid_in_ns": 1})
    writer.claim(os.getpid(), {"GPU-x": 10 * GiB})
    (claim,) = reader.others(own_pid=-1)
    assert claim.key == f"4026999999-{os.getpid()}" and claim.nvml_pid is None
    assert not claim.in_nvml("GPU-x", {os.getpid(): 10 * GiB})
    writer.claim(os.getpid(), {"GPU-x": 10 * GiB}, ttl_s=3600)
    assert reader.others(own_pid=-1) == []
    writer.release(os.getpid())
    assert [p.name for p in share.iterdir() if "claim-4026999999" in p.name] == []


def test_on_the_host_a_plain_claim_keeps_today_s_checks(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with claim_book(str(tmp_path)) as book:
            book.claim(sleeper.pid, {"GPU-a": 10 * GiB})
            assert (tmp_path / f"jax_nbmem-claim-{sleeper.pid}.json").exists()
            (claim,) = book.others(own_pid=-1)
            assert claim.nvml_pid == sleeper.pid
            assert claim.in_nvml("GPU-a", {sleeper.pid: 9 * GiB})
            # Checked by its PID here, not by the lock (this process, its writer, holds that).
            sleeper.kill()
            sleeper.wait()
            assert book.others(own_pid=-1) == []
            book.release(sleeper.pid)
        assert not (tmp_path / f"jax_nbmem-claim-{sleeper.pid}.json").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_another_namespace_s_claim_is_matched_to_nvml_only_as_the_agent_or_its_beacon_says(
    tmp_path, monkeypatch
):
    from jax_nbmem.node import claims
    from jax_nbmem.node.resolution import Resolution, ResolvedProcess
    from tests.agent.agent_client import beacon

    dev = os.stat("/proc/self/ns/pid").st_dev
    host = {"pid_ns": [dev, 0xEFFFFFFC], "pid_in_ns": os.getpid()}
    other = [dev, 4026999999]
    writer = ClaimBook(str(tmp_path), {"pid_ns": other, "pid_in_ns": 1})
    writer.claim(os.getpid(), {"GPU-x": 10 * GiB})  # PID `os.getpid()` of that namespace
    reader = ClaimBook(str(tmp_path), host)
    try:
        (alone,) = reader.others(own_pid=-1)
        assert alone.nvml_pid is None and not alone.in_nvml("GPU-x", {os.getpid(): 10 * GiB})
        # The agent proved host PID 4242 for that namespace's PID: NVML's 4242 is its pool.
        row = ResolvedProcess(pid=4242, pid_in_container=os.getpid(), pid_ns=tuple(other),
                              start_ticks=1, gpus=(), container=None, kernel=None)  # fmt: skip
        fresh = Resolution("fresh", processes={4242: row})
        monkeypatch.setattr(claims, "load_resolution", lambda directory: fresh)
        (proven,) = reader.others(own_pid=-1)
        assert proven.nvml_pid == 4242 and proven.in_nvml("GPU-x", {4242: 10 * GiB})
        assert not proven.in_nvml("GPU-x", {os.getpid(): 10 * GiB})
        # Without the agent: its kernel's beacon (same key) says its pool is in place.
        monkeypatch.setattr(claims, "load_resolution", lambda directory: Resolution("absent"))
        identity = {"pid_ns": other, "pid_in_ns": os.getpid()}
        pool = {"bytes_in_use": 1, "pool_bytes": 10 * GiB, "bytes_limit": 10 * GiB,
                "peak_bytes_in_use": 1}  # fmt: skip
        content = {**beacon(identity), "mode_in_effect": "on", "pool_fraction": 0.75,
                   "gpus": {"GPU-x": pool}}  # fmt: skip
        key = f"4026999999-{os.getpid()}"
        (tmp_path / f"jax_nbmem-beacon-{key}.json").write_text(json.dumps(content))
        (landed,) = reader.others(own_pid=-1)
        assert landed.landed == frozenset({"GPU-x"}) and landed.in_nvml("GPU-x", {})
    finally:
        writer.release(os.getpid())


def test_the_agent_clears_claims_their_writers_let_go_of_long_ago(tmp_path):
    from jax_nbmem.agent.publish import clean_dead

    long_ago = time.time() - 600
    held = ClaimBook(str(tmp_path), {"pid_ns": [1, 4026999999], "pid_in_ns": 1})
    held.claim(os.getpid(), {"GPU-x": GiB})  # its writer (this process) holds it
    abandoned = forge(tmp_path, "4026999998-1", pid=1, ns=[1, 4026999998])
    fresh = forge(tmp_path, "4026999997-1", pid=1, ns=[1, 4026999997])
    link = tmp_path / "jax_nbmem-claim-4026999996-1.json"
    link.symlink_to(abandoned)
    for path in (tmp_path / f"jax_nbmem-claim-4026999999-{os.getpid()}.json", abandoned):
        os.utime(path, (long_ago, long_ago))
    try:
        assert clean_dead(str(tmp_path)) == [str(abandoned)]
        left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("jax_nbmem-claim"))
        assert left == sorted(
            [link.name, fresh.name, f"jax_nbmem-claim-4026999999-{os.getpid()}.json"]
        )
    finally:
        held.release(os.getpid())
