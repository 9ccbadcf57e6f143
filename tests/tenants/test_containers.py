"""A kernel in a container: NVML's host PIDs named through the node agent, or inferred without.

This process plays the kernel in a container by its claims (a PID namespace that is not the
host's); the node agent's resolution is a file written by hand as the agent writes it (root's,
0644, in a 0755 directory), and the other containers' kernels are beacons and alive locks in the
share directory. The test file that runs real kernels in real PID namespaces is
test_in_namespaces.py; this one checks each rule on its own, fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from jax_nbmem.gpu.nvml import GpuMemory, GpuProcess
from jax_nbmem.node.alive import AliveLock
from jax_nbmem.node.identity import own_identity, start_ticks
from jax_nbmem.node.resolution import SHOWN_KEYS, load_resolution
from jax_nbmem.node.servers import SessionIndex, shutdown_kernel
from jax_nbmem.tenants.advice import warnings_for
from jax_nbmem.tenants.attribution import PID_NAMESPACE_REASON, attribute
from jax_nbmem.tenants.containers import from_container

GiB, MiB = 1 << 30, 1 << 20
TOTAL = 80 * GiB
POOL = int(0.75 * TOTAL)  # JAX's default pool on an 80 GiB GPU
UUID = "GPU-0"
OUR_NS = [4, 4026532900]  # a PID namespace that is not the host's: this "kernel" is in a container
ALICE_NS = [4, 4026532777]
NO_SERVERS = SessionIndex({})


def gpu(used: int) -> GpuMemory:
    return GpuMemory(0, UUID, "Simulated GPU", TOTAL, used, TOTAL - used)


def our_identity() -> dict:
    return {**own_identity(), "pid_ns": OUR_NS, "hostname": "bob-container"}


def kernel_beacon(pid, ns, *, hub_user, notebook, mode="on", pool=POOL, fraction=0.75):
    """A beacon as a kernel in a container writes it (and sends it to the agent)."""
    return {
        "schema": 1, "pid": pid, "started_at": time.time() - 600, "user": "jovyan",
        "hub_user": hub_user, "kernel_id": f"k-{hub_user}", "notebook": notebook,
        "mode_requested": None, "mode_in_effect": mode, "pool_fraction": fraction,
        "gpus": {UUID: {"bytes_in_use": GiB, "pool_bytes": pool, "bytes_limit": pool,
                        "peak_bytes_in_use": GiB}},
        "cell_running": False, "last_cell_finished_at": time.time() - 300,
        "written_at": time.time(), "variables": {},
        "identity": {"pid_ns": ns, "pid_in_ns": pid, "start_ticks": 1234, "boot_id": "b",
                     "hostname": f"{hub_user}-container"},
    }  # fmt: skip


def write_resolution(share, processes, *, written_at=None, interval_s=5.0, mode=0o644):
    if os.geteuid() != 0:
        # The reader trusts a resolution root wrote (or the agent's user), never its own.
        pytest.skip("writes the agent's resolution as the agent does: that takes root")
    agent = share / "agent"
    agent.mkdir(mode=0o755, exist_ok=True)
    path = agent / "resolution.json"
    path.write_text(
        json.dumps({
            "schema": 1, "agent": {"pid": 1, "hostname": "node", "boot_id": "b", "version": "x"},
            "written_at": time.time() if written_at is None else written_at,
            "interval_s": interval_s, "processes": processes,
        })
    )  # fmt: skip
    os.chmod(path, mode)
    return path


def neighbour_entry(host_pid, *, kernel=None, name="jupyter-alice"):
    return {
        "pid": host_pid, "pid_in_container": 1, "pid_ns": ALICE_NS, "start_ticks": 1234,
        "gpus": [UUID], "source": "agent", "kernel": kernel,
        "container": {"id": "c0ffee" * 10, "runtime": "docker", "name": name, "pod_uid": None,
                      "pod": None, "namespace": None},
    }  # fmt: skip


def own_entry(host_pid, pid_here, ticks):
    return {
        "pid": host_pid, "pid_in_container": pid_here, "pid_ns": OUR_NS, "start_ticks": ticks,
        "gpus": [UUID], "source": "agent", "kernel": None,
        "container": {"id": "b0b" * 20, "runtime": "docker", "name": "jupyter-bob",
                      "pod_uid": None, "pod": None, "namespace": None},
    }  # fmt: skip


def in_container(processes, used, share, resolution=None, own_pid=None):
    return from_container(
        processes, [gpu(used)], our_identity(), resolution, [str(share)], {},
        os.getpid() if own_pid is None else own_pid, os.environ, NO_SERVERS,
    )  # fmt: skip


# --- The resolution: trusted only when it is the agent's -------------------------------------


def test_a_root_owned_resolution_is_read_and_names_its_processes(tmp_path):
    alice = kernel_beacon(1, ALICE_NS, hub_user="alice", notebook="/home/jovyan/hog.ipynb")
    write_resolution(tmp_path, [neighbour_entry(900001, kernel=alice), {"pid": "junk"}, 7, None])
    resolution = load_resolution(str(tmp_path))
    assert resolution.state == "fresh", resolution.reason
    assert list(resolution.processes) == [900001]  # the malformed entries are skipped
    entry = resolution.get(900001)
    assert entry.kernel.hub_user == "alice" and entry.container["name"] == "jupyter-alice"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")
def test_a_forged_resolution_is_ignored_with_a_said_reason(tmp_path, other_user):
    _, uid, gid = other_user
    path = write_resolution(tmp_path, [neighbour_entry(900001)])
    os.chown(path, uid, gid)  # the file is a user's, in root's directory
    found = load_resolution(str(tmp_path))
    assert found.state == "untrusted" and f"owned by uid {uid}" in found.reason

    os.chown(path, 0, 0)
    os.chown(path.parent, uid, gid)  # a user's own directory: no agent's
    found = load_resolution(str(tmp_path))
    assert found.state == "untrusted" and "not by root or the agent's user" in found.reason
    # ... unless the administrator says the agent runs as that user.
    env = {"JAX_NBMEM_AGENT_USER": str(uid)}
    os.chown(path, uid, gid)
    assert load_resolution(str(tmp_path), environ=env).state == "fresh"
    os.chown(path, 0, 0)
    os.chown(path.parent, 0, 0)

    os.chmod(path.parent, 0o775)  # group-writable: anyone in the group could replace it
    found = load_resolution(str(tmp_path))
    assert found.state == "untrusted" and "writable by others" in found.reason
    os.chmod(path.parent, 0o755)

    real = tmp_path / "elsewhere"
    (tmp_path / "agent").rename(real)
    (tmp_path / "agent").symlink_to(real)  # the directory is a symlink
    found = load_resolution(str(tmp_path))
    assert found.state == "untrusted" and "symlink" in found.reason

    (tmp_path / "agent").unlink()
    real.rename(tmp_path / "agent")
    path.rename(tmp_path / "agent" / "real.json")
    path.symlink_to(tmp_path / "agent" / "real.json")  # the file is a symlink
    found = load_resolution(str(tmp_path))
    assert found.state == "untrusted" and "not a regular file" in found.reason


def test_malformed_or_stale_or_absent_resolutions_say_why(tmp_path):
    assert load_resolution(str(tmp_path)).state == "absent"
    path = write_resolution(tmp_path, [])
    for junk in (b"[" * 100000, b"\xff\xfe", b'{"schema": 2}', b"1e999999", b'{"schema": 1}'):
        path.write_bytes(junk)
        found = load_resolution(str(tmp_path))
        assert found.state == "malformed" and found.reason, junk[:10]
    write_resolution(tmp_path, [neighbour_entry(900001)], written_at=time.time() - 60)
    stale = load_resolution(str(tmp_path))
    assert stale.state == "stale" and "60 s old" in stale.reason and not stale.processes


# --- With the agent: neighbours named, the own row known ------------------------------------


def test_with_the_agent_a_kernel_names_its_neighbour_and_finds_its_own_row(tmp_path):
    alice = kernel_beacon(1, ALICE_NS, hub_user="alice", notebook="/home/jovyan/hog.ipynb")
    me = os.getpid()
    write_resolution(
        tmp_path,
        [neighbour_entry(900001, kernel=alice), own_entry(900002, me, start_ticks())],
    )
    resolution = load_resolution(str(tmp_path))
    used = POOL + 300 * MiB + 300 * MiB
    listed = [GpuProcess(900001, 0, POOL + 300 * MiB), GpuProcess(900002, 0, 300 * MiB)]
    theirs, ours = in_container(listed, used, tmp_path, resolution, own_pid=me)

    assert (theirs.kind, theirs.source, theirs.hub_user) == ("kernel", "agent", "alice")
    assert theirs.notebook == "/home/jovyan/hog.ipynb" and theirs.mode == "on"
    assert theirs.idle_s == pytest.approx(300, abs=5) and theirs.preallocated is True
    assert theirs.container["name"] == "jupyter-alice" and theirs.pid_in_container == 1
    assert set(theirs.to_dict()["container"]) == set(SHOWN_KEYS)
    assert (ours.kind, ours.pid, ours.pid_in_container) == ("self", 900002, me)
    assert ours.container["name"] == "jupyter-bob"

    (warning,) = warnings_for([theirs, ours], [gpu(used)], own_backend_started=True)
    assert warning.kind == "blocking-preallocation" and warning.pid == 900001
    for said in ("PID 900001", "hog.ipynb", "hub user alice", "container jupyter-alice",
                 "jax-nbmem shutdown 900001"):  # fmt: skip
        assert said in warning.message, (said, warning.message)


def test_the_own_row_needs_namespace_pid_and_start_ticks_together(tmp_path):
    me = os.getpid()
    # Same namespace and PID, but another start: an earlier process of that PID, not us.
    write_resolution(tmp_path, [own_entry(900002, me, start_ticks() + 1)])
    resolution = load_resolution(str(tmp_path))
    assert resolution.own_row(our_identity()) is None
    write_resolution(tmp_path, [own_entry(900002, me, start_ticks())])
    assert load_resolution(str(tmp_path)).own_row(our_identity()).pid == 900002


# --- Without the agent: judged by size, named only when one claim fits ----------------------


@pytest.fixture
def claims(tmp_path):
    """Put live (locked) beacons of kernels in other containers into the share directory."""
    held = []

    def claim(ns_ino, pid, **kwargs):
        key = f"{ns_ino}-{pid}"
        content = kernel_beacon(pid, [4, ns_ino], **kwargs)
        (tmp_path / f"jax_nbmem-beacon-{key}.json").write_text(json.dumps(content))
        lock = AliveLock([str(tmp_path)], key)
        lock.hold()
        held.append(lock)
        return lock

    yield claim
    for lock in held:
        lock.release()


def test_without_the_agent_one_claim_that_fits_is_named_as_inferred(tmp_path, claims):
    claims(4026532777, 1, hub_user="alice", notebook="/home/jovyan/hog.ipynb")
    claims(4026532778, 1, hub_user="carol", notebook="/home/jovyan/small.ipynb", mode="off",
           pool=0, fraction=0.0)  # fmt: skip
    used = POOL + 600 * MiB
    listed = [GpuProcess(900001, 0, POOL + 300 * MiB), GpuProcess(900003, 0, 300 * MiB)]
    hog, small = in_container(listed, used, tmp_path)

    assert (hog.kind, hog.source, hog.hub_user, hog.mode) == ("kernel", "inferred", "alice", "on")
    assert hog.pid == 900001 and hog.pid_in_container is None and hog.preallocated is True
    assert "inferred, not proven" in hog.reason
    assert small.kind == "unknown" and small.reason.startswith(PID_NAMESPACE_REASON)
    found = warnings_for([hog, small], [gpu(used)], own_backend_started=True)
    assert [w.kind for w in found] == ["pid-namespace", "blocking-preallocation"]
    assert "jax-nbmem exporter --share-dir" in found[0].message
    assert "hostPID" not in found[0].message and "--pid=host" not in found[0].message
    blocking = found[1].message
    assert "hub user alice" in blocking and "hog.ipynb" in blocking and "inferred" in blocking


def test_without_the_agent_two_claims_that_fit_name_nobody_but_still_warn(tmp_path, claims):
    claims(4026532777, 1, hub_user="alice", notebook="/home/jovyan/hog.ipynb")
    claims(4026532779, 1, hub_user="dave", notebook="/home/jovyan/also.ipynb")
    used = POOL + 300 * MiB
    (row,) = in_container([GpuProcess(900001, 0, POOL + 300 * MiB)], used, tmp_path)
    assert row.kind == "unknown" and row.hub_user is None and row.source == "memory size"
    assert "2 live kernels in other containers" in row.reason
    found = warnings_for([row], [gpu(used)], own_backend_started=True)
    (blocking,) = [w for w in found if w.kind == "blocking-preallocation"]
    assert "alice" not in blocking.message and "dave" not in blocking.message
    assert "known only by its host PID" in blocking.message


def test_a_claim_whose_kernel_died_counts_for_nothing(tmp_path, claims):
    claims(4026532777, 1, hub_user="alice", notebook="/home/jovyan/hog.ipynb").release()
    # Killed: its beacon stays, but the lock is free (release() also removes the file; a
    # SIGKILL leaves it, see test_in_namespaces).
    used = POOL + 300 * MiB
    (row,) = in_container([GpuProcess(900001, 0, POOL + 300 * MiB)], used, tmp_path)
    assert row.kind == "unknown" and row.source == "memory size" and row.hub_user is None
    # Preallocation-sized, too little free for a default start: still a warning, unnamed.
    found = warnings_for([row], [gpu(used)], own_backend_started=True)
    assert "blocking-preallocation" in [w.kind for w in found]


def test_an_in_container_pid_equal_to_a_host_pid_is_no_match(tmp_path, sleeper):
    # NVML lists host PID N; a process here happens to carry N: it is never looked at.
    (row,) = in_container([GpuProcess(sleeper, 0, 300 * MiB)], 300 * MiB, tmp_path)
    assert row.kind == "unknown" and row.user is None and row.cmdline is None
    assert row.reason.startswith(PID_NAMESPACE_REASON) and "host PID" in row.reason
    # ... and the beacon of a kernel in another container that says PID N is not it either.
    (tmp_path / f"jax_nbmem-beacon-4026532777-{sleeper}.json").write_text(
        json.dumps(
            kernel_beacon(sleeper, ALICE_NS, hub_user="alice", notebook="/x.ipynb", pool=200 * MiB)
        )  # fmt: skip
    )
    (row,) = in_container([GpuProcess(sleeper, 0, 300 * MiB)], 300 * MiB, tmp_path)
    assert row.hub_user is None and row.kind == "unknown"
    # Nor is it stopped: %jaxmem shutdown N refuses, and the process here lives on.
    result = shutdown_kernel(sleeper, [row], confirm=True, grace_s=0.2)
    assert not result.done and "no node agent resolves" in result.message
    assert psutil.pid_exists(sleeper)


def test_a_stale_agent_says_agent_stale_and_falls_back(tmp_path, claims):
    alice = kernel_beacon(1, ALICE_NS, hub_user="alice", notebook="/home/jovyan/hog.ipynb")
    write_resolution(tmp_path, [neighbour_entry(900001, kernel=alice)], written_at=time.time() - 99)
    claims(4026532777, 1, hub_user="alice", notebook="/home/jovyan/hog.ipynb")
    resolution = load_resolution(str(tmp_path))
    used = POOL + 300 * MiB
    (row,) = in_container([GpuProcess(900001, 0, POOL + 300 * MiB)], used, tmp_path, resolution)
    assert row.source == "inferred" and row.container is None  # the fallback, not the agent
    found = warnings_for([row], [gpu(used)], own_backend_started=True, agent=resolution)
    assert [w.kind for w in found] == ["agent-stale", "blocking-preallocation"]
    assert "99 s old" in found[0].message


# --- %jaxmem shutdown: the host PID translated, or refused ----------------------------------


@pytest.fixture
def fake_kernel(tmp_path):
    """A process that looks like a Jupyter kernel (ipykernel with a connection file)."""
    process = subprocess.Popen([
        sys.executable, "-c", "import time; time.sleep(300)", "-m", "ipykernel_launcher",
        "-f", str(tmp_path / "kernel-fake.json"),
    ])  # fmt: skip
    yield process
    process.kill()
    process.wait()


def test_shutdown_translates_the_host_pid_to_the_pid_here(tmp_path, fake_kernel):
    here = fake_kernel.pid
    ticks = start_ticks(f"/proc/{here}/stat")
    entry = {**own_entry(900005, here, ticks), "kernel": None}
    write_resolution(tmp_path, [entry])
    resolution = load_resolution(str(tmp_path))
    (row,) = in_container([GpuProcess(900005, 0, GiB)], GiB, tmp_path, resolution)
    assert (row.kind, row.pid, row.pid_in_container) == ("kernel", 900005, here)
    plan = shutdown_kernel(900005, [row], confirm=False)
    assert f"PID {here} in this container" in plan.message and plan.how == "signal"
    done = shutdown_kernel(900005, [row], confirm=True, grace_s=5)
    assert done.done, done.message
    assert fake_kernel.wait(5) is not None


def test_shutdown_refuses_another_containers_kernel(tmp_path, fake_kernel):
    # The agent says host PID N is alice's kernel in another container, and a kernel here
    # happens to carry N: the one here must not be signalled.
    alice = kernel_beacon(1, ALICE_NS, hub_user="alice", notebook="/home/jovyan/hog.ipynb")
    write_resolution(tmp_path, [neighbour_entry(fake_kernel.pid, kernel=alice)])
    resolution = load_resolution(str(tmp_path))
    (row,) = in_container([GpuProcess(fake_kernel.pid, 0, GiB)], GiB, tmp_path, resolution)
    result = shutdown_kernel(fake_kernel.pid, [row], confirm=True, grace_s=0.2)
    assert not result.done and result.how is None
    assert "another container (jupyter-alice)" in result.message
    assert "its owner (alice)" in result.message.lower()
    assert f"`jax-nbmem shutdown {fake_kernel.pid} --yes`" in result.message
    assert fake_kernel.poll() is None  # still running


def test_a_pool_that_a_kernel_of_this_container_fits_is_not_said_to_be_outside(
    tmp_path, claims, sleeper
):
    # Another kernel of this container (its beacon here, its PID alive here) preallocated;
    # NVML shows a row that size by a host PID: it may be that kernel, not someone outside.
    content = kernel_beacon(sleeper, None, hub_user="bob", notebook="/home/jovyan/mine.ipynb")
    content["started_at"] = psutil.Process(sleeper).create_time()
    content["identity"] = {**own_identity(), "pid_in_ns": sleeper}
    (tmp_path / f"jax_nbmem-beacon-{sleeper}.json").write_text(json.dumps(content))
    claims(4026532777, 1, hub_user="alice", notebook="/home/jovyan/hog.ipynb")
    used = POOL + 300 * MiB
    (row,) = in_container([GpuProcess(900001, 0, POOL + 300 * MiB)], used, tmp_path)
    assert row.kind == "unknown" and row.hub_user is None and not row.elsewhere
    assert f"fits the pool of kernel PID {sleeper} in this container" in row.reason


def test_attribute_itself_never_looks_up_a_host_pid_from_a_container(sleeper):
    # The host's attribution, asked from a container, names nothing (see from_container).
    (row,) = attribute([GpuProcess(sleeper, 0, GiB)], [gpu(GiB)], identity=our_identity(),
                       sessions=NO_SERVERS)  # fmt: skip
    assert row.kind == "unknown" and row.user is None and row.elsewhere
    assert row.reason.startswith(PID_NAMESPACE_REASON)


def test_on_the_host_a_proven_kernel_in_a_container_is_judged_by_what_it_sent(tmp_path, sleeper):
    # Root's status on the host: the host PID is real here, and the agent proved its kernel.
    bob = kernel_beacon(7, OUR_NS, hub_user="bob", notebook="/home/jovyan/work.ipynb",
                        mode="off", pool=0, fraction=0.0)  # fmt: skip
    entry = {**neighbour_entry(sleeper, kernel=bob, name="jupyter-bob"), "pid_in_container": 7}
    write_resolution(tmp_path, [entry])
    resolution = load_resolution(str(tmp_path))
    (row,) = attribute([GpuProcess(sleeper, 0, 300 * MiB)], [gpu(300 * MiB)],
                       sessions=NO_SERVERS, resolution=resolution, beacons={})  # fmt: skip
    assert (row.source, row.mode, row.preallocated, row.hub_user) == ("agent", "off", False, "bob")
    assert (row.pid, row.pid_in_container) == (sleeper, 7)
    assert row.container["name"] == "jupyter-bob" and not row.elsewhere
    assert row.cmdline and row.user  # the host can look into it, too


# --- Without a fresh agent, a kernel keeps knowing its own row (issue 39 item 5) ------------


@pytest.fixture
def forgetful(monkeypatch):
    """This process has not been proven by an agent before (its own row is remembered)."""
    from jax_nbmem.tenants import containers

    monkeypatch.setattr(containers, "_last_own", {})


def test_a_stale_agent_leaves_the_kernel_its_own_row_marked_inferred(tmp_path, forgetful):
    me = os.getpid()
    write_resolution(tmp_path, [own_entry(900002, me, start_ticks())])
    listed = [GpuProcess(900002, 0, 300 * MiB), GpuProcess(900007, 0, 200 * MiB)]
    ours, _ = in_container(listed, 500 * MiB, tmp_path, load_resolution(str(tmp_path)), me)
    assert ours.kind == "self" and ours.pid == 900002
    # The agent stops: its resolution goes stale, but this kernel's host PID cannot change.
    write_resolution(tmp_path, [own_entry(900002, me, start_ticks())], written_at=time.time() - 99)
    stale = load_resolution(str(tmp_path))
    ours, other = in_container(listed, 500 * MiB, tmp_path, stale, me)
    assert (ours.kind, ours.source, ours.pid, ours.pid_in_container) == (
        "self", "inferred", 900002, me
    )  # fmt: skip
    assert "as the agent last proved it" in ours.reason
    assert other.kind == "unknown"
    (warning,) = warnings_for([ours, other], [gpu(500 * MiB)], own_backend_started=True,
                              agent=stale)  # fmt: skip
    assert warning.kind == "agent-stale"
    assert "inferred (not proven, never acted on): PID 900002" in warning.message
    assert "unknown, judged by their size only: PID 900007" in warning.message


def test_without_the_agent_the_own_pools_size_names_the_own_row_as_inferred(
    tmp_path, claims, forgetful
):
    from jax_nbmem.node.beacons import beacon_from

    me = os.getpid()
    own = beacon_from(kernel_beacon(me, OUR_NS, hub_user="bob", notebook="/w.ipynb"), "session")
    listed = [GpuProcess(900002, 0, POOL + 300 * MiB), GpuProcess(900009, 0, 300 * MiB)]

    def rows():
        return from_container(
            listed, [gpu(POOL + 600 * MiB)], our_identity(), None, [str(tmp_path)], {me: own},
            me, os.environ, NO_SERVERS,
        )  # fmt: skip

    ours, unknown = rows()
    assert (ours.kind, ours.source, ours.pid, ours.pid_in_container) == (
        "self", "inferred", 900002, me
    )  # fmt: skip
    assert "this kernel's own pool" in ours.reason and unknown.kind == "unknown"
    # Another container's kernel that claims a pool that size too: nobody is named.
    claims(4026532777, 1, hub_user="alice", notebook="/home/jovyan/hog.ipynb")
    ours, _ = rows()
    assert ours.kind == "unknown" and "it may be this kernel" in ours.reason


# --- Issue 46: this kernel as NVML lists it, with the agent's proof or without ---------------


def test_a_neighbour_on_the_host_is_not_said_to_be_in_another_container(tmp_path):
    alice = kernel_beacon(1, [4, 0xEFFFFFFC], hub_user="alice", notebook="/home/a/hog.ipynb")
    on_host = {**neighbour_entry(900001, kernel=alice), "pid_in_container": None,
               "pid_ns": [4, 0xEFFFFFFC], "container": None}  # fmt: skip
    write_resolution(tmp_path, [on_host])
    used = POOL + 300 * MiB
    (theirs,) = in_container([GpuProcess(900001, 0, used)], used, tmp_path,
                             load_resolution(str(tmp_path)))  # fmt: skip
    assert "runs on the host" in theirs.reason
    (warning,) = warnings_for([theirs], [gpu(used)], own_backend_started=True)
    assert "It runs on the host, outside this container" in warning.message, warning.message
    assert "another container" not in warning.message


@pytest.fixture
def proven(monkeypatch):
    """This process's host PID as the node agent proves it over its socket (set, then undone)."""
    from jax_nbmem.gpu import own_process

    monkeypatch.setattr(own_process, "_proven", None)
    return own_process.set_proven_pid


def test_a_kernel_proven_over_the_socket_finds_its_own_row_before_any_resolution(
    tmp_path, proven, forgetful
):
    listed = [GpuProcess(900002, 0, 300 * MiB), GpuProcess(900007, 0, 200 * MiB)]
    ours, other = in_container(listed, 500 * MiB, tmp_path)
    assert ours.kind == other.kind == "unknown"
    proven(900002)
    ours, other = in_container(listed, 500 * MiB, tmp_path)
    assert (ours.kind, ours.source, ours.pid, ours.pid_in_container) == (
        "self", "inferred", 900002, os.getpid()
    )  # fmt: skip
    assert "answered it over its socket" in ours.reason and other.kind == "unknown"


def test_without_the_agent_an_off_kernels_own_row_is_inferred_and_the_oom_line_names_it(
    tmp_path, claims, forgetful
):
    from jax_nbmem.node.beacons import beacon_from
    from jax_nbmem.tenants.advice import oom_diagnosis

    me = os.getpid()
    held = 768 * MiB  # what its allocator holds in mode off: its arrays' pool, grown
    content = kernel_beacon(me, OUR_NS, hub_user="bob", notebook="/w.ipynb", mode="off",
                            pool=held, fraction=None)  # fmt: skip
    own = beacon_from(content, "session")
    listed = [GpuProcess(900002, 0, held + 300 * MiB), GpuProcess(900009, 0, 5 * GiB)]

    def rows():
        return from_container(
            listed, [gpu(held + 300 * MiB + 5 * GiB)], our_identity(), None, [str(tmp_path)],
            {me: own}, me, os.environ, NO_SERVERS,
        )  # fmt: skip

    ours, unknown = rows()
    assert (ours.kind, ours.source, ours.pid, ours.preallocated) == (
        "self", "inferred", 900002, False
    )  # fmt: skip
    assert unknown.kind == "unknown"
    said = oom_diagnosis([ours, unknown], [gpu(held + 300 * MiB + 5 * GiB)])
    assert "- This kernel PID 900002 (hub user bob (Unix user jovyan)): 1.04 GiB" in said, said
    # Every row inferred (its own alone here): nothing is proven, so the advice still stands.
    (advice,) = warnings_for([ours], [gpu(held + 300 * MiB)], own_backend_started=True)
    assert advice.kind == "pid-namespace" and "host PID 900002 is inferred" in advice.message
    assert "jax-nbmem exporter --share-dir" in advice.message
    # Another container's `off` kernel of the same size: neither is named.
    claims(4026532777, 1, hub_user="alice", notebook="/h.ipynb", mode="off", pool=held,
           fraction=None)  # fmt: skip
    ours, _ = rows()
    assert ours.kind == "unknown" and "it may be this kernel" in ours.reason
