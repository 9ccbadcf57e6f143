"""The host's view of a PID: NSpid, PID namespace, start ticks and container, from /proc."""

import os

import pytest

from jax_nbmem.agent.cgroups import ContainerNames, container_from_cgroup
from jax_nbmem.agent.hostview import (
    INIT_PID_NS_INO,
    HostViewer,
    beacon_key,
    parse_nspids,
    parse_start_ticks,
)
from tests.agent.namespaces import contained

DOCKER_ID = "3f" * 32
OTHER_ID = "ab" * 32
POD = "6c1e4f0a-9b2d-4c3e-8f7a-1d2e3f4a5b6c"


def fake_process(proc, pid, *, nspids=None, ticks=1000, comm="python", cgroup="0::/\n", uid=0):
    """A /proc/PID directory of a synthetic tree, as the kernel writes its files."""
    base = proc / str(pid)
    (base / "ns").mkdir(parents=True)
    fields = ["S", "1"] + ["0"] * 17 + [str(ticks)] + ["0"] * 30
    (base / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    nspid = "\t".join(str(p) for p in (nspids or (pid,)))
    (base / "status").write_text(f"Name:\t{comm[:15]}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                                 f"NSpid:\t{nspid}\n")  # fmt: skip
    (base / "cgroup").write_text(cgroup)
    (base / "ns" / "pid").write_text("")
    return base


def test_start_ticks_are_field_22_whatever_the_command_name():
    for comm in ("python", "a b", "x) (y", ") 1 2 3 (", "(("):
        fields = ["S", "1"] + ["0"] * 17 + ["123456"] + ["9"] * 30
        assert parse_start_ticks(f"42 ({comm}) {' '.join(fields)}") == 123456, comm
    assert parse_start_ticks("42 (truncated) S 1") is None
    assert parse_start_ticks("garbage") is None
    assert parse_start_ticks(open("/proc/self/stat").read()) > 0


def test_nspid_is_read_to_the_innermost_entry():
    assert parse_nspids("Name:\tx\nNSpid:\t4242\t17\t1\n", 4242) == (4242, 17, 1)
    assert parse_nspids("Name:\tx\n", 4242) == (4242,)  # kernels before 4.1: no line
    assert parse_nspids("NSpid:\tjunk\n", 7) == (7,)


def test_a_synthetic_tree_is_read_and_cached_by_pid_and_start(tmp_path):
    fake_process(tmp_path, 300, nspids=(300, 1), ticks=555, comm="weird ) name",
                 cgroup=f"0::/system.slice/docker-{DOCKER_ID}.scope\n", uid=1000)  # fmt: skip
    (tmp_path / "docker" / "containers" / DOCKER_ID).mkdir(parents=True)
    config = tmp_path / "docker" / "containers" / DOCKER_ID / "config.v2.json"
    config.write_text('{"Name": "/jupyter-alice", "Config": {"Hostname": "3f3f3f3f3f3f"}}')
    viewer = HostViewer(str(tmp_path), ContainerNames(docker_root=str(tmp_path / "docker")))
    view = viewer.view(300)
    ns = os.stat(tmp_path / "300" / "ns" / "pid")
    assert view.nspids == (300, 1) and view.pid_in_container == 1 and view.uid == 1000
    assert view.start_ticks == 555 and view.pid_ns == (ns.st_dev, ns.st_ino)
    assert view.container.id == DOCKER_ID and view.container.runtime == "docker"
    assert view.container.name == "jupyter-alice"  # the name, not the host name (its id)
    assert viewer.view(300) is view and viewer.hits == 1
    # The PID reused by another process (another start): read again.
    (tmp_path / "300" / "stat").write_text((tmp_path / "300" / "stat").read_text()
                                           .replace(" 555 ", " 777 "))  # fmt: skip
    assert viewer.view(300).start_ticks == 777 and viewer.misses == 2
    assert viewer.view(301) is None and viewer.view(-1) is None and viewer.view(True) is None


def test_the_cache_is_bounded(tmp_path):
    for pid in range(100, 140):
        fake_process(tmp_path, pid)
    viewer = HostViewer(str(tmp_path), cache_max=16)
    assert len(viewer.views(range(100, 140))) == 40
    assert len(viewer._cache) <= 16
    viewer.forget([100])
    assert all(key[0] == 100 for key in viewer._cache)


def test_an_unreadable_name_is_said(tmp_path):
    fake_process(tmp_path, 5, cgroup=f"0::/docker/{DOCKER_ID}\n")
    view = HostViewer(str(tmp_path), ContainerNames(docker_root=str(tmp_path / "none"))).view(5)
    assert view.container.id == DOCKER_ID and view.container.name is None
    assert (
        "cannot read" in view.container.name_reason
        and "config.v2.json" in view.container.name_reason
    )


@pytest.mark.parametrize(
    ("text", "runtime", "cid", "pod"),
    [
        (f"0::/system.slice/docker-{DOCKER_ID}.scope", "docker", DOCKER_ID, None),
        (f"12:memory:/docker/{DOCKER_ID}\n11:pids:/docker/{DOCKER_ID}", "docker", DOCKER_ID, None),
        (
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD.replace('-', '_')}.slice/cri-containerd-{DOCKER_ID}.scope",
            "containerd",
            DOCKER_ID,
            POD,
        ),
        (
            f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{DOCKER_ID}.scope",
            "crio",
            DOCKER_ID,
            POD,
        ),
        (f"0::/machine.slice/libpod-{DOCKER_ID}.scope/container", "podman", DOCKER_ID, None),
        (f"7:cpu,cpuacct:/kubepods/besteffort/pod{POD}/{DOCKER_ID}", "kubepods", DOCKER_ID, POD),
        (f"4:memory:/kubepods/pod{POD}/{DOCKER_ID}\n0::/", "kubepods", DOCKER_ID, POD),
        (
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
            f"{POD.replace('-', '_')}.slice",
            "kubepods",
            None,
            POD,
        ),
        (f"0::/libpod_parent/libpod-{DOCKER_ID}", "podman", DOCKER_ID, None),
        (
            f"0::/machine.slice/machine-libpod_pod_{OTHER_ID}.slice/libpod-{DOCKER_ID}.scope",
            "podman",
            DOCKER_ID,
            None,
        ),
        # Shapes never seen before, an id somewhere included: no container.
        (f"0::/my.slice/runtime-x/{OTHER_ID}/inner", None, None, None),
        ("0::/user.slice/user-1000.slice/session-3.scope", None, None, None),
        ("0::/", None, None, None),
        ("", None, None, None),
        ("garbage without colons\n::\n1:2", None, None, None),
        ("0::/" + "a/" * 5000, None, None, None),
        (f"0::/docker-{DOCKER_ID}f.scope", None, None, None),  # 65 hex digits: no id
    ],
)
def test_cgroup_shapes(text, runtime, cid, pod):
    container, raw = container_from_cgroup(text)
    if runtime is None:
        assert container is None
    else:
        assert (container.runtime, container.id, container.pod_uid) == (runtime, cid, pod)
        assert raw and raw in text  # the raw path is kept for the log


def test_kubernetes_names_come_from_the_kubelet_s_log_directories(tmp_path):
    (tmp_path / "pods" / f"jhub_jupyter-alice_{POD}").mkdir(parents=True)
    (tmp_path / "containers").mkdir()
    (tmp_path / "containers" / f"jupyter-alice_jhub_notebook-{DOCKER_ID}.log").write_text("")
    names = ContainerNames(pod_logs=str(tmp_path / "pods"),
                           container_logs=str(tmp_path / "containers"))  # fmt: skip
    container, _ = container_from_cgroup(
        f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/"
        f"cri-containerd-{DOCKER_ID}.scope"
    )
    named = names.name(container)
    assert (named.name, named.pod, named.namespace) == ("notebook", "jupyter-alice", "jhub")


def test_beacon_keys():
    assert beacon_key((4, INIT_PID_NS_INO), 123) == "123"
    assert beacon_key(None, 123) == "123"
    assert beacon_key((4, 4026532180), 1) == "4026532180-1"


def test_a_process_in_a_pid_namespace_of_its_own():
    with contained(["sleep", "60"]) as box:
        view = HostViewer().view(box.host_pid)
        ns = os.stat(f"/proc/{box.host_pid}/ns/pid")
        assert view.nspids == (box.host_pid, 1) and view.pid_in_container == 1
        assert view.pid_ns == (ns.st_dev, ns.st_ino)
        assert view.pid_ns != (os.stat("/proc/self/ns/pid").st_dev, INIT_PID_NS_INO)
        own = HostViewer().view(os.getpid())
        assert own.pid_in_container is None and not own.namespaced


def test_a_namespace_without_proc_mounted_is_seen_from_the_host_all_the_same():
    with contained(["sleep", "60"], mount_proc=False) as box:
        view = HostViewer().view(box.host_pid)
        assert view.nspids == (box.host_pid, 1) and view.pid_ns is not None


def test_another_user_s_namespace_needs_ptrace_and_says_so(tmp_path, monkeypatch):
    fake_process(tmp_path, 9)

    def refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr("jax_nbmem.agent.hostview.os.stat", refused)
    view = HostViewer(str(tmp_path)).view(9)
    assert view.pid_ns is None and "CAP_SYS_PTRACE" in view.pid_ns_reason
