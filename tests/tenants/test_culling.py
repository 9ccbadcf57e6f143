"""Issue 22: which kernels the GPU-aware culler would stop, and which notices a kernel believes."""

from __future__ import annotations

import json
import os
import time

import pytest

from jax_nbmem.node.notices import (
    CullCounts,
    Notice,
    notice_warning,
    read_counts,
    read_notice,
    relayed_notice,
    write_counts,
    write_notice,
)
from jax_nbmem.simgpu import GIB
from jax_nbmem.tenants.culling import CullPolicy, candidates

TOTAL = 80 * GIB
POOL = 60 * GIB + (300 << 20)


def _report(*processes, free=TOTAL - POOL):
    gpu = {"index": 0, "total_bytes": TOTAL, "free_bytes": free, "used_bytes": TOTAL - free}
    return {"gpus": [gpu], "processes": list(processes)}


def _kernel(pid, idle, used=POOL, preallocated=True, user="alice", hub_user=None):
    return {
        "pid": pid, "gpu": 0, "kind": "kernel", "idle_s": idle, "used_bytes": used,
        "preallocated": preallocated, "user": user, "hub_user": hub_user,
        "notebook_shown": "~alice/hog.ipynb", "kernel_id": f"k{pid}", "started_at": 1.0,
    }  # fmt: skip


def test_an_idle_pool_on_a_short_gpu_is_a_candidate_and_nothing_else_is():
    policy = CullPolicy(idle_s=3600)
    (found,) = candidates(_report(_kernel(1, 7200)), policy)
    assert (found.pid, found.reason, found.notebook) == (1, "idle-preallocated", "~alice/hog.ipynb")
    assert "idle for 2 h 00 min" in found.why and "a default JAX start needs" in found.why
    assert candidates(_report(_kernel(1, 600)), policy) == []  # not idle long enough
    assert candidates(_report(_kernel(1, 0)), policy) == []  # busy
    assert candidates(_report(_kernel(1, None)), policy) == []  # idleness unknown
    assert candidates(_report(_kernel(1, 7200), free=70 * GIB), policy) == []  # nobody short
    assert candidates(_report(_kernel(1, 7200, preallocated=False)), policy) == []
    assert candidates(_report({**_kernel(1, 7200), "kind": "process"}), policy) == []
    # A report's hub user is the kernel's claim: it exempts no one (the culler exempts by
    # the proven owner, CullPolicy.exempts).
    by_hub_name = CullPolicy(idle_s=3600, exempt=frozenset({"ada"}))
    (claimed,) = candidates(_report(_kernel(1, 7200, user="jovyan", hub_user="ada")), by_hub_name)
    assert claimed.hub_user == "ada"


def test_an_exemption_takes_the_proven_owner_or_the_unix_user():
    from jax_nbmem.agent.facts import ProvenOwner

    policy = CullPolicy(idle_s=3600, exempt=frozenset({"ada", "alice"}))
    pod = "its pod jhub/jupyter-ada's hub.jupyter.org/username (the Kubernetes API)"
    assert policy.exempts(ProvenOwner("ada", pod, True), "jovyan")
    assert not policy.exempts(ProvenOwner("bob", pod, True), "jovyan")
    assert policy.exempts(ProvenOwner("alice", "the Unix user of its process", False), "alice")


def test_a_share_of_the_gpu_counts_only_when_the_policy_sets_one():
    big = _kernel(2, 7200, used=40 * GIB, preallocated=False)
    assert candidates(_report(big, free=30 * GIB), CullPolicy(idle_s=3600)) == []
    (found,) = candidates(_report(big, free=30 * GIB), CullPolicy(idle_s=3600, share=0.4))
    assert found.reason == "idle-over-share" and "more than 40% of the GPU" in found.why


def _notice(pid, started_at=None):
    now = time.time()
    return Notice(pid, started_at, now, now + 600, "idle-preallocated", "idle for 2 h")


def test_a_kernel_believes_the_culler_only(tmp_path, other_user):
    share = tmp_path / "share"
    share.mkdir()
    share.chmod(0o1777)
    started = 1234.5
    path = write_notice(str(share), _notice(os.getpid(), started))
    notice = read_notice([str(share)], os.getpid(), started)
    assert notice is not None and notice.deadline > time.time()
    warning = notice_warning(notice, os.getpid(), 0)
    assert warning["kind"] == "cull-pending"
    at = time.strftime("%H:%M", time.localtime(notice.deadline))
    assert f"will be shut down at {at} unless it runs a cell" in warning["message"]
    # Meant for an earlier process of the PID: not this one's.
    assert read_notice([str(share)], os.getpid(), started + 60) is None
    # Another user's file saying the same is no notice.
    _, uid, gid = other_user
    os.chown(path, uid, gid)
    assert read_notice([str(share)], os.getpid(), started) is None


def test_a_broken_or_linked_notice_is_none(tmp_path):
    pid = os.getpid()
    (tmp_path / f"jax_nbmem-cull-{pid}.json").write_text("{not json")
    assert read_notice([str(tmp_path)], pid) is None
    (tmp_path / "elsewhere.json").write_text(json.dumps({"pid": pid}))
    os.unlink(tmp_path / f"jax_nbmem-cull-{pid}.json")
    os.symlink(tmp_path / "elsewhere.json", tmp_path / f"jax_nbmem-cull-{pid}.json")
    assert read_notice([str(tmp_path)], pid) is None
    assert read_notice([str(tmp_path / "missing")], pid) is None


@pytest.mark.parametrize("started_at", ["NaN", "Infinity", '"yesterday"', "true"])
def test_a_notice_of_a_start_no_process_has_is_none(tmp_path, started_at):
    # The one strict field reader (jax_nbmem.node.fields): NaN and infinity, which Python's
    # JSON reader accepts, are no start time, and a notice that gives one is believed by no one.
    pid, now = os.getpid(), time.time()
    (tmp_path / f"jax_nbmem-cull-{pid}.json").write_text(
        f'{{"pid": {pid}, "started_at": {started_at}, "warned_at": {now}, "deadline": '
        f'{now + 600}, "reason": "idle-preallocated", "why": "idle for 2 h"}}'
    )
    assert read_notice([str(tmp_path)], pid) is None
    assert read_notice([str(tmp_path)], pid, 1234.5) is None
    fine = json.loads(
        (tmp_path / f"jax_nbmem-cull-{pid}.json")
        .read_text()
        .replace(f'"started_at": {started_at}', '"started_at": 1234.5')
    )
    assert relayed_notice(fine, pid, 1234.5) is not None


def test_the_cull_counts_are_the_cullers_only(tmp_path, other_user):
    share = tmp_path / "share"
    share.mkdir()
    share.chmod(0o1777)
    assert read_counts([str(share)]) is None  # no culler here
    path = write_counts(str(share), CullCounts({"idle-preallocated": 2}, since=100.0))
    assert read_counts([str(share)]) == CullCounts(
        {"idle-preallocated": 2, "idle-over-share": 0}, since=100.0
    )
    assert not path.split("/")[-1].startswith("jax_nbmem-cull-")  # never taken for a notice
    for forged in ({"counts": {"idle-preallocated": -1}, "since": 1}, {"counts": 3}, {}):
        with open(path, "w") as out:
            json.dump(forged, out)
        assert read_counts([str(share)]) is None, forged
    write_counts(str(share), CullCounts({"idle-preallocated": 2}, since=100.0))
    _, uid, gid = other_user
    os.chown(path, uid, gid)  # another user's file saying the same is no count
    assert read_counts([str(share)]) is None


@pytest.mark.parametrize("idle", [3600.0, 3600.5])
def test_the_limit_is_inclusive(idle):
    assert candidates(_report(_kernel(3, idle)), CullPolicy(idle_s=3600))


def test_the_culler_names_the_hub_user_and_the_unix_user_as_warnings_do():
    (found,) = candidates(
        _report(_kernel(3, 7200, user="jovyan", hub_user="ada")), CullPolicy(idle_s=3600)
    )
    assert (
        found.label() == "kernel PID 3 (notebook ~alice/hog.ipynb, hub user ada (Unix user jovyan))"
    )
