"""A hub whose spawner starts each user's server in a PID namespace of its own (issue 31).

As DockerSpawner or KubeSpawner would, without their daemons: a ``LocalProcessSpawner`` subclass
that runs ``unshare --pid --fork --mount-proc --uts`` as root and drops privileges inside
(``setpriv``), so each user's server and kernels see only their own processes and a host name
of their own, while NVML (the simulated GPU) lists host PIDs. Through the proxy, bob's kernel
and his server's status warn of alice's kernel and name her hub user (the node agent, root's
``jax-nbmem exporter --share-dir``, proves who she is); root's ``jax-nbmem shutdown`` and the
culler (dry run) act on the right kernel by its host PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager

import psutil
import pytest

from jax_nbmem.simgpu import GIB, SimState
from tests.hub.conftest import Hub, request, running_hub
from tests.hub.test_hub import POOL, START_JAX, Kernel, _jax_nbmem
from tests.waiting import wait_for

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(600)]

HOST_NS = os.stat("/proc/self/ns/pid").st_ino

# Appended to the docs' jupyterhub_config.py (after the hub tests' own settings).
NAMESPACE_SPAWNER = '''

# ---- tests/hub/test_hub_namespaces.py: each server in a PID namespace of its own ----
import pwd

from jupyterhub.spawner import LocalProcessSpawner


class NamespaceSpawner(LocalProcessSpawner):
    """The server in PID, UTS and mount namespaces of its own, as a container runtime starts it.

    The hub (root) runs unshare; setpriv drops to the user inside, in the user's home.
    """

    def make_preexec_fn(self, name):
        return None  # unshare needs root: privileges are dropped inside, by setpriv

    async def start(self):
        user = pwd.getpwnam(self.user.name)
        base = list(self.cmd)
        drop = (
            f'hostname "$0" && cd "$1" && shift && exec setpriv --reuid={user.pw_uid} '
            f'--regid={user.pw_gid} --init-groups -- "$@"'
        )
        self.cmd = [
            "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--",
            "sh", "-c", drop, f"jupyter-{self.user.name}", user.pw_dir, *base,
        ]
        try:
            return await super().start()
        finally:
            self.cmd = base


c.JupyterHub.spawner_class = NamespaceSpawner
'''


@pytest.fixture(scope="module")
def ns_hub(simgpu_lib):
    """A hub of its own whose users' servers run in PID namespaces (see the module)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: unshare and setpriv")
    with running_hub(simgpu_lib, NAMESPACE_SPAWNER, prefix="jnm-nshub-") as started:
        yield started


def _server_pid(hub: Hub, user) -> int:
    """The host PID of ``user``'s single-user server (inside its namespace)."""
    for process in psutil.process_iter(["cmdline", "uids"]):
        cmdline = process.info["cmdline"] or []
        if "jupyterhub.singleuser" in cmdline and process.info["uids"].real == user.uid:
            return process.pid
    raise AssertionError(f"no server of {user.name}")


def _ns(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/pid").st_ino


def _on_gpu(hub: Hub, *held: tuple[Kernel, int]) -> None:
    """The simulated GPU lists the kernels by host PID, as the registrar's lines say them."""
    state = SimState(hub.state_path).gpu(0, total=80 * GIB)
    for kernel, size in held:
        state.process(0, kernel.pid, size, ends_with_process=True, pidns=HOST_NS)
    state.write()


def test_each_users_server_and_kernels_run_in_a_pid_namespace_of_their_own(ns_hub):
    alice, bob = ns_hub.alice, ns_hub.bob
    servers = {user.name: _server_pid(ns_hub, user) for user in (alice, bob)}
    namespaces = {name: _ns(pid) for name, pid in servers.items()}
    assert len(set(namespaces.values()) | {HOST_NS}) == 3
    hog = Kernel(ns_hub, alice, "hog.ipynb")
    mine = Kernel(ns_hub, bob, "mine.ipynb")
    try:
        said = json.loads(mine.run(
            "import json, os, socket; print(json.dumps([os.getpid(), socket.gethostname(),"
            " sorted(int(p) for p in os.listdir('/proc') if p.isdigit())]))"
        ).strip())  # fmt: skip
        pid_here, hostname, visible = said
        assert hostname == f"jupyter-{bob.name}"
        assert pid_here != mine.pid and _ns(mine.pid) == namespaces[bob.name]
        assert mine.pid not in visible and hog.pid not in visible  # no host PIDs in there
        # The hub sees the servers through their routes; bob's status answers through the proxy.
        status, report = ns_hub.server(bob, "GET", "jax-nbmem/api/status")
        assert status == 200, report
    finally:
        for kernel in (hog, mine):
            kernel.close()


@contextmanager
def _node_agent(hub: Hub):
    """Root's ``jax-nbmem exporter --share-dir S`` on the host: the node agent."""
    agent = subprocess.Popen(
        [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
         "--interval", "0.5", "--share-dir", str(hub.share_dir)],
        env=hub.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = agent.stdout.readline()
        assert line.startswith("jax-nbmem exporter: serving"), line + agent.stderr.read()
        yield agent
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(20)


def test_through_the_proxy_bob_is_warned_of_alice_and_root_acts_on_her_kernel(ns_hub):
    alice, bob = ns_hub.alice, ns_hub.bob
    with _node_agent(ns_hub):
        hog = Kernel(ns_hub, alice, "hog.ipynb")
        hog.run(START_JAX)
        mine = Kernel(ns_hub, bob, "mine.ipynb")
        mine.run("%load_ext jax_nbmem\n%jaxalloc off")
        _on_gpu(ns_hub, (hog, POOL), (mine, 300 << 20))

        def warned():
            report = mine.status()
            found = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
            rows = {p["pid"]: p for p in report["processes"]}
            proven = rows.get(hog.pid, {}).get("source") == "agent"
            return found and proven and (found[0], rows[hog.pid])

        warning, row = wait_for("bob warned of alice's kernel, proven", warned, 60, 1)
        assert warning["pid"] == hog.pid and alice.name in warning["message"]
        assert row["hub_user"] == alice.name and row["pid_in_container"] not in (None, hog.pid)

        # The same through the proxy: bob's server's status (what his board and panel show).
        def served():  # its snapshot is refreshed every few seconds
            status, report = ns_hub.server(bob, "GET", "jax-nbmem/api/status")
            assert status == 200, report
            rows = {p["pid"]: p for p in report["processes"]}
            return rows.get(hog.pid, {}).get("source") == "agent" and (report, rows[hog.pid])

        report, row = wait_for("alice's kernel in bob's server's status", served, 30, 1)
        assert row["hub_user"] == alice.name and row["pid_in_container"] != hog.pid
        (warning,) = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
        assert warning["pid"] == hog.pid and alice.name in warning["message"]

        # Root's culler (dry run) names her idle blocking kernel by its host PID.
        cull = ["cull", "--once", "--idle", "1", "--warn", "3", "--hub-url", ns_hub.url]
        rc, out = _jax_nbmem(ns_hub, *cull, "--dry-run", token=ns_hub.culler_token)
        assert rc == 0 and f"would warn kernel PID {hog.pid}" in out, out
        assert str(mine.pid) not in out

        # Root's shutdown stops her kernel (through her server), not what has its PID inside.
        rc, out = _jax_nbmem(ns_hub, "shutdown", str(hog.pid), token=ns_hub.admin_token)
        assert rc == 0 and f"Stopped kernel PID {hog.pid}" in out, out
        wait_for("her kernel gone", lambda: not psutil.pid_exists(hog.pid), 30)
        assert psutil.pid_exists(mine.pid)
        assert request(f"{ns_hub.url}/hub/api/")[0] == 200
        for kernel in (hog, mine):
            kernel.close()
