"""A container's process is shown as its container's user (a claim) or its uid, never the host's."""

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
