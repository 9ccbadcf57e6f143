"""Containers named only from their runtime's own hierarchy, never from a user's cgroups."""

import json
import os
import subprocess

import pytest

from jax_nbmem.agent.cgroups import ContainerNames, container_from_cgroup, container_text
from jax_nbmem.agent.hostproof import public_container
from jax_nbmem.agent.hostview import HostViewer
from tests.agent.test_hostview import fake_process
from tests.waiting import wait_for

BOB = "b0" * 32
MINE = "c1" * 32
POD = "6c1e4f0a-9b2d-4c3e-8f7a-1d2e3f4a5b6c"
POD_SD = POD.replace("-", "_")
DELEGATED = "/user.slice/user-1001.slice/user@1001.service"


@pytest.mark.parametrize(
    "path",
    [
        # A user's delegated subtree names no other user's container and no pod.
        f"{DELEGATED}/kubepods-burstable-pod{POD_SD}.slice/cri-containerd-{BOB}.scope",
        f"{DELEGATED}/kubepods/burstable/pod{POD}/{BOB}",
        f"{DELEGATED}/docker/{BOB}",
        f"{DELEGATED}/libpod_parent/libpod-{BOB}",
        # A service's own (delegated) cgroup, a session, another parent: no container.
        f"/system.slice/any.service/docker-{BOB}.scope",
        f"/user.slice/user-1001.slice/session-3.scope/docker-{BOB}.scope",
        f"/my.slice/kubepods.slice/kubepods-pod{POD_SD}.slice/cri-containerd-{BOB}.scope",
        f"/elsewhere/docker/{BOB}",
        f"/machine.slice/any.scope/libpod-{BOB}.scope",
        # The slice's uid and the service's disagree: not systemd's shape.
        f"/user.slice/user-1001.slice/user@1002.service/libpod-{BOB}.scope",
        # A pod slice of one QoS class under another's.
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod{POD_SD}.slice",
    ],
)
def test_a_runtime_s_shape_elsewhere_names_nothing(path):
    container, _ = container_from_cgroup(f"0::{path}\n")
    assert container is None or (container.rootless_uid == 1001 and container.pod_uid is None)
    if container is not None:  # the rootless shapes only: that user's own container
        assert container.id == BOB and container.runtime in ("docker", "podman")


def test_a_rootless_container_is_its_user_s_own():
    for scope, runtime in ((f"libpod-{MINE}.scope", "podman"), (f"docker-{MINE}.scope", "docker")):
        container, _ = container_from_cgroup(f"0::{DELEGATED}/user.slice/{scope}\n")
        assert (container.id, container.runtime, container.rootless_uid) == (MINE, runtime, 1001)
        assert container.pod_uid is None


def test_cgroups_below_a_container_s_own_are_that_container_s():
    pod_path = (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SD}.slice/"
                f"cri-containerd-{MINE}.scope")  # fmt: skip
    for path in (f"/system.slice/docker-{MINE}.scope/docker-{BOB}.scope",
                 f"/machine.slice/libpod-{MINE}.scope/container",
                 f"{pod_path}/kubepods-pod{POD_SD}.slice/crio-{BOB}.scope"):  # fmt: skip
        container, _ = container_from_cgroup(f"0::{path}\n")
        assert container.id == MINE, path


def test_paths_relative_to_the_agent_s_cgroup_namespace():
    below = f"kubepods-burstable-pod{POD_SD}.slice/cri-containerd-{MINE}.scope"
    for path in (f"/../../kubepods-burstable.slice/{below}", f"/../{below}",
                 f"/../../../kubepods.slice/kubepods-burstable.slice/{below}",
                 f"/../../burstable/pod{POD}/{MINE}"):  # fmt: skip
        container, raw = container_from_cgroup(f"0::{path}\n")
        assert (container.id, container.pod_uid) == (MINE, POD), path
        assert raw == path
    assert container_from_cgroup(f"0::/../../{DELEGATED}/docker-{BOB}.scope\n")[0].rootless_uid
    assert container_from_cgroup(f"0::/../../any.slice/docker-{BOB}.scope\n")[0] is None


def _store(root, container_id, name, driver="vfs"):
    folder = root / f"{driver}-containers"
    folder.mkdir(parents=True, exist_ok=True)
    entries = [{"id": container_id, "names": [name], "layer": "x", "metadata": "{}"}]
    (folder / "containers.json").write_text(json.dumps(entries))
    (folder / "containers.json").chmod(0o600)


def test_podman_s_store_names_its_containers(tmp_path):
    _store(tmp_path / "storage", MINE, "jupyter-alice")
    names = ContainerNames(podman_root=str(tmp_path / "storage"))
    container, _ = container_from_cgroup(f"0::/libpod_parent/libpod-{MINE}\n")
    named = names.name(container)
    assert (named.name, named.name_reason) == ("jupyter-alice", None)
    assert container_text(named.to_dict()) == "container jupyter-alice"
    other, _ = container_from_cgroup(f"0::/machine.slice/libpod-{BOB}.scope\n")
    unnamed = names.name(other)
    assert unnamed.name is None and f"{BOB[:12]} is not in" in unnamed.name_reason
    shown = container_text(unnamed.to_dict())
    assert shown.startswith(f"container {BOB[:12]} (unnamed: ") and "storage" in shown


def test_an_unreadable_podman_store_is_said(tmp_path):
    names = ContainerNames(podman_root=str(tmp_path / "missing"))
    container, _ = container_from_cgroup(f"0::/libpod_parent/libpod-{MINE}\n")
    assert "cannot list Podman's store" in names.name(container).name_reason
    (tmp_path / "storage" / "vfs-containers").mkdir(parents=True)
    os.symlink("/etc/passwd", tmp_path / "storage" / "vfs-containers" / "containers.json")
    reason = ContainerNames(podman_root=str(tmp_path / "storage")).name(container).name_reason
    assert "cannot read" in reason and "containers.json" in reason  # a link is never followed


def test_a_delegated_docker_scope_never_takes_root_s_name(tmp_path):
    """Mallory's cgroup named after bob's container: hers, named from her store or not at all."""
    (tmp_path / "docker" / "containers" / BOB).mkdir(parents=True)
    (tmp_path / "docker" / "containers" / BOB / "config.v2.json").write_text(
        '{"Name": "/jupyter-bob"}'
    )
    fake_process(tmp_path, 400, nspids=(400,), ticks=9, uid=1001,
                 cgroup=f"0::{DELEGATED}/app.slice/docker-{BOB}.scope\n")  # fmt: skip
    viewer = HostViewer(str(tmp_path), ContainerNames(docker_root=str(tmp_path / "docker")))
    seen = viewer.view(400).container
    assert seen.rootless_uid == 1001 and seen.name != "jupyter-bob" and seen.pod_uid is None
    assert "rootless, uid 1001's" in container_text(seen.to_dict())
    shown = public_container(viewer.view(400))  # what status --json says of it
    assert shown["rootless_uid"] == 1001 and shown["name"] is None
    assert str(tmp_path / "docker") not in shown["name_reason"]  # root's store: never asked


def test_a_rootless_store_s_names_are_its_user_s_claim(tmp_path, other_user):
    name, uid, gid = other_user
    home = tmp_path / "home"
    storage = home / ".local/share/containers/storage"
    _store(storage, MINE, "jupyter-bob", driver="overlay")
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(home)], check=True)
    subprocess.run(["usermod", "-d", str(home), name], check=True, capture_output=True)
    path = f"0::/user.slice/user-{uid}.slice/user@{uid}.service/user.slice/libpod-{MINE}.scope\n"
    container, _ = container_from_cgroup(path)
    named = ContainerNames(podman_root=str(tmp_path / "none")).name(container)
    assert (named.name, named.rootless_uid) == ("jupyter-bob", uid)
    assert container_text(named.to_dict()) == (
        f"container jupyter-bob (rootless, uid {uid}'s; its name is that user's claim)"
    )
    # Its store rewritten by another user (nobody): not that user's word, not read.
    subprocess.run(["chown", "65534:65534", str(storage / "overlay-containers/containers.json")],
                   check=True)  # fmt: skip
    again = ContainerNames(podman_root=str(tmp_path / "none")).name(container)
    assert again.name is None and "not by uid" in again.name_reason


def test_a_real_delegated_cgroup_names_no_one_else_s_container(tmp_path, other_user):
    """As root, systemd's delegation made by hand on cgroup v2: the user moves her own job."""
    name, uid, gid = other_user
    unified = "/sys/fs/cgroup/unified"
    root = unified if os.path.isfile(f"{unified}/cgroup.procs") else "/sys/fs/cgroup"
    assert os.path.isfile(f"{root}/cgroup.procs"), "needs a cgroup v2 hierarchy (CI has one)"
    service = f"{root}/user.slice/user-{uid}.slice/user@{uid}.service"
    os.makedirs(service)
    try:
        for entry in ("", "/cgroup.procs", "/cgroup.subtree_control"):
            os.chown(service + entry, uid, gid)  # what systemd's Delegate=yes hands over
        job = subprocess.Popen(["sleep", "120"], user=uid, group=gid)
        try:
            with open(f"{service}/cgroup.procs", "w") as procs:
                procs.write(str(job.pid))  # systemd starts her session's processes there
            scope = f"{service}/app.slice/docker-{BOB}.scope"  # bob's container id
            move = f"mkdir -p {scope} && echo {job.pid} > {scope}/cgroup.procs"
            subprocess.run(["sh", "-c", move], user=uid, group=gid, check=True, cwd="/")
            docker = tmp_path / "docker" / "containers" / BOB
            docker.mkdir(parents=True)
            (docker / "config.v2.json").write_text('{"Name": "/jupyter-bob"}')
            viewer = HostViewer(names=ContainerNames(docker_root=str(tmp_path / "docker")))
            seen = wait_for("the job's view", lambda: viewer.view(job.pid))
            assert f"docker-{BOB}.scope" in seen.cgroup
            assert seen.container.rootless_uid == uid and seen.container.name != "jupyter-bob"
        finally:
            job.kill()
            job.wait()
    finally:
        user_slice = os.path.dirname(service)
        for folder in (f"{service}/app.slice/docker-{BOB}.scope", f"{service}/app.slice",
                       service, user_slice, os.path.dirname(user_slice)):  # fmt: skip
            try:
                os.rmdir(folder)
            except OSError:
                pass


def test_a_real_podman_container_is_named_from_root_s_store():
    """Podman 4 with runc and vfs, as root (CI installs podman): the name `podman ps` shows."""
    if os.geteuid() != 0:
        pytest.skip("runs a podman container in root's store, with the host's / as its root")
    name = f"jnm-naming-{os.getpid()}"
    run = ["podman", "run", "-d", "--runtime", "runc", "--cgroup-manager=cgroupfs",
           "--storage-driver=vfs", "--network", "none", "--ulimit", "nofile=4096:4096",
           "--ulimit", "nproc=4096:4096", "--name", name,
           "--rootfs", "/:O", "sleep", "300"]  # fmt: skip
    started = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    container_id = started.stdout.strip().splitlines()[-1]
    try:
        pid = int(subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}}", name],
                                 capture_output=True, text=True, check=True).stdout)  # fmt: skip
        seen = HostViewer().view(pid)
        assert seen.container.id == container_id and seen.container.runtime == "podman"
        assert (seen.container.name, seen.container.name_reason) == (name, None)
        assert seen.container.rootless_uid is None and seen.namespaced
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=120)
