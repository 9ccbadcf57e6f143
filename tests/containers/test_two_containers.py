"""Issue 31 end to end: two users' containers on one GPU, with the node agent and without it.

Alice's ``hog.ipynb`` runs in the default mode and holds 60 GiB of an 80 GiB (simulated) GPU;
Bob's ``work.ipynb`` ran ``%jaxalloc off`` and holds 300 MiB. Each runs in a container of its
own (tests/containers: real PID, UTS and mount namespaces, one ``jovyan``, one share
directory; the host sees Docker-like containers ``jupyter-alice`` and ``jupyter-bob``); their
kernels are PID 2 in each; the simulated GPU lists host PIDs (its registrar), as a real driver
does. The node agent is the real ``jax-nbmem exporter --share-dir S``, run as root on the host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager

import pytest

from tests.containers import ContainerKernel, Node
from tests.containers.scenario import hog_and_work, refreshes_seen, resolved
from tests.jupyterlab import REPO_ROOT
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(600)

_STATUS = "import jax_nbmem, json; print(json.dumps(jax_nbmem.status()))"


def status_of(kernel: ContainerKernel) -> dict:
    """What ``jax_nbmem.status()`` says in the kernel."""
    return json.loads(kernel.run(_STATUS).strip().splitlines()[-1])


def rows_of(report: dict) -> dict[int, dict]:
    return {row["pid"]: row for row in report["processes"]}


def warnings_of(report: dict, kind: str) -> list[dict]:
    return [warning for warning in report["warnings"] if warning["kind"] == kind]


def host_env(node: Node) -> dict[str, str]:
    """Root's environment on the host: the simulated GPU, the share directory, this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "XLA_", "JAX_"))}
    env.update({
        "PYTHONPATH": str(REPO_ROOT), "JAX_PLATFORMS": "cpu",
        "LD_LIBRARY_PATH": node.env["LD_LIBRARY_PATH"].split(":")[0],
        "JAX_NBMEM_SIMGPU_STATE": str(node.state), "JAX_NBMEM_SHARE_DIR": str(node.share_dir),
    })  # fmt: skip
    return env


@contextmanager
def node_agent(node: Node, interval: float = 0.5):
    """``jax-nbmem exporter --share-dir S`` as root on the host: the node agent. Yields it."""
    agent = subprocess.Popen(
        [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
         "--interval", str(interval), "--share-dir", str(node.share_dir)],
        env=host_env(node), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = agent.stdout.readline()
        assert line.startswith("jax-nbmem exporter: serving"), line + agent.stderr.read()
        wait_for("the agent's socket", (node.share_dir / "agent" / "agent.sock").exists)
        yield agent
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(20)


def root_status(node: Node) -> dict:
    """Root's ``jax-nbmem status --json`` on the host."""
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "status", "--json"],
        env=host_env(node), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def alice_and_bob(node: Node) -> tuple[ContainerKernel, ContainerKernel]:
    """Alice's hog (default mode: 60 GiB) and Bob's work (``off``: 300 MiB), each in its box."""
    home = node.user.home
    alice = node.container("alice-box", {"JUPYTERHUB_USER": "alice"}, docker_name="jupyter-alice")
    bob = node.container("bob-box", {"JUPYTERHUB_USER": "bob"}, docker_name="jupyter-bob")
    hog = alice.start_kernel(f"{home}/hog.ipynb")
    work = bob.start_kernel(f"{home}/work.ipynb")
    hog_and_work(node.listed, hog, work)
    assert hog.pid_in_container == work.pid_in_container == 2
    return hog, work


def test_with_the_node_agent_every_kernel_is_named_and_warned(container_node):
    node = container_node
    with node_agent(node) as agent:
        hog, work = alice_and_bob(node)
        wait_for(
            "both kernels proven in the resolution",
            lambda: resolved(node.share_dir, hog.pid, work.pid),
        )

        # Bob is warned, and told who: hub user, notebook, container, proven by the agent.
        def bob_warned():
            report = status_of(work)
            return warnings_of(report, "blocking-preallocation") and report

        report = wait_for("bob warned", bob_warned, every=1)
        (warning,) = warnings_of(report, "blocking-preallocation")
        assert warning["pid"] == hog.pid
        for said in ("alice", "hog.ipynb", "jupyter-alice"):
            assert said in warning["message"], warning["message"]
        alices = rows_of(report)[hog.pid]
        assert (alices["source"], alices["hub_user"], alices["pid_in_container"]) == (
            "agent", "alice", 2
        )  # fmt: skip
        assert alices["container"]["name"] == "jupyter-alice"
        assert not warnings_of(report, "pid-namespace")
        assert report["pid"] == work.pid and report["pid_in_container"] == 2

        # Alice recognises her own row (the same in-container PID as Bob's kernel).
        report = status_of(hog)
        assert report["pid"] == hog.pid
        assert rows_of(report)[hog.pid]["kind"] == "self"
        assert rows_of(report)[work.pid]["hub_user"] == "bob"

        # On the host, root's status reads the proven kernels: Bob's mode is off, idle times.
        # (What the agent proved is the beacon Bob's kernel last sent: after `%jaxalloc off`
        # within a beacon interval.) JAX runs on the CPU here: its GPU allocator is "not
        # started (off when it starts)".
        def bob_off():
            rows = rows_of(root_status(node))
            return "off" in (rows.get(work.pid, {}).get("mode") or "") and rows

        rows = wait_for("root's status says bob's mode is off", bob_off, timeout=30, every=1)
        bobs = rows[work.pid]
        assert (bobs["source"], bobs["hub_user"]) == ("agent", "bob")
        assert bobs["idle_s"] is not None and bobs["container"]["name"] == "jupyter-bob"
        alices = rows[hog.pid]
        assert "off" not in alices["mode"] and "on" in alices["mode"], alices
        assert alices["idle_s"] is not None and alices["container"]["name"] == "jupyter-alice"

        # A forged beacon FILE: Bob's container (the same jovyan) rewrites Alice's. Not proof.
        beacons = sorted(node.share_dir.glob("jax_nbmem-beacon-*-2.json"))  # both: PID 2
        assert len(beacons) == 2  # named by namespace: they never collide
        alices_file = next(b for b in beacons if json.loads(b.read_text())["hub_user"] == "alice")
        forged = {**json.loads(alices_file.read_text()), "hub_user": "mallory",
                  "notebook": "forged.ipynb"}  # fmt: skip
        done = work.container.python(
            f"import json, pathlib; pathlib.Path({str(alices_file)!r}).write_text("
            f"json.dumps({forged!r}))"
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(alices_file.read_text())["hub_user"] == "mallory"
        refreshes_seen(node.share_dir, 3)  # the agent has looked again since the forgery
        assert rows_of(root_status(node))[hog.pid]["hub_user"] == "alice"
        (warning,) = warnings_of(status_of(work), "blocking-preallocation")
        assert "mallory" not in warning["message"] and "alice" in warning["message"]

        # The agent dies: Bob falls back to what he can tell alone, and says the agent is stale.
        agent.kill()
        agent.wait(10)

        def stale_and_warned():
            report = status_of(work)
            kinds = {warning["kind"] for warning in report["warnings"]}
            return {"agent-stale", "blocking-preallocation"} <= kinds and report

        report = wait_for("bob's agent-stale warning", stale_and_warned, timeout=40, every=2)
        (warning,) = warnings_of(report, "blocking-preallocation")
        # Without the agent a neighbour is named from the beacon files (the simulated GPU's
        # kernels carry their pools there, as a GPU kernel's do), which every container's
        # jovyan can write: whatever the file claims (here the forged one) is only inferred,
        # said so, and never acted on.
        assert warning["pid"] == hog.pid and "inferred, not proven" in warning["message"]
        assert rows_of(report)[hog.pid]["source"] == "inferred"
        assert f"shutdown {hog.pid}" not in warning["message"].split("administrator")[0]


def test_a_beacon_claiming_the_other_containers_namespace_is_refused(container_node):
    """Bob's container tells the agent it is Alice's kernel: the host's view says otherwise."""
    node = container_node
    with node_agent(node):
        hog, work = alice_and_bob(node)
        wait_for("both kernels proven", lambda: resolved(node.share_dir, hog.pid, work.pid))
        alices = resolved(node.share_dir, hog.pid)
        (claim,) = [e["kernel"] for e in alices["processes"] if e["pid"] == hog.pid]
        forged = {**claim, "hub_user": "mallory"}
        code = (
            "import json, socket\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            f"s.connect({str(node.share_dir / 'agent' / 'agent.sock')!r})\n"
            f"s.sendall(json.dumps({forged!r}).encode() + b'\\n')\n"
            "print(s.makefile().readline())"
        )
        done = work.container.python(code)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["ok"] is False and answer["reason"], answer
        refreshes_seen(node.share_dir, 3)  # what it publishes after the refusal
        content = resolved(node.share_dir, hog.pid)
        (entry,) = [e for e in content["processes"] if e["pid"] == hog.pid]
        assert entry["kernel"]["hub_user"] == "alice"
        assert all((e.get("kernel") or {}).get("hub_user") != "mallory"
                   for e in content["processes"])  # fmt: skip


def test_without_the_agent_bob_is_still_warned_and_nobody_is_misnamed(container_node):
    node = container_node
    hog, work = alice_and_bob(node)
    report = status_of(work)
    (warning,) = warnings_of(report, "blocking-preallocation")
    assert warning["pid"] == hog.pid  # the host PID NVML lists, never an in-container one
    assert "bob" not in warning["message"]
    if "alice" in warning["message"]:
        assert rows_of(report)[hog.pid]["source"] == "inferred"
    (advice,) = warnings_of(report, "pid-namespace")
    assert "jax-nbmem exporter --share-dir" in advice["message"]
    assert "hostPID" not in advice["message"] and "--pid=host" not in advice["message"]
    assert rows_of(report)[work.pid]["kind"] != "self" or report["pid"] == work.pid


def test_a_killed_container_is_forgotten_by_the_gpu_the_agent_and_its_neighbour(container_node):
    node = container_node
    with node_agent(node):
        hog, work = alice_and_bob(node)
        wait_for("both kernels proven", lambda: resolved(node.share_dir, hog.pid, work.pid))
        wait_for("bob warned", lambda: warnings_of(status_of(work), "blocking-preallocation"))
        hog.container.kill()  # SIGKILL: its beacon and lock files stay behind
        wait_for("alice off the GPU", lambda: hog.pid not in node.listed())

        def forgotten():
            content = resolved(node.share_dir, work.pid)
            return content and hog.pid not in {e["pid"] for e in content["processes"]}

        wait_for("alice out of the resolution", forgotten)
        wait_for("bob no longer warned", lambda: not warnings_of(status_of(work),
                 "blocking-preallocation"), timeout=30, every=1)  # fmt: skip
