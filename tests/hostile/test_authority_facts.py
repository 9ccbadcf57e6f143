"""Issue 37 item 7: proven facts and claims are different types, and only facts act.

Whose a container is comes from a record only root writes (Docker's ``config.v2.json``, one
key of it); a record anyone could have written is not believed. A plan to stop a kernel is
made of proven values only: handing it a claim is a TypeError, not a stop.
"""

from __future__ import annotations

import json
import os

import pytest

from jax_nbmem.agent.cgroups import Container
from jax_nbmem.agent.facts import (
    Claimed,
    FactError,
    ProvenKernelId,
    ProvenOwner,
    ProvenProcess,
    disagreements,
    owner_of,
    prove_process,
)
from jax_nbmem.agent.hostproof import HostProof
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.cli.stop import Plan

CID = "c" * 64


def _in_docker(container_id: str = CID) -> ProvenProcess:
    return ProvenProcess(pid=4242, start_ticks=1, uid=1000, user="jovyan", parent_pid=1,
                         pid_ns=(4, 4026532000), pid_in_container=7,
                         container=Container(id=container_id, runtime="docker",
                                             name="jupyter-alice"))  # fmt: skip


def _record(root, env, mode=0o600) -> str:
    folder = root / "containers" / CID
    folder.mkdir(parents=True)
    path = folder / "config.v2.json"
    path.write_text(json.dumps({"ID": CID, "Name": "/jupyter-alice", "Config": {"Env": env}}))
    path.chmod(mode)
    return str(path)


# Docker's record is believed only when root owns it: writing one as Docker does takes root.
_roots_record = pytest.mark.skipif(os.geteuid() != 0, reason="writes Docker's record as root does")


@_roots_record
def test_a_docker_container_is_whose_dockers_record_says_and_only_that_key_is_read(tmp_path):
    _record(tmp_path, ["JUPYTERHUB_API_TOKEN=s3cret", "JUPYTERHUB_USER=alice"])
    owner = owner_of(_in_docker(), docker_root=str(tmp_path))
    assert (owner.name, owner.is_hub_user) == ("alice", True)
    assert owner.source == "JUPYTERHUB_USER in Docker's record of container jupyter-alice"
    assert "s3cret" not in repr(owner)


@_roots_record
def test_a_record_others_could_write_or_without_the_key_names_no_one(tmp_path):
    path = _record(tmp_path, ["JUPYTERHUB_USER=alice"], mode=0o666)
    os.chmod(path, 0o666)
    with pytest.raises(FactError, match="not root's own record"):
        owner_of(_in_docker(), docker_root=str(tmp_path))
    os.chmod(path, 0o600)
    os.chown(path, 1000, 1000)
    with pytest.raises(FactError, match="not root's own record"):
        owner_of(_in_docker(), docker_root=str(tmp_path))
    os.chown(path, 0, 0)
    with open(path, "w") as f:
        json.dump({"Config": {"Env": ["JUPYTERHUB_USER="]}}, f)
    with pytest.raises(FactError, match="sets no JUPYTERHUB_USER"):
        owner_of(_in_docker(), docker_root=str(tmp_path))
    link = tmp_path / "containers" / ("d" * 64)
    link.mkdir()
    (link / "config.v2.json").symlink_to(path)
    with pytest.raises(FactError, match="cannot read"):
        owner_of(_in_docker("d" * 64), docker_root=str(tmp_path))


def _in_podman(container_id: str = CID) -> ProvenProcess:
    return ProvenProcess(pid=4242, start_ticks=1, uid=1000, user="jovyan", parent_pid=1,
                         pid_ns=(4, 4026532000), pid_in_container=7,
                         container=Container(id=container_id, runtime="podman",
                                             name="jupyter-alice"))  # fmt: skip


@pytest.mark.parametrize("driver", ["vfs", "overlay", "btrfs"])
def test_a_rootful_podman_container_is_whose_its_record_says_on_any_storage_driver(
    tmp_path, driver
):
    # Issue 51 item 1: the record lives under the store of the driver Podman runs with
    # (docs/containers.md runs --storage-driver=vfs), not under overlay-containers alone.
    (tmp_path / "overlay-containers").mkdir()  # another driver's store, without this container
    folder = tmp_path / f"{driver}-containers" / CID / "userdata"
    folder.mkdir(parents=True)
    record = folder / "config.json"
    record.write_text(json.dumps({"process": {"env": ["JUPYTERHUB_USER=alice", "T=s3cret"]}}))
    record.chmod(0o600)
    owner = owner_of(_in_podman(), podman_root=str(tmp_path))
    assert (owner.name, owner.is_hub_user) == ("alice", True)
    assert "s3cret" not in repr(owner)


def test_a_podman_container_in_no_store_names_each_store_looked_in(tmp_path):
    (tmp_path / "vfs-containers").mkdir()
    (tmp_path / "overlay-containers").mkdir()
    with pytest.raises(FactError, match="looked in: overlay-containers, vfs-containers"):
        owner_of(_in_podman(), podman_root=str(tmp_path))
    with pytest.raises(FactError, match="cannot list Podman's store"):
        owner_of(_in_podman(), podman_root=str(tmp_path / "missing"))
    with pytest.raises(FactError, match="is not a container id"):
        owner_of(_in_podman("../" + CID), podman_root=str(tmp_path))


def test_a_pod_without_its_annotation_and_an_unknown_runtime_name_no_one():
    pod = Container(id=CID, runtime="containerd", name="notebook", pod_uid="u-1",
                    pod="jupyter-x", namespace="jhub", name_reason="pod names unknown")  # fmt: skip
    process = ProvenProcess(4242, 1, 1000, "jovyan", 1, None, 7, pod)
    with pytest.raises(FactError, match="hub user is unknown: pod names unknown"):
        owner_of(process)
    annotated = Container(**{**pod.to_dict(), "hub_user": "alice", "name_reason": None})
    owner = owner_of(ProvenProcess(4242, 1, 1000, "jovyan", 1, None, 7, annotated))
    assert owner.name == "alice" and "jhub/jupyter-x" in owner.source
    crio = Container(id=CID, runtime="crio")
    with pytest.raises(FactError, match="no record its user cannot write"):
        owner_of(ProvenProcess(4242, 1, 1000, "jovyan", 1, None, 7, crio))


def test_this_process_is_proven_from_the_hosts_proc():
    me = prove_process(os.getpid())
    assert me.uid == os.getuid() and me.parent_pid == os.getppid() and me.still_running()
    assert owner_of(me).source == "the Unix user of its process"


def test_each_contradiction_is_named_and_a_hub_user_counts_only_where_it_selects():
    unix = ProvenOwner("mallory", "the Unix user of its process", is_hub_user=False)
    process = ProvenProcess(4242, 1, 1001, "mallory", 900, None, None, None)
    lying = Claimed(kernel_id="bob-k", command_line_kernel_id="mal-k", hub_user="bob",
                    server_pid=777)  # fmt: skip
    found = disagreements(process, unix, lying, ancestors=(900, 800), through_hub=True)
    assert found == [
        "it claims hub user bob, but it runs as Unix user mallory, whose server the hub is "
        "asked for",
        "its beacon claims kernel id bob-k, but its own command line names kernel-mal-k.json",
        "its JPY_PARENT_PID names PID 777, which is not one of its real ancestors (900, 800)",
    ]
    # Without a hub the claimed hub user selects nothing: a hub may map names otherwise.
    assert len(disagreements(process, unix, lying, ancestors=(900, 800))) == 2
    honest = Claimed(kernel_id="mal-k", command_line_kernel_id="mal-k", server_pid=800)
    assert disagreements(process, unix, honest, ancestors=(900, 800), through_hub=True) == []


def test_a_plan_takes_proven_values_only():
    process = prove_process(os.getpid())
    Plan("signal", None, "signal", process)
    with pytest.raises(TypeError, match="takes a ProvenProcess"):
        Plan("signal", None, "signal", Claimed(kernel_id="x"))
    with pytest.raises(TypeError, match="takes a ProvenKernelId"):
        Plan("server", "http://127.0.0.1:1/", "hub", process, "a-claimed-id")
    with pytest.raises(TypeError, match="only for a kernel id its own list has"):
        Plan("server", "http://127.0.0.1:1/", "hub", process)
    Plan("server", "http://127.0.0.1:1/", "hub", process, ProvenKernelId("k", "http://h/"))


def test_a_pods_annotation_beats_the_hub_user_a_kernel_claims(monkeypatch):
    pod = Container(id=CID, runtime="containerd", name="notebook", pod_uid="u-1",
                    pod="jupyter-alice", namespace="jhub", hub_user="alice")  # fmt: skip
    viewer = HostViewer()
    seen = viewer.view(os.getpid())
    monkeypatch.setattr(viewer, "view", lambda pid: seen.__class__(
        **{**seen.__dict__, "container": pod}))  # fmt: skip
    rows = [{"pid": os.getpid(), "hub_user": "bob", "source": "beacon"}]
    HostProof(viewer, {}).annotate(rows)
    assert rows[0]["hub_user"] == "alice" and rows[0]["hub_user_claimed"] == "bob"
