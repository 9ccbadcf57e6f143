"""Pod names where a process is named: the resolution (by the reader's namespace), status, metrics.

Processes are a synthetic /proc (tests/agent/test_hostview.py's), in pods of the stand-in
Kubernetes API (tests/agent/kubeapi.py).
"""

import contextlib
import json
import time

import pytest

from jax_nbmem.agent.cgroups import ContainerNames
from jax_nbmem.agent.hostproof import HostProof
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.agent.kubepods import KubeAPI, PodDirectory
from jax_nbmem.agent.publish import HIDDEN_REASON, PodVisibility, ResolutionWriter
from jax_nbmem.cli.exporter import Exporter, ExporterSettings
from jax_nbmem.metrics.metrics import Snapshot, metric_families
from jax_nbmem.tenants.status import _process_line
from tests.agent.kubeapi import NODE, TOKEN, KubeStandIn, pod
from tests.agent.test_hostview import fake_process

ALICE_UID, ML_UID = "0f3b6c1e-5d2a-4c8e-9a71-2b4d6e8f0a13", "66666666-2222-3333-4444-555555555555"
ALICE_CID, ML_CID = "a1" * 32, "c3" * 32
REPORT = {
    "nvml": {"available": True},
    "gpus": [{"index": 0, "uuid": "GPU-a"}],
    "processes": [{"pid": 500, "gpu": 0, "used_bytes": 5}, {"pid": 600, "gpu": 0, "used_bytes": 7},
                  {"pid": 700, "gpu": 0, "used_bytes": 9}],
    "warnings": [],
}  # fmt: skip


@contextlib.contextmanager
def two_pods(tmp_path):
    """A pod directory that listed alice's pod (jhub) and a training job's (ml)."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    pods = [
        pod(ALICE_UID, "jupyter-alice", "jhub", [("notebook", f"containerd://{ALICE_CID}")],
            hub_user="alice"),
        pod(ML_UID, "train-7", "ml", [("main", f"containerd://{ML_CID}")]),
    ]  # fmt: skip
    with KubeStandIn(pods) as api:
        found = PodDirectory(KubeAPI(api.url, token_file=str(token)), NODE)
        found.list_now()
        yield found


@pytest.fixture
def directory(tmp_path):
    with two_pods(tmp_path) as found:
        yield found


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / "proc"
    slice_ = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    alice = f"{slice_}{ALICE_UID.replace('-', '_')}.slice/cri-containerd-{ALICE_CID}.scope\n"
    fake_process(root, 500, nspids=(500, 7), ticks=11, cgroup=alice)
    fake_process(root, 600, nspids=(600, 1), ticks=12,
                 cgroup=f"0::/kubepods/burstable/pod{ML_UID}/{ML_CID}\n")  # fmt: skip
    fake_process(root, 700, ticks=13)
    return root


def viewer_for(proc, directory) -> HostViewer:
    names = ContainerNames(pod_logs="/nonexistent", container_logs="/nonexistent",
                           pods=directory)  # fmt: skip
    return HostViewer(str(proc), names=names)


def containers(text: str) -> dict:
    return {p["pid"]: p["container"] for p in json.loads(text)["processes"]}


def test_a_reader_sees_the_pod_names_of_its_own_namespace_and_others_hidden(proc, directory):
    viewer = viewer_for(proc, directory)
    writer = ResolutionWriter(PodVisibility("own"))
    in_file = containers(writer.text(REPORT, {}, viewer.view, interval_s=5))
    jhub = containers(writer.for_namespace("jhub"))
    assert (jhub[500]["pod"], jhub[500]["namespace"], jhub[500]["name"],
            jhub[500]["hub_user"]) == ("jupyter-alice", "jhub", "notebook", "alice")  # fmt: skip
    assert jhub[600] == {"id": ML_CID, "runtime": "kubepods", "name": None, "pod_uid": None,
                         "pod": None, "namespace": None, "name_reason": HIDDEN_REASON,
                         "hub_user": None, "rootless_uid": None}  # fmt: skip
    assert jhub[700] is None  # no container: nothing to hide
    ml = containers(writer.for_namespace("ml"))
    assert ml[600]["pod"] == "train-7" and ml[500]["pod"] is None
    # The file is for readers of no namespace: every pod's names hidden.
    assert in_file[500]["pod"] is None and in_file[600]["pod"] is None
    assert in_file[500]["name_reason"] == HIDDEN_REASON and in_file[500]["id"] == ALICE_CID


@pytest.mark.parametrize(
    "setting, jhub_sees_ml, jhub_sees_own, file_sees_ml",
    [("all", True, True, True), ("own,ml", True, True, True), ("none", False, False, False),
     ("ml", True, True, True), ("own", False, True, False)],
)  # fmt: skip
def test_which_namespaces_are_visible_is_a_setting(
    proc, directory, setting, jhub_sees_ml, jhub_sees_own, file_sees_ml
):
    writer = ResolutionWriter(PodVisibility(setting))
    in_file = containers(writer.text(REPORT, {}, viewer_for(proc, directory).view, interval_s=5))
    jhub = containers(writer.for_namespace("jhub"))
    seen = (jhub[600]["pod"] is not None, jhub[500]["pod"] is not None)
    assert seen == (jhub_sees_ml, jhub_sees_own)
    assert (in_file[600]["pod"] is not None) == file_sees_ml


@pytest.mark.parametrize("bad", ["", ",", "all,own", "none,ml", "Bad_NS", "x" * 64])
def test_a_malformed_visibility_setting_is_refused(bad):
    with pytest.raises(ValueError, match="--pod-names-visible"):
        PodVisibility(bad)


def test_status_and_metrics_name_the_pod_namespace_and_container(proc, directory):
    processes = [dict(p, source="memory size") for p in REPORT["processes"]]
    HostProof(viewer_for(proc, directory), {}).annotate(processes)
    by_pid = {p["pid"]: p for p in processes}
    assert by_pid[500]["container"] == {"name": "notebook", "id": ALICE_CID,
                                        "pod": "jupyter-alice", "namespace": "jhub",
                                        "name_reason": None, "rootless_uid": None}  # fmt: skip
    assert by_pid[500]["pid_in_container"] == 7
    assert by_pid[500]["hub_user"] == "alice" and "hub_user" not in by_pid[600]
    line = _process_line({**by_pid[500], "kind": "process", "gpu": 0, "user": "jovyan"})
    assert "alice" in line and "container notebook in pod jhub/jupyter-alice (pid 7 there)" in line
    assert line.count("container") == 1  # said once, with its pod
    report = {**REPORT, "processes": processes, "kubernetes": directory.health()}
    families = {f.name: f for f in metric_families(Snapshot(report, time.time()))}
    memory = families["jax_nbmem_kernel_gpu_memory_bytes"]
    labels = {values[memory.labels.index("pid")]: dict(zip(memory.labels, values, strict=True))
              for values, _ in memory.samples}  # fmt: skip
    assert [labels["500"][k] for k in ("pod", "namespace", "container", "hub_user")] == [
        "jupyter-alice", "jhub", "notebook", "alice"]  # fmt: skip
    assert labels["500"]["hub_user_source"] == "pod"  # the pod's annotation, not a claim
    assert [labels["600"][k] for k in ("pod", "namespace", "container")] == ["train-7", "ml",
                                                                              "main"]  # fmt: skip
    assert [labels["700"][k] for k in ("pod", "namespace", "container")] == ["", "", ""]
    assert families["jax_nbmem_kubernetes_api_up"].samples == [(("ok",), 1.0)]
    refused = {**report, "kubernetes": {"state": "refused", "reason": "403"}}
    families = {f.name: f for f in metric_families(Snapshot(refused, time.time()))}
    assert families["jax_nbmem_kubernetes_api_up"].samples == [(("refused",), 0.0)]
    plain = {f.name for f in metric_families(Snapshot(REPORT, time.time()))}
    assert "jax_nbmem_kubernetes_api_up" not in plain  # off Kubernetes: absent


def test_a_view_read_before_its_pod_was_listed_is_named_once_it_is(proc, tmp_path, monkeypatch):
    token = tmp_path / "token2"
    token.write_text(TOKEN)
    with KubeStandIn([]) as api:
        directory = PodDirectory(KubeAPI(api.url, token_file=str(token)), NODE)
        directory.list_now()
        viewer = viewer_for(proc, directory)
        first = viewer.view(500)
        assert first.container.pod is None and "not on this node's list" in (
            first.container.name_reason)  # fmt: skip
        api.pods.append(pod(ALICE_UID, "jupyter-alice", "jhub",
                            [("notebook", f"containerd://{ALICE_CID}")]))  # fmt: skip
        directory.list_now()
        monkeypatch.setattr("jax_nbmem.agent.cgroups._LISTING_EVERY_S", 0.0)
        again = viewer.view(500)
        assert (again.container.pod, again.container.name) == ("jupyter-alice", "notebook")
        assert again.start_ticks == first.start_ticks and viewer.hits >= 1


def test_the_agent_answers_each_caller_with_its_own_namespace_s_view(proc, directory):
    exporter = Exporter(ExporterSettings("127.0.0.1:0", kubernetes="off"), pods=directory)
    exporter.viewer.proc = str(proc)  # the synthetic host
    exporter._resolution.text(REPORT, {}, exporter.viewer.view, interval_s=5)
    alice = containers(exporter._resolution_for(500)[1])
    assert alice[500]["pod"] == "jupyter-alice" and alice[600]["pod"] is None
    ml = containers(exporter._resolution_for(600)[1])
    assert ml[600]["pod"] == "train-7" and ml[500]["pod"] is None
    host = containers(exporter._resolution_for(700)[1])
    assert host[500]["pod"] is None and host[600]["pod"] is None


def test_bad_kubernetes_settings_are_refused_with_a_reason(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="--agent-listen wants"):
        ExporterSettings(agent_listen="nowhere", kubernetes="off")
    with pytest.raises(ValueError, match="--kubernetes on: not in a Kubernetes pod"):
        Exporter(ExporterSettings(kubernetes="on"))
    with pytest.raises(ValueError, match="--kubernetes wants"):
        ExporterSettings(kubernetes="maybe")
    with pytest.raises(ValueError, match="--pod-names-visible"):
        ExporterSettings(kubernetes="off", pod_names_visible="all,none")
    assert (
        Exporter(ExporterSettings(kubernetes="auto")).pods is None
    )  # outside a cluster: nothing asked
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.delenv("JAX_NBMEM_NODE_NAME", raising=False)
    with pytest.raises(ValueError, match="--kubernetes on: the node's name is needed"):
        Exporter(ExporterSettings(kubernetes="on"))
    unnamed = Exporter(
        ExporterSettings(kubernetes="auto")
    ).pods  # auto: it runs, and says why pods are unnamed
    assert unnamed.lookup(ALICE_UID) is None
    assert unnamed.health()["state"] == "error" and "JAX_NBMEM_NODE_NAME" in (
        unnamed.health()["reason"])  # fmt: skip
    monkeypatch.setenv("JAX_NBMEM_NODE_NAME", "gpu-node-9")
    assert Exporter(ExporterSettings(kubernetes="auto")).pods.node == "gpu-node-9"
