"""A container's process is shown as its container's user (a claim) or its uid, never the host's."""

import json
import os
import subprocess
import tempfile

import pytest

from jax_nbmem.agent.hostproof import HostProof
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.agent.passwd import container_uid, read_in_root
from jax_nbmem.metrics.metrics import Snapshot, metric_families
from jax_nbmem.tenants.status import _process_line
from tests.agent.test_hostview import DOCKER_ID, fake_process
from tests.waiting import wait_for


def test_a_uid_is_mapped_into_the_container_s_user_namespace():
    assert container_uid("         0          0 4294967295\n", 1000) == 1000  # no userns
    rootless = "0 1000 1\n1 100000 65536\n"
    assert container_uid(rootless, 1000) == 0 and container_uid(rootless, 100999) == 1000
    assert container_uid(rootless, 5) is None and container_uid("junk\n1 2", 1) is None


def test_the_container_s_links_and_fifos_never_reach_the_host(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    (tmp_path / "inside").write_text("jovyan:x:1000:100::/home/jovyan:/bin/bash\n")
    for target in ("/inside", "../../../../inside", "/proc/self/root/inside"):
        (etc / "passwd").unlink(missing_ok=True)
        os.symlink(target, etc / "passwd")
        found = read_in_root(str(tmp_path), "/etc/passwd")
        if target.startswith("/proc"):  # a /proc path resolves inside too: no such folder
            assert isinstance(found, str) and "cannot be opened" in found
        else:  # an absolute link or one climbing out: resolved inside, as the container sees
            assert found.startswith(b"jovyan:")
    (etc / "passwd").unlink()
    os.symlink("/etc/hostname", etc / "passwd")  # the host's file: not inside this root
    assert "cannot be opened" in read_in_root(str(tmp_path), "/etc/passwd")
    (etc / "passwd").unlink()
    os.mkfifo(etc / "passwd")  # a FIFO with no writer: never opened for reading, never blocks
    assert read_in_root(str(tmp_path), "/etc/passwd") == "its /etc/passwd is not a regular file"
    (etc / "passwd").unlink()
    (etc / "passwd").write_bytes(b"x" * (2 << 20))
    assert "over" in read_in_root(str(tmp_path), "/etc/passwd")


def test_without_the_container_s_passwd_the_bare_uid(tmp_path):
    fake_process(tmp_path, 300, nspids=(300, 1), uid=1000,
                 cgroup=f"0::/system.slice/docker-{DOCKER_ID}.scope\n")  # fmt: skip
    (tmp_path / "300" / "uid_map").write_text("0 0 4294967295\n")
    seen = HostViewer(str(tmp_path)).view(300)
    assert seen.uid_in_container == 1000 and seen.user_in_container is None
    assert seen.shown_user() == ("1000", "uid") and "root is unreadable" in seen.user_reason
    # What attribution says from the host: its account for uid 1000, an unrelated person.
    processes = [{"pid": 300, "gpu": 0, "user": "cloudsdk", "used_bytes": 1, "kind": "kernel"}]
    HostProof(HostViewer(str(tmp_path)), {}).annotate(processes)
    assert (processes[0]["user"], processes[0]["user_source"]) == ("1000", "uid")
    assert "cloudsdk" not in _process_line(processes[0])


def test_a_real_podman_container_s_user_is_its_own(tmp_path):
    """Uid 1000 is jovyan in the container (its passwd, bind-mounted), whoever it is here."""
    if os.geteuid() != 0:
        pytest.skip("runs a podman container in root's store, with the host's / as its root")
    with tempfile.NamedTemporaryFile("w", suffix=".passwd", delete=False) as passwd:
        passwd.write("root:x:0:0::/root:/bin/sh\njovyan:x:1000:100::/home/jovyan:/bin/sh\n")
    os.chmod(passwd.name, 0o644)
    name = f"jnm-user-{os.getpid()}"
    run = ["podman", "run", "-d", "--runtime", "runc", "--cgroup-manager=cgroupfs",
           "--storage-driver=vfs", "--network", "none", "--ulimit", "nofile=4096:4096",
           "--ulimit", "nproc=4096:4096", "--name", name, "--user", "1000:100",
           "-v", f"{passwd.name}:/etc/passwd:ro", "--rootfs", "/:O", "sleep", "300"]  # fmt: skip
    try:
        started = subprocess.run(run, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stderr
        pid = int(subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}}", name],
                                 capture_output=True, text=True, check=True).stdout)  # fmt: skip
        seen = wait_for("the container's process", lambda: HostViewer().view(pid))
        assert (seen.uid, seen.uid_in_container, seen.user_in_container) == (1000, 1000, "jovyan")
        processes = [{"pid": pid, "gpu": 0, "user": "cloudsdk", "used_bytes": 1,
                      "kind": "kernel", "hub_user": "alice"}]  # fmt: skip
        HostProof(HostViewer(), {}).annotate(processes)
        assert (processes[0]["user"], processes[0]["user_source"]) == ("jovyan", "container")
        assert "hub user alice (Unix user jovyan in its container)" in _process_line(processes[0])
        report = {"nvml": {"available": True}, "gpus": [{"index": 0, "uuid": "GPU-a"}],
                  "processes": processes, "warnings": []}  # fmt: skip
        memory = next(f for f in metric_families(Snapshot(report, 1.0), now=1.0)
                      if f.name == "jax_nbmem_kernel_gpu_memory_bytes")  # fmt: skip
        labels = dict(zip(memory.labels, memory.samples[0][0], strict=True))
        assert (labels["user"], labels["user_source"]) == ("jovyan", "container")
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=120)
        os.unlink(passwd.name)


def test_each_user_source_is_said_as_its_own(monkeypatch):
    """Issue 51 item 4: the host's uid only as a number, marked as the host's."""
    from jax_nbmem.tenants.owners import owner_text, unix_user_text, who_text

    assert unix_user_text("jovyan", "container") == "jovyan in its container"
    assert unix_user_text("1000", "uid") == "uid 1000 in its container"
    assert unix_user_text("1000", "host_uid") == "host uid 1000"
    assert unix_user_text("alice") == "alice" and unix_user_text(None, "container") is None
    assert owner_text("jovyan", "alice", "container") == (
        "hub user alice (Unix user jovyan in its container)"
    )
    # A container's user named like its hub user is still the container's.
    assert owner_text("alice", "alice", "container") == (
        "hub user alice (Unix user alice in its container)"
    )
    assert owner_text("alice", "alice") == "user alice"  # the host's account, as before
    assert owner_text("1000", None, "host_uid") == "host uid 1000"
    assert who_text("1000", None, "uid") == "uid 1000 in its container"
    assert who_text("jovyan", "alice", "container") == "alice"


def test_without_its_user_namespace_s_map_the_host_uid_marked_so(tmp_path):
    fake_process(tmp_path, 301, nspids=(301, 1), uid=1000,
                 cgroup=f"0::/system.slice/docker-{DOCKER_ID}.scope\n")  # fmt: skip
    seen = HostViewer(str(tmp_path)).view(301)  # no uid_map: the uid there is unknown
    assert seen.uid_in_container is None and seen.shown_user() == ("1000", "host_uid")
    processes = [{"pid": 301, "gpu": 0, "user": "cloudsdk", "used_bytes": 1, "kind": "kernel",
                  "hub_user": "alice"}]  # fmt: skip
    HostProof(HostViewer(str(tmp_path)), {}).annotate(processes)
    line = _process_line(processes[0])
    assert "hub user alice (Unix user host uid 1000)" in line and "cloudsdk" not in line, line


def _agents_entry(pid: int, container_id: str, **more) -> dict:
    return {"pid": pid, "start_ticks": 1000, "container": {"id": container_id,
            "name": "jupyter-alice", "name_reason": None}, **more}  # fmt: skip


def test_a_reader_who_cannot_name_a_container_takes_the_agent_s_names(tmp_path):
    """Issue 51 item 9: what root's store and another user's root tell, the agent's word."""
    fake_process(tmp_path, 302, nspids=(302, 7), uid=1000,
                 cgroup=f"0::/system.slice/docker-{DOCKER_ID}.scope\n")  # fmt: skip
    (tmp_path / "302" / "uid_map").write_text("0 0 4294967295\n")
    viewer = HostViewer(str(tmp_path))
    own = viewer.view(302)
    assert own.container.name is None and own.user_in_container is None  # this reader's own
    entry = _agents_entry(302, DOCKER_ID, user="jovyan", user_source="container")
    proof = HostProof(viewer, {}, resolved={302: entry})
    processes = [{"pid": 302, "gpu": 0, "user": "cloudsdk", "used_bytes": 1, "kind": "kernel",
                  "hub_user": "alice", "source": "environment"}]  # fmt: skip
    proof.annotate(processes)
    row = processes[0]
    assert row["container"]["name"] == "jupyter-alice" and row["container"]["name_reason"] is None
    assert (row["user"], row["user_source"]) == ("jovyan", "container")
    assert row["names_source"] == "agent"
    line = _process_line(row)
    assert "container jupyter-alice" in line and "unnamed" not in line
    assert "hub user alice (Unix user jovyan in its container)" in line
    assert "[named by the node agent]" in line
    # Another container's entry (another id) names nothing here: the reader's own words stay.
    other = HostProof(viewer, {}, resolved={302: _agents_entry(302, "4e" * 32)})
    rows = [{"pid": 302, "gpu": 0, "used_bytes": 1, "kind": "kernel"}]
    other.annotate(rows)
    assert rows[0]["container"]["name"] is None and "names_source" not in rows[0]
    assert (rows[0]["user"], rows[0]["user_source"]) == ("1000", "uid")


def test_the_agent_publishes_each_container_process_s_user():
    from jax_nbmem.agent.cgroups import Container
    from jax_nbmem.agent.hostview import HostView
    from jax_nbmem.agent.publish import build_resolution
    from jax_nbmem.node.resolution import _parse

    container = Container(DOCKER_ID, "docker", name="jupyter-alice")
    views = {
        500: HostView(500, 1, (500, 7), 1000, (1, 2), None, container, "x",
                      uid_in_container=1000, user_in_container="jovyan"),
        501: HostView(501, 1, (501,), 0, (1, 3), None, None, ""),  # on the host: no user said
    }  # fmt: skip
    report = {"gpus": [{"index": 0, "uuid": "GPU-a"}],
              "processes": [{"pid": 500, "gpu": 0}, {"pid": 501, "gpu": 0}]}  # fmt: skip
    content = build_resolution(report, {}, views.get, interval_s=1.0, now=1.0)
    entries = {entry["pid"]: entry for entry in content["processes"]}
    assert (entries[500]["user"], entries[500]["user_source"]) == ("jovyan", "container")
    assert "user" not in entries[501]
    parsed = _parse(json.dumps(content).encode(), "resolution.json")
    assert (parsed.get(500).user, parsed.get(500).user_source) == ("jovyan", "container")
    assert parsed.get(501).user is None


def test_a_kernel_on_the_host_names_a_container_s_process_as_the_agent_read_it():
    """In a host kernel (no host proof of its own), the agent's resolution names the user of
    a process in a container; where the agent says nothing, the host's uid, marked so."""
    from jax_nbmem.gpu.nvml import GpuMemory, GpuProcess
    from jax_nbmem.node.resolution import Resolution, ResolvedProcess
    from jax_nbmem.tenants.attribution import attribute

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        gpu = GpuMemory(0, "GPU-a", "simulated", 80 << 30, 1 << 30, 79 << 30)
        container = {"id": DOCKER_ID, "runtime": "docker", "name": "jupyter-alice"}
        for said, expected in (({"user": "jovyan", "user_source": "container"},
                                ("jovyan", "container")),
                               ({}, (str(os.getuid()), "host_uid"))):  # fmt: skip
            entry = ResolvedProcess(sleeper.pid, 7, None, None, ("GPU-a",), container, None,
                                    **said)  # fmt: skip
            resolution = Resolution("fresh", processes={sleeper.pid: entry})
            (tenant,) = attribute([GpuProcess(sleeper.pid, 0, 1 << 30)], [gpu], own_pid=1,
                                  beacons={}, resolution=resolution, sessions={})  # fmt: skip
            assert (tenant.user, tenant.user_source) == expected, tenant
            assert tenant.to_dict()["user_source"] == expected[1]
    finally:
        sleeper.kill()
        sleeper.wait()
