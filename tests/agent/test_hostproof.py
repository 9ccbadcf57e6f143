"""The host's proof: the resolution is trusted only from the agent and while fresh."""

import json
import os
import time

import pytest

from jax_nbmem.agent.hostproof import HostProof, host_proof, read_resolution
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.agent.publish import build_resolution, write_resolution
from jax_nbmem.metrics.metrics import Snapshot, metric_families
from tests.agent.test_hostview import DOCKER_ID, fake_process


def _kernel(pid_in_ns: int) -> dict:
    return {"schema": 1, "pid": pid_in_ns, "started_at": time.time() - 5, "user": "jovyan",
            "mode_in_effect": "off", "mode_requested": "off", "pool_fraction": 0.0,
            "gpus": {}, "cell_running": False, "last_cell_finished_at": time.time() - 30,
            "hub_user": "bob", "notebook": "work.ipynb"}  # fmt: skip


@pytest.fixture
def share(tmp_path):
    if os.geteuid() != 0:
        # The reader trusts a resolution root wrote (or the agent's user), never its own.
        pytest.skip("writes the agent's resolution as the agent does: that takes root")
    folder = tmp_path / "share"
    (folder / "agent").mkdir(parents=True)
    (folder / "agent").chmod(0o755)
    return folder


def _resolution(share, *, written_at=None, pid=None, ticks=None):
    pid = os.getpid() if pid is None else pid
    ticks = HostViewer().start_ticks(pid) if ticks is None else ticks
    entry = {"pid": pid, "start_ticks": ticks, "kernel": _kernel(7), "source": "agent"}
    content = {"schema": 1, "agent": {}, "written_at": written_at or time.time(),
               "interval_s": 5, "processes": [entry]}  # fmt: skip
    write_resolution(str(share / "agent"), content)
    return content


def test_a_fresh_resolution_of_the_agent_proves_its_kernels(share):
    _resolution(share)
    proof = host_proof(str(share))
    assert proof.resolution_reason is None and proof.is_proven(os.getpid())
    beacon = proof.proven[os.getpid()].beacon
    assert beacon.pid == os.getpid() and beacon.hub_user == "bob" and beacon.mode == "off"


def test_an_entry_for_an_ended_process_proves_nothing(share):
    _resolution(share, ticks=1)  # another start: the PID names another process now
    assert host_proof(str(share)).proven == {}


@pytest.mark.parametrize("how", ["stale", "group-writable", "other-owner", "symlink", "junk",
                                 "schema", "missing"])  # fmt: skip
def test_what_is_not_trusted_is_said(share, tmp_path, how):
    agent = share / "agent"
    _resolution(share, written_at=time.time() - 16 if how == "stale" else None)
    if how == "group-writable":
        agent.chmod(0o775)
    elif how == "other-owner":
        os.chown(agent, 4242, 4242)
    elif how == "symlink":
        os.replace(agent / "resolution.json", tmp_path / "real.json")
        (agent / "resolution.json").symlink_to(tmp_path / "real.json")
    elif how == "junk":
        (agent / "resolution.json").write_text("[" * 100000)
    elif how == "schema":
        (agent / "resolution.json").write_text(json.dumps({"schema": 2}))
    elif how == "missing":
        (agent / "resolution.json").unlink()
    content, reason = read_resolution(str(share))
    assert content is None and reason
    expected = {"stale": "stale (16 s old)", "group-writable": "not the node agent's",
                "other-owner": "not the node agent's", "symlink": "is a symlink",
                "junk": "unreadable or malformed", "schema": "not a schema-1",
                "missing": "no resolution"}  # fmt: skip
    assert expected[how] in reason
    assert host_proof(str(share)).proven == {}


def test_the_agent_user_may_own_it(share, monkeypatch):
    _resolution(share)
    os.chown(share / "agent", 4242, 4242)
    os.chown(share / "agent" / "resolution.json", 4242, 4242)
    assert read_resolution(str(share))[0] is None
    monkeypatch.setenv("JAX_NBMEM_AGENT_USER", "4242")
    assert read_resolution(str(share))[0] is not None


def test_the_resolution_lists_nvml_s_pids_and_the_proven_kernels(tmp_path):
    fake_process(tmp_path, 500, nspids=(500, 3), ticks=42,
                 cgroup=f"0::/system.slice/docker-{DOCKER_ID}.scope\n")  # fmt: skip
    fake_process(tmp_path, 600)
    viewer = HostViewer(str(tmp_path))
    report = {"gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}],
              "processes": [{"pid": 500, "gpu": 0}, {"pid": 500, "gpu": 1},
                            {"pid": 600, "gpu": 1}, {"pid": 700, "gpu": 0}]}  # fmt: skip
    content = build_resolution(report, {}, viewer.view, interval_s=5, now=1000.0)
    by_pid = {p["pid"]: p for p in content["processes"]}
    assert by_pid[500]["gpus"] == ["GPU-a", "GPU-b"] and by_pid[500]["pid_in_container"] == 3
    assert by_pid[500]["container"]["id"] == DOCKER_ID and by_pid[500]["start_ticks"] == 42
    assert by_pid[600]["pid_in_container"] is None and by_pid[600]["container"] is None
    assert by_pid[700]["start_ticks"] is None  # gone: listed, nothing known
    assert content["written_at"] == 1000.0 and content["agent"]["pid"] == os.getpid()


def test_status_rows_gain_the_container_and_metrics_its_labels(tmp_path):
    fake_process(tmp_path, 500, nspids=(500, 3),
                 cgroup=f"0::/system.slice/docker-{DOCKER_ID}.scope\n")  # fmt: skip
    (tmp_path / "containers" / DOCKER_ID).mkdir(parents=True)
    (tmp_path / "containers" / DOCKER_ID / "config.v2.json").write_text('{"Name": "/jupyter-bob"}')
    viewer = HostViewer(str(tmp_path))
    viewer.names.docker_root = str(tmp_path)
    processes = [{"pid": 500, "gpu": 0, "source": "beacon"}, {"pid": 999, "gpu": 0}]
    HostProof(viewer, {}).annotate(processes)
    assert processes[0]["pid_in_container"] == 3 and processes[0]["source"] == "beacon"
    assert processes[0]["container"] == {"name": "jupyter-bob", "id": DOCKER_ID, "pod": None,
                                         "namespace": None, "name_reason": None,
                                         "rootless_uid": None}  # fmt: skip
    assert processes[1]["container"] is None and processes[1]["pid_in_container"] is None
    report = {"nvml": {"available": True}, "gpus": [{"index": 0, "uuid": "GPU-a"}],
              "processes": [{**processes[0], "used_bytes": 1}], "warnings": []}  # fmt: skip
    families = {f.name: f for f in metric_families(Snapshot(report, time.time()))}
    memory = families["jax_nbmem_kernel_gpu_memory_bytes"]
    (labels,) = [dict(zip(memory.labels, values, strict=True)) for values, _ in memory.samples]
    assert (labels["container"], labels["pod"], labels["namespace"]) == ("jupyter-bob", "", "")
    warnings = families["jax_nbmem_warnings"]
    assert any(values[0] == "agent-stale" and value == 0 for values, value in warnings.samples)
