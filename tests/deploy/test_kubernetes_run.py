"""The base's agent pod run here: its two containers' rendered commands, on the simulated GPU.

Each container's command and arguments as `kubectl kustomize` renders them, its environment as
the kubelet would set it (the downward API's fields from tests/deploy/kubernetes.py, the API's
address one that does not answer), with only what a pod has and this machine has not put in
its place: free loopback ports for the pod's 9840 and for the hostPort 9842 (the NAT in front
of it is on paper), a temporary folder for the pod's emptyDirs. A kernel finds the agent as
users' pods are told to in z2jh-values.yaml and is proven; the culler, reading the agent's
resolution in the shared emptyDir, would warn it (the base's culler runs --dry-run).
"""

import json
import os
import select
import subprocess
import sys
import time

import pytest
import yaml

from jax_nbmem.simgpu import GIB
from tests.cli.test_exporter import running_exporter, scrape
from tests.deploy.kubernetes import (
    DOWNWARD,
    KUBERNETES,
    closed_port,
    containers,
    pod_environment,
    render,
)
from tests.waiting import wait_for

pytest.importorskip("prometheus_client")
pytestmark = pytest.mark.kernel


# A kernel in a user's pod, as far as the agent and the culler can tell: a process that runs
# ipykernel's launcher with a connection file, on the GPU, that finds the agent from its
# environment (node/agent_client_tcp.py) and proves itself with its beacon: preallocated,
# idle for two hours. Then it waits to be killed.
KERNEL = """
import sys, time
from jax_nbmem.node.agent_client_tcp import TcpAgentClient, agent_address
from tests.agent.agent_client import beacon, claims
client = TcpAgentClient(agent_address(), resolution_every_s=0.0)
content, now = beacon(claims()), time.time()
content.update(mode_requested="preallocate", mode_in_effect="preallocate", pool_fraction=0.75,
               started_at=now - 9000, last_cell_finished_at=now - 7200)
client.send(content)
print("proven", client.proven_pid, client.last_reason, flush=True)
time.sleep(120)
"""


def _set(args: list[str], option: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(option) + 1] = value
    return args


def _users_pod_environment(port: int) -> dict[str, str]:
    """What z2jh-values.yaml gives a user's pod, the hostPort's number mapped to ``port``."""
    values = yaml.safe_load((KUBERNETES / "z2jh-values.yaml").read_text())
    env = {}
    for name, value in values["singleuser"]["extraEnv"].items():
        if isinstance(value, dict):
            env[name] = DOWNWARD[value["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[name] = value
    assert env["JAX_NBMEM_AGENT_PORT"] == "9842"  # the hostPort (test_kubernetes_pod.py)
    return {**env, "JAX_NBMEM_AGENT_PORT": str(port)}


def _line(process: subprocess.Popen, timeout: float) -> str:
    """The next line ``process`` writes to its stdout within ``timeout`` seconds, else ""."""
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    return process.stdout.readline() if ready else ""


@pytest.mark.timeout(180)
def test_the_agent_proves_a_kernel_that_finds_it_as_users_pods_do_and_the_culler_acts_on_it(
    tmp_path, sim_state, simgpu_env
):
    if os.geteuid() != 0:
        # The pod runs both as root; a culler that is not root trusts no resolution written by
        # anyone but root (or the agent's configured user), as jax_nbmem.agent.hostproof says.
        pytest.skip("the agent's pod runs as root, and its culler trusts only root's resolution")
    pod = containers(render(tmp_path / "render", None))
    agent, culler = pod["agent"], pod["culler"]
    assert agent["command"] == ["jax-nbmem", "exporter"]
    assert culler["command"] == ["jax-nbmem", "cull"]
    share = tmp_path / "share"  # the pod's emptyDir, both containers' mount
    share.mkdir()
    port = closed_port()
    args = _set(agent["args"], "--listen", "127.0.0.1:0")
    args = _set(args, "--agent-listen", f"127.0.0.1:{port}")
    args = _set(args, "--share-dir", str(share))
    sim_state.gpu(0, total=80 * GIB).write()
    base_env = {k: v for k, v in simgpu_env.items() if k != "JAX_NBMEM_SHARE_DIR"}
    in_pod = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(closed_port())}
    launcher = tmp_path / "kernel" / "ipykernel_launcher.py"
    launcher.parent.mkdir()
    launcher.write_text(KERNEL)
    started = []
    try:
        with running_exporter({**base_env, **pod_environment(agent), **in_pod}, *args) as url:
            kernel = subprocess.Popen(
                [sys.executable, str(launcher), "-f", str(launcher.parent / "kernel-1.json")],
                env={**base_env, **_users_pod_environment(port)}, stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            started.append(kernel)
            assert _line(kernel, 30).split()[:2] == ["proven", str(kernel.pid)]
            sim_state.gpu(0, total=80 * GIB).process(0, kernel.pid, 60 * GIB).write()
            # --kubernetes on took it for a pod: it asks the API, and says it does not answer.
            found = wait_for(
                "the API's state in the metrics",
                lambda: (m := scrape(url)).get("jax_nbmem_kubernetes_api_up") and m,
            )
            ((labels, up),) = found["jax_nbmem_kubernetes_api_up"]
            assert up == 0 and labels["reason"] in ("starting", "unreachable", "error"), labels

            def resolved():  # the agent has looked at the node since the kernel took its GPU
                path = share / "agent" / "resolution.json"
                content = json.loads(path.read_text()) if path.is_file() else {}
                return [p for p in content.get("processes", ()) if p["pid"] == kernel.pid and
                        p["gpus"] and p["kernel"]]  # fmt: skip

            wait_for("the kernel on its GPU in the agent's resolution", resolved, timeout=30)
            cull_args = _set(culler["args"], "--share-dir", str(share))
            cull_args = _set(cull_args, "--log", str(tmp_path / "admin.log"))
            cull_env = {**base_env, **pod_environment(culler)}
            running = subprocess.Popen(
                [sys.executable, "-m", "jax_nbmem.cli", "cull", *cull_args],
                env=cull_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            started.append(running)
            said = _line(running, 60)  # its start line: the base gives it no hub to check
            assert said.startswith("jax-nbmem cull: started, dry run"), said
            assert "this dry run checks no hub and token" in said, said
            said = _line(running, 60)
            assert said.startswith(f"jax-nbmem cull: would warn kernel PID {kernel.pid} "), said
            assert "--dry-run: nothing done" in said
            time.sleep(1)
            assert running.poll() is None  # it goes on to its next round
    finally:
        for process in started:
            process.kill()
            process.wait(30)
    assert "Traceback" not in running.stderr.read()
    # As it was rendered before the culler's /metrics went loopback-only: refused, and said.
    old = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "cull", *cull_args, "--listen", "0.0.0.0:9841"],
        env=cull_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert old.returncode == 2 and "on loopback only" in old.stderr, old.stderr
