"""`jax-nbmem exporter --agent-listen`: the node agent on TCP alone, as a Kubernetes node has it."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from jax_nbmem.node.agent_client_tcp import TcpAgentClient, network_problem, network_resolution
from jax_nbmem.simgpu import GIB
from tests.agent.agent_client import beacon, claims
from tests.waiting import wait_for

pytest.importorskip("prometheus_client")
pytestmark = pytest.mark.kernel


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _own_entry():
    found = network_resolution()
    if found is None:
        return None
    content = json.loads(found[0])
    mine = [p for p in content["processes"] if p["pid"] == os.getpid() and p["kernel"]]
    return (content, mine[0]) if mine else None


@pytest.mark.timeout(120)
def test_without_a_share_directory_kernels_prove_themselves_and_read_the_resolution_over_tcp(
    sim_state, simgpu_env
):
    sim_state.gpu(0, total=80 * GIB).process(0, os.getpid(), 3 * GIB).write()
    port = _free_port()
    env = {k: v for k, v in simgpu_env.items() if k != "JAX_NBMEM_SHARE_DIR"}
    exporter = subprocess.Popen(
        [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
         "--interval", "0.5", "--agent-listen", f"127.0.0.1:{port}", "--kubernetes", "off"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    client = TcpAgentClient(("127.0.0.1", port), resolution_every_s=0.0)
    try:
        assert exporter.stdout.readline().startswith("jax-nbmem exporter: serving")
        client.send(beacon(claims()))
        assert client.proven_pid == os.getpid(), client.last_reason

        def proven_in_resolution():
            client.ask_resolution()
            return _own_entry()

        try:  # generous: the agent's first looks are slow on a loaded 2-core machine
            content, mine = wait_for("this kernel in the agent's resolution",
                                     proven_in_resolution, timeout=60)  # fmt: skip
        except AssertionError as failed:
            exporter.terminate()
            _, err = exporter.communicate(timeout=30)
            raise AssertionError(f"{failed}; the client: {network_problem()!r}, the exporter "
                                 f"said: {err[-2000:]!r}") from None  # fmt: skip
        assert len(mine["gpus"]) == 1 and mine["gpus"][0].startswith("GPU-")  # NVML lists it
        assert mine["kernel"]["identity"]["pid_in_ns"] == os.getpid()
        assert mine["source"] == "agent" and content["schema"] == 1
        assert content["written_at"] > time.time() - 30
    finally:
        client.close()
        exporter.terminate()
        _, err = exporter.communicate(timeout=30)
    assert "Traceback" not in err


def test_a_taken_agent_address_stops_the_exporter_with_a_reason(simgpu_env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
             "--agent-listen", f"127.0.0.1:{port}", "--kubernetes", "off"],
            env=simgpu_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port} (--agent-listen)" in done.stderr
    assert "Traceback" not in done.stderr
