"""Pods named from the Kubernetes API (a stand-in server here), from every real cgroup shape."""

import os
import shutil
import socket
import subprocess
import time

import pytest

from jax_nbmem.agent.cgroups import ContainerNames, container_from_cgroup
from jax_nbmem.agent.kubepods import KubeAPI, KubeError, PodDirectory, pod_from
from tests.agent.kubeapi import NODE, TOKEN, KubeStandIn, pod
from tests.waiting import wait_for

UID = "0f3b6c1e-5d2a-4c8e-9a71-2b4d6e8f0a13"
UID_SD = UID.replace("-", "_")
CID = "4e1f" * 16
OTHER_UID = "aa3b6c1e-5d2a-4c8e-9a71-2b4d6e8f0a99"


@pytest.fixture
def token(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


def pods():
    return [
        pod(UID, "jupyter-alice", "jhub", [("notebook", f"containerd://{CID}")],
            hub_user="alice@example.org"),
        pod("11111111-2222-3333-4444-555555555555", "jupyter-bob", "jhub",
            [("notebook", "containerd://" + "b" * 64)], hub_user="bob"),
        pod("66666666-2222-3333-4444-555555555555", "train-7", "ml",
            [("main", "cri-o://" + "c" * 64)]),
        pod("77777777-2222-3333-4444-555555555555", "elsewhere", "jhub", node="gpu-node-2"),
    ]  # fmt: skip


@pytest.fixture
def api():
    with KubeStandIn(pods()) as stand_in:
        yield stand_in


def directory_for(stand_in, token, **kwargs):
    return PodDirectory(KubeAPI(stand_in.url, token_file=token, timeout_s=2.0), NODE, **kwargs)


def test_the_node_s_pods_are_listed_page_by_page_with_the_service_account_s_token(api, token):
    directory = directory_for(api, token)
    directory.list_now()
    assert directory.health()["state"] == "ok" and directory.health()["pods"] == 3
    found = directory.lookup(UID)
    assert (found.name, found.namespace, found.hub_user) == ("jupyter-alice", "jhub",
                                                            "alice@example.org")  # fmt: skip
    assert found.containers == {CID: "notebook"}
    assert directory.lookup("77777777-2222-3333-4444-555555555555") is None  # another node's
    lists = [q for path, q in api.requests if "watch" not in q]
    assert [q.get("continue") for q in lists] == [None, "2"]
    assert all(q["fieldSelector"] == f"spec.nodeName={NODE}" for q in lists)


def test_the_watch_keeps_the_directory_current_and_a_gone_version_lists_again(api, token):
    directory = directory_for(api, token, relist_s=0.0)
    directory.start()
    try:
        wait_for("the first list", lambda: directory.health()["state"] == "ok", timeout=10)
        new_uid = "99999999-2222-3333-4444-555555555555"
        assert directory.lookup(new_uid) is None
        api.push("ADDED", pod(new_uid, "jupyter-carol", "jhub", version="101"))
        wait_for("the added pod", lambda: directory.lookup(new_uid) is not None, timeout=10)
        api.push("DELETED", pod(UID, "jupyter-alice", "jhub"))
        wait_for("the deleted pod", lambda: directory.lookup(UID) is None, timeout=10)
        lists = directory.lists
        api.send_event({"type": "ERROR", "object": {"kind": "Status", "code": 410}})
        wait_for("a new list after 410", lambda: directory.lists > lists, timeout=10)
        assert directory.lookup(new_uid) is not None and directory.lookup(UID) is None
        watches = [q for _, q in api.requests if q.get("watch") == "1"]
        assert watches[0]["resourceVersion"] == "100" and watches[0]["allowWatchBookmarks"]
    finally:
        directory.stop()


def test_an_api_that_refuses_is_a_said_reason_in_health_and_names_never_a_crash(api, token):
    api.mode = "refuse"
    directory = directory_for(api, token)
    directory.start()
    try:
        wait_for("the refusal", lambda: directory.health()["state"] == "refused", timeout=10)
        reason = directory.health()["reason"]
        assert "403 Forbidden" in reason and "cannot list resource" in reason
        assert "needs get, list and watch on pods" in reason
        names = ContainerNames(pod_logs="/nonexistent", container_logs="/nonexistent",
                               pods=directory)  # fmt: skip
        container, _ = container_from_cgroup(
            f"0::/kubepods.slice/kubepods-pod{UID_SD}.slice/cri-containerd-{CID}.scope"
        )
        named = names.name(container)
        assert named.pod is None and named.name is None
        assert named.name_reason.startswith("pod names unknown: the Kubernetes API refused")
        api.mode = "ok"  # the role was granted: it recovers by itself
        wait_for("the recovery", lambda: directory.health()["state"] == "ok", timeout=15)
    finally:
        directory.stop()


def test_a_wrong_token_garbage_and_silence_are_each_said(api, token, tmp_path):
    api.token = "rotated"
    with pytest.raises(KubeError) as refused:
        directory_for(api, token).list_now()
    assert refused.value.state == "refused" and "401" in refused.value.reason
    api.token, api.mode = TOKEN, "garbage"
    with pytest.raises(KubeError, match="not a JSON object"):
        directory_for(api, token).list_now()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts in the backlog, never answers
    try:
        slow = KubeAPI(f"http://127.0.0.1:{silent.getsockname()[1]}", token_file=token,
                       timeout_s=0.3)  # fmt: skip
        began = time.monotonic()
        with pytest.raises(KubeError) as quiet:
            PodDirectory(slow, NODE).list_now()
        assert quiet.value.state == "unreachable" and "did not answer" in quiet.value.reason
        assert time.monotonic() - began < 5
    finally:
        silent.close()
    closed = KubeAPI("http://127.0.0.1:9", token_file=token, timeout_s=0.3)
    with pytest.raises(KubeError, match="did not answer"):
        PodDirectory(closed, NODE).list_now()
    with pytest.raises(KubeError, match="token .* is unreadable"):
        PodDirectory(KubeAPI(api.url, token_file=str(tmp_path / "none")), NODE).list_now()


def test_outside_a_cluster_there_is_no_api_and_a_node_name_is_needed():
    with pytest.raises(KubeError) as off:
        KubeAPI.in_cluster({})
    assert off.value.state == "off" and "KUBERNETES_SERVICE_HOST" in off.value.reason
    with pytest.raises(ValueError, match="node's name"):
        PodDirectory(KubeAPI("http://127.0.0.1:1"), "")
    with pytest.raises(ValueError, match="no http"):
        KubeAPI("ftp://x")


def test_in_cluster_over_https_with_the_service_account_s_ca(tmp_path, token):
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make the stand-in's certificate")
    account = tmp_path / "serviceaccount"
    account.mkdir()
    shutil.copy(token, account / "token")
    key, cert = tmp_path / "key.pem", account / "ca.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
         "-out", str(cert)], check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    import ssl

    with KubeStandIn(pods()) as stand_in:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        stand_in.server.socket = context.wrap_socket(stand_in.server.socket, server_side=True)
        port = stand_in.server.server_port
        environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}
        api = KubeAPI.in_cluster(environ, service_account=str(account))
        assert api.base_url == f"https://127.0.0.1:{port}"
        directory = PodDirectory(api, NODE)
        directory.list_now()
        assert directory.lookup(UID).name == "jupyter-alice"
        other = tmp_path / "other"
        other.mkdir()
        shutil.copy(token, other / "token")
        os.symlink(os.devnull, other / "ca.crt")  # a CA that is not the server's
        with pytest.raises(KubeError) as untrusted:
            PodDirectory(KubeAPI.in_cluster(environ, service_account=str(other)), NODE).list_now()
        assert untrusted.value.state in ("unreachable", "error")


SHAPES = {
    "v2 systemd containerd burstable": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SD}.slice/"
        f"cri-containerd-{CID}.scope", "containerd"),
    "v2 systemd containerd besteffort": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_SD}.slice/"
        f"cri-containerd-{CID}.scope", "containerd"),
    "v2 systemd containerd guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{UID_SD}.slice/cri-containerd-{CID}.scope",
        "containerd"),
    "v2 systemd crio burstable": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SD}.slice/"
        f"crio-{CID}.scope", "crio"),
    "v2 systemd crio guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{UID_SD}.slice/crio-{CID}.scope", "crio"),
    "v2 cgroupfs containerd burstable": (f"0::/kubepods/burstable/pod{UID}/{CID}", "kubepods"),
    "v2 cgroupfs containerd besteffort": (f"0::/kubepods/besteffort/pod{UID}/{CID}", "kubepods"),
    "v2 cgroupfs containerd guaranteed": (f"0::/kubepods/pod{UID}/{CID}", "kubepods"),
    "v2 cgroupfs crio burstable": (f"0::/kubepods/burstable/pod{UID}/crio-{CID}", "crio"),
    "v2 cgroupfs crio guaranteed": (f"0::/kubepods/pod{UID}/crio-{CID}", "crio"),
    "v1 cgroupfs containerd burstable": (
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n"
        f"11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n0::/", "kubepods"),
    "v1 cgroupfs crio besteffort": (
        f"9:pids:/kubepods/besteffort/pod{UID}/crio-{CID}\n"
        f"4:memory:/kubepods/besteffort/pod{UID}/crio-{CID}", "crio"),
    "v1 systemd containerd guaranteed": (
        f"11:memory:/kubepods.slice/kubepods-pod{UID_SD}.slice/cri-containerd-{CID}.scope\n"
        f"1:name=systemd:/kubepods.slice/kubepods-pod{UID_SD}.slice/"
        f"cri-containerd-{CID}.scope", "containerd"),
    "v1 systemd crio besteffort": (
        f"7:cpu,cpuacct:/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{UID_SD}.slice/crio-{CID}.scope\n"
        f"3:memory:/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{UID_SD}.slice/crio-{CID}.scope", "crio"),
}  # fmt: skip


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_real_cgroup_shape_names_its_pod_namespace_container_and_hub_user(api, token, shape):
    text, runtime = SHAPES[shape]
    directory = directory_for(api, token)
    directory.list_now()
    container, path = container_from_cgroup(text)
    assert (container.id, container.runtime, container.pod_uid) == (CID, runtime, UID)
    names = ContainerNames(pod_logs="/nonexistent", container_logs="/nonexistent",
                           pods=directory)  # fmt: skip
    named = names.name(container)
    assert (named.pod, named.namespace, named.name, named.hub_user) == (
        "jupyter-alice", "jhub", "notebook", "alice@example.org")  # fmt: skip
    assert named.name_reason is None


def test_a_pod_not_listed_yet_is_named_once_the_directory_has_it(api, token, monkeypatch):
    directory = directory_for(api, token)
    directory.list_now()
    container, _ = container_from_cgroup(f"0::/kubepods/pod{OTHER_UID}/{CID}")
    names = ContainerNames(pod_logs="/nonexistent", container_logs="/nonexistent",
                           pods=directory)  # fmt: skip
    first = names.name(container)
    assert first.pod is None and f"pod {OTHER_UID} is not on this node's list" in first.name_reason
    api.pods.append(pod(OTHER_UID, "jupyter-dan", "jhub", [("notebook", f"containerd://{CID}")]))
    directory.list_now()
    monkeypatch.setattr("jax_nbmem.agent.cgroups._LISTING_EVERY_S", 0.0)
    assert names.name(container).pod == "jupyter-dan"


def test_pod_objects_of_any_shape_never_raise():
    for junk in (None, [], {"metadata": None}, {"metadata": {"uid": 3}}, {"metadata": {}}):
        assert pod_from(junk) is None
    statuses = [None, {"name": "x"}, {"containerID": 4}]
    odd = pod_from({"metadata": {"uid": UID, "name": "p", "namespace": "n", "annotations": 5},
                    "status": {"containerStatuses": statuses}})  # fmt: skip
    assert odd.containers == {} and odd.hub_user is None
