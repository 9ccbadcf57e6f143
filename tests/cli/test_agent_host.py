"""On the host: the exporter is the node agent; status, metrics, culler and shutdown use its proofs.

Kernels run in PID namespaces of their own (as containers make them), all as root here; the
simulated GPU lists their host PIDs, as a real driver does.
"""

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from jax_nbmem.agent.hostproof import HostProof
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.agent.server import AgentServer, Registry
from jax_nbmem.cli.culler import Culler
from jax_nbmem.cli.stop import Kernel, StopError, find, plan
from jax_nbmem.node.notices import read_notice
from jax_nbmem.simgpu import GIB
from jax_nbmem.tenants.culling import CullPolicy
from jax_nbmem.tenants.status import collect
from tests.agent.namespaces import client_args, contained, need_namespaces
from tests.cli.test_exporter import running_exporter, scrape
from tests.waiting import wait_for

ON = {"beacon": {"mode_requested": "on", "mode_in_effect": "on", "pool_fraction": 0.75}}


@pytest.fixture
def share(tmp_path):
    folder = tmp_path / "share"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


def _forge_beacon(share, pid, **facts):
    """A beacon FILE for host PID ``pid``, as anyone in any container could write it."""
    started = psutil.Process(pid).create_time()
    content = {"schema": 1, "pid": pid, "started_at": started, "user": "jovyan",
               "kernel_id": "forged", "notebook": "forged.ipynb", "mode_requested": "on",
               "mode_in_effect": "on", "pool_fraction": 0.125, "gpus": {},
               "cell_running": False, "last_cell_finished_at": time.time() - 600,
               "hub_user": "mallory", "written_at": time.time(), **facts}  # fmt: skip
    (share / f"jax_nbmem-beacon-{pid}.json").write_text(json.dumps(content))


@pytest.mark.timeout(180)
def test_the_exporter_is_the_node_agent(sim_state, simgpu_env, share, tmp_path):
    need_namespaces()
    sim_state.gpu(0, total=80 * GIB).write()
    env = {**simgpu_env, "JAX_NBMEM_SHARE_DIR": str(share)}
    with running_exporter(env, "--interval", "0.5", "--share-dir", str(share)) as url:
        sock = share / "agent" / "agent.sock"
        wait_for("the agent's socket", sock.exists)
        assert (share / "agent").stat().st_mode & 0o777 == 0o755
        args = client_args(sock, kernel_id="bob1", folder=tmp_path)
        with contained(args, hostname="bob") as bob:
            assert json.loads(bob.line()) == {"ok": True, "pid": bob.host_pid}
            sim_state.process(0, bob.host_pid, 300 << 20).write()
            resolution = share / "agent" / "resolution.json"

            def bob_resolved():
                content = json.loads(resolution.read_text())
                entries = [p for p in content["processes"] if p["pid"] == bob.host_pid]
                return entries and entries[0]["kernel"] and (content, entries[0])

            content, entry = wait_for("bob's kernel in the resolution", bob_resolved)
            assert resolution.stat().st_mode & 0o777 == 0o644
            assert content["schema"] == 1 and content["interval_s"] == 0.5
            assert entry["pid_in_container"] == 1 and entry["gpus"][0].startswith("GPU-")
            assert entry["kernel"]["identity"]["hostname"] == "bob" and entry["source"] == "agent"

            # The metrics: bob's mode is what his kernel proved ("off"), not his environment's.
            def bob_series():
                found = scrape(url).get("jax_nbmem_kernel_preallocated", [])
                return [labels for labels, _ in found if labels["pid"] == str(bob.host_pid)]

            (labels,) = wait_for("bob's series", bob_series)
            assert labels["mode"] == "off" and labels["hub_user"] == "bob"
            idle = [v for lab, v in scrape(url)["jax_nbmem_kernel_idle_seconds"]
                    if lab["pid"] == str(bob.host_pid)]  # fmt: skip
            assert idle and 100 < idle[0] < 200
            # Root's status, another process: it reads the resolution.
            done = subprocess.run(
                [sys.executable, "-m", "jax_nbmem.cli", "status", "--json"],
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            (row,) = [p for p in json.loads(done.stdout)["processes"] if p["pid"] == bob.host_pid]
            assert (row["source"], row["mode"], row["pid_in_container"]) == ("agent", "off", 1)
            assert row["hub_user"] == "bob" and row["container"] is None  # no runtime's cgroup
            # Its container's host name, which the agent cannot read: its kernel's word (issue 49).
            assert row["container_hostname_claimed"] == "bob"
            text = subprocess.run(
                [sys.executable, "-m", "jax_nbmem.cli", "status"],
                env=env, capture_output=True, text=True, timeout=60,
            ).stdout  # fmt: skip
            assert "(mode: off)" in text and "[proven by the node agent]" in text, text
            assert "container with host name bob (its own claim) (pid 1 there)" in text, text
            bob.kill()
            wait_for("bob's kernel out of the resolution",
                     lambda: not bob_resolved())  # fmt: skip


def test_an_unsafe_agent_directory_stops_the_exporter_with_the_reason(simgpu_env, share):
    (share / "agent").mkdir(mode=0o777)
    (share / "agent").chmod(0o777)
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
         "--share-dir", str(share)],
        env=simgpu_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "is writable by others" in done.stderr and "Traceback" not in done.stderr
    assert sorted(os.listdir(share / "agent")) == []


@pytest.mark.timeout(120)
def test_the_culler_acts_on_the_proven_kernel_only(simgpu_in_process, share, tmp_path):
    need_namespaces()
    server = AgentServer(str(share), Registry(), first_line_s=60)
    server.start()
    try:
        # Its beacon's kernel id is the one its command line names: no claim contradicts a fact.
        claims = {**ON, "beacon": {**ON["beacon"], "kernel_id": "hog"}}
        hog_args = client_args(server.path, json.dumps([claims]), kernel_id="hog", folder=tmp_path)
        (tmp_path / "b").mkdir()
        quiet = client_args(server.path, "[]", kernel_id="other", folder=tmp_path / "b")
        with contained(hog_args, hostname="alice") as hog, contained(quiet) as other:
            assert json.loads(hog.line())["ok"]
            _forge_beacon(share, other.host_pid)  # says: idle, preallocated; proves nothing
            simgpu_in_process.gpu(0, total=80 * GIB).process(0, hog.host_pid, 60 * GIB)
            simgpu_in_process.process(0, other.host_pid, 10 * GIB).write()
            viewer = HostViewer()
            host = HostProof.from_registry(server.registry.proven(), viewer)
            report = collect(share_dir=str(share), host=host)
            rows = {p["pid"]: p for p in report["processes"]}
            assert rows[hog.host_pid]["source"] == "agent" and rows[hog.host_pid]["preallocated"]
            assert rows[other.host_pid]["hub_user"] != "mallory"  # the forged file: not believed
            assert rows[other.host_pid]["source"] != "beacon"
            culler = Culler(
                CullPolicy(idle_s=60, warn_s=0), str(share), None, out=open(os.devnull, "w")
            )
            (warned,) = culler.round(host=host)
            assert warned["action"] == "warn" and warned["pid"] == hog.host_pid, warned["message"]
            ino = os.stat(f"/proc/{hog.host_pid}/ns/pid").st_ino
            notice_file = share / f"jax_nbmem-cull-{ino}-1.json"
            assert (
                notice_file.exists() and json.loads(notice_file.read_text())["pid"] == hog.host_pid
            )
            # The kernel finds its own notice from inside: by its key, its PID there being 1.
            notice = read_notice([str(share)], 1, None, key=f"{ino}-1")
            assert notice is not None and notice.pid == hog.host_pid
            assert read_notice([str(share)], 1) is None  # no one else's PID 1 reads it
            (culled,) = culler.round(host=HostProof.from_registry(server.registry.proven(), viewer))
            assert culled["action"] == "cull", culled
            assert (
                not psutil.pid_exists(hog.host_pid)
                or psutil.Process(hog.host_pid).status() == "zombie"
            )
            assert psutil.pid_exists(other.host_pid) and not notice_file.exists()
    finally:
        server.stop()


def test_a_container_kernel_is_named_only_by_proof(share, tmp_path):
    need_namespaces()
    server = AgentServer(str(share), Registry(), first_line_s=60)
    server.start()
    try:
        args = client_args(server.path, "[]", kernel_id="claimed", folder=tmp_path)
        with contained(args) as box:
            _forge_beacon(share, box.host_pid)
            host = HostProof(HostViewer(), {})
            kernel = find(box.host_pid, str(share), host)
            # Its command line says kernel-claimed.json; a container's own claim: not used.
            assert kernel.proven is False and kernel.kernel_id is None and kernel.hub_user is None
            assert kernel.pid_in_container == 1 and kernel.server_pid is None
            with pytest.raises(StopError, match="has not proven"):
                plan(kernel, hub=object())
            # root: the very host PID it named
            assert plan(kernel, None) == ("signal", None, "signal")
    finally:
        server.stop()


def test_plan_refuses_the_hub_for_an_unproven_kernel():
    kernel = Kernel(pid=1234, started_at=None, user="root", hub_user="alice", kernel_id="abc",
                    notebook=None, proven=False)  # fmt: skip
    with pytest.raises(StopError, match="nothing done"):
        plan(kernel, hub=object())


@pytest.mark.timeout(120)
def test_no_agent_leaves_the_share_directory_alone(sim_state, simgpu_env, share):
    sim_state.gpu(0, total=80 * GIB).write()
    (share / "agent").mkdir(mode=0o777)  # unsafe: refused by an agent, ignored without one
    (share / "agent").chmod(0o777)
    with running_exporter(simgpu_env, "--interval", "0.5", "--share-dir", str(share),
                          "--no-agent") as url:  # fmt: skip
        wait_for("a first snapshot", lambda: scrape(url)["jax_nbmem_up"][0][1])
    assert os.listdir(share / "agent") == []
