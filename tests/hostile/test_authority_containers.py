"""Issue 37 item 8, with containers and a hub: mallory's proven kernel claims bob's identity.

Two containers as Docker makes them for DockerSpawner (a PID namespace, a ``/docker/<id>``
cgroup, Docker's record of the container with ``JUPYTERHUB_USER`` in its ``Config.Env``),
both running as the same Unix user, as every container does. The node agent proves each
kernel on its socket; mallory's then *claims* bob's hub user and bob's kernel id, which the
review found made the culler delete bob's kernel through the hub every round. Here the
culler (root, a hub token) asks the hub only for the server of the hub user Docker recorded,
uses the kernel id only if that server lists it, exempts no one on a claim, and says why it
does nothing; bob's server is never asked. Root's ``jax-nbmem shutdown`` does the same.
"""

from __future__ import annotations

import contextlib
import json
import os

import psutil
import pytest

from jax_nbmem.agent.hostproof import HostProof
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.agent.server import AgentServer, Registry
from jax_nbmem.cli.culler import Culler
from jax_nbmem.cli.hubapi import Hub
from jax_nbmem.cli.stop import StopError, find, stop
from jax_nbmem.simgpu import GIB
from jax_nbmem.tenants.culling import CullPolicy
from tests.agent.namespaces import client_args, contained
from tests.containers.runtime import docker_look
from tests.hostile.conftest import HUB_TOKEN, StandInHub

pytestmark = pytest.mark.timeout(180)

# Its first act inside: into its Docker cgroup (0: the writer itself), as `docker run` puts it;
# then it becomes the agent's client (the same program throughout, for tests' namespaces).
_JOIN = "import os, sys; open(sys.argv[1], 'w').write('0'); os.execv(sys.argv[2], sys.argv[2:])"
_IDLE_POOL = {"mode_requested": "on", "mode_in_effect": "on", "pool_fraction": 0.75}


@contextlib.contextmanager
def _docker_container(name: str, hub_user: str, agent: AgentServer, folder, kernel_id: str,
                      claims: dict):  # fmt: skip
    """A kernel in a DockerSpawner-like container of ``hub_user`` that proves itself to
    ``agent`` and claims ``claims`` (its beacon's fields) and ``kernel_id`` (command line)."""
    look = docker_look(name)
    assert look is not None and look.config is not None, "no cgroup hierarchy or a real Docker"
    # Docker's own record: the hub's token beside the hub user (never read nor logged).
    record = {
        "ID": look.id,
        "Name": f"/{name}",
        "Config": {
            "Env": [
                "JUPYTERHUB_API_TOKEN=never-read",
                f"JUPYTERHUB_USER={hub_user}",
                "PATH=/usr/bin",
            ]
        },
    }
    look.config.write_text(json.dumps(record))  # fmt: skip
    folder.mkdir()
    args = client_args(agent.path, json.dumps([{"beacon": claims}]), kernel_id=kernel_id,
                       folder=folder)  # fmt: skip
    try:
        with contained([args[0], "-c", _JOIN, str(look.procs), *args], hostname=name) as box:
            said = json.loads(box.line())
            assert said["ok"], said
            yield box
    finally:
        look.remove()


@pytest.fixture
def agent(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    share.chmod(0o1777)
    server = AgentServer(str(share), Registry(), first_line_s=60)
    server.start()
    yield server
    server.stop()


def _hub(servers) -> tuple[StandInHub, dict]:
    bob = servers.server(servers.bob, [{"id": "b0b-kernel"}])
    mallory = servers.server(servers.mallory, [{"id": "ma11-kernel"}])
    hub = StandInHub({servers.bob.name: bob, servers.mallory.name: mallory})
    return hub, {"bob": bob, "mallory": mallory}


def _culler(agent, hub: StandInHub, exempt: frozenset = frozenset()) -> Culler:
    api = Hub(url=hub.url, api_url=hub.url + "/hub/api", token=HUB_TOKEN)
    policy = CullPolicy(idle_s=60, warn_s=0, exempt=exempt)
    return Culler(policy, agent.share_dir, api, out=open(os.devnull, "w"))  # noqa: SIM115


def test_the_culler_and_root_ignore_a_claimed_hub_user_and_a_forged_exemption(
    servers, agent, simgpu_in_process, tmp_path
):
    hub, standins = _hub(servers)
    bob_name, mallory_name = servers.bob.name, servers.mallory.name
    lie = {**_IDLE_POOL, "hub_user": bob_name, "kernel_id": "b0b-kernel"}
    honest = {"mode_requested": "off", "mode_in_effect": "off", "pool_fraction": 0.0,
              "hub_user": bob_name, "kernel_id": "b0b-kernel"}  # fmt: skip
    try:
        with (
            _docker_container("jupyter-bob", bob_name, agent, tmp_path / "b", "b0b-kernel",
                              honest) as bob,
            _docker_container("jupyter-mal", mallory_name, agent, tmp_path / "m", "b0b-kernel",
                              lie) as mallory,
        ):  # fmt: skip
            simgpu_in_process.gpu(0, total=80 * GIB).process(0, mallory.host_pid, 60 * GIB)
            simgpu_in_process.process(0, bob.host_pid, 10 * GIB).write()
            host = HostProof.from_registry(agent.registry.proven(), HostViewer())
            assert host.is_proven(mallory.host_pid)  # she proved herself; her words are hers
            # Bob is exempt; mallory claims to be bob.
            culler = _culler(agent, hub, exempt=frozenset({bob_name}))
            (skipped,) = culler.round(host=host)
            assert skipped["action"] == "skip" and skipped["pid"] == mallory.host_pid, skipped
            said = skipped["message"]
            assert f"it claims hub user {bob_name}, but JUPYTERHUB_USER in Docker's record " in said
            assert f"of container jupyter-mal says {mallory_name}" in said
            assert "never-read" not in said
            assert culler.round(host=host) == []  # said once; nothing done, round after round

            kernel = find(mallory.host_pid, agent.share_dir, host)
            assert kernel.proven_owner.name == mallory_name and kernel.claimed.hub_user == bob_name
            api = Hub(url=hub.url, api_url=hub.url + "/hub/api", token=HUB_TOKEN)
            with pytest.raises(StopError, match=f"says {mallory_name}; nothing done \\(to stop"):
                stop(kernel, api)
            assert hub.deletes() == [] and hub.requests == []
            assert standins["bob"].deletes() == [] and psutil.pid_exists(mallory.host_pid)
    finally:
        hub.close()


def test_a_kernel_id_of_bobs_is_asked_of_mallorys_server_only(
    servers, agent, simgpu_in_process, tmp_path
):
    hub, standins = _hub(servers)
    mallory_name = servers.mallory.name
    # Her own hub user, bob's kernel id (in her beacon and on her command line alike).
    claims = {**_IDLE_POOL, "hub_user": mallory_name, "kernel_id": "b0b-kernel"}
    try:
        with _docker_container("jupyter-mal", mallory_name, agent, tmp_path / "m",
                               "b0b-kernel", claims) as mallory:  # fmt: skip
            simgpu_in_process.gpu(0, total=80 * GIB).process(0, mallory.host_pid, 60 * GIB)
            simgpu_in_process.write()
            culler = _culler(agent, hub)
            proof = HostProof.from_registry
            (warned,) = culler.round(host=proof(agent.registry.proven(), HostViewer()))
            assert warned["action"] == "warn", warned["message"]
            (tried,) = culler.round(host=proof(agent.registry.proven(), HostViewer()))
            assert tried["action"] == "error", tried
            assert "kernel b0b-kernel is not on the list of the server " in tried["message"]
            assert f"/user/{mallory_name}/" in tried["message"]
            assert hub.deletes() == []
            assert all(f"/user/{mallory_name}/" in path or path.startswith("/hub/api/users/")
                       for _, path in hub.requests), hub.requests  # fmt: skip
            assert standins["bob"].deletes() == [] and psutil.pid_exists(mallory.host_pid)
    finally:
        hub.close()
