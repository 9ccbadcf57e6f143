"""Real kernels in pods, end to end over TCP: no share directory, the agent at the node's address.

The node agent is the real exporter process on the host (``jax-nbmem exporter --share-dir S
--agent-listen NODE:PORT``, as the DaemonSet runs it); each "pod" is a real IPython shell with
jax_nbmem loaded, PID 1 of a PID, UTS, mount and network namespace of its own, joined to the
host's by a veth on a bridge (as a CNI's ``cni0``) whose address is the node's. Pods get no
share directory, only ``$JAX_NBMEM_AGENT_ADDRESS`` (what the downward API gives them), and the
simulated GPU as their NVML, which lists the kernels by their *host* PIDs (written here from
the host). Everything is checked as a user sees it: ``jax_nbmem.status()``, ``%jaxmem
status`` in the pods, ``jax-nbmem status --json`` as root on the host. Root only, as CI runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from tests.ipython_session import clean_environ
from tests.node.test_in_namespaces import _DRIVER, _ON_THE_GPU, Container
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "ip", "nsenter")),
        reason="needs root, unshare, nsenter and iproute2 for pods' namespaces (as CI runs)",
    ),
]
pytest.importorskip("prometheus_client")

GiB, MiB = 1 << 30, 1 << 20
TOTAL = 80 * GiB
POOL = int(0.75 * TOTAL)


def _ip(*args: str, pid: int | None = None) -> None:
    enter = ["nsenter", "-t", str(pid), "-n"] if pid is not None else []
    subprocess.run([*enter, "ip", *args], check=True, capture_output=True, timeout=20)


class Bridge:
    """A bridge on the host with the node's address ``.1`` of a /24 of this run's own; each
    pod is given ``.2``, ``.3``... on a veth pair whose host end is enslaved to it."""

    def __init__(self) -> None:
        self.tag = f"{os.getpid() % 10000}{random.randrange(100)}"
        self.name = f"jnb{self.tag}"[:15]
        self.network = f"10.{random.randrange(213, 255)}.{random.randrange(256)}"
        self.node = f"{self.network}.1"
        self.ends: list[str] = []
        _ip("link", "add", self.name, "type", "bridge")
        self.ends.append(self.name)
        _ip("addr", "add", f"{self.node}/24", "dev", self.name)
        _ip("link", "set", self.name, "up")

    def attach(self, pid: int) -> str:
        """Give the network namespace of host PID ``pid`` an end on the bridge; its address."""
        number = len(self.ends) + 1
        host_end, pod_end = f"jn{self.tag}h{number}"[:15], f"jn{self.tag}p{number}"[:15]
        _ip("link", "add", host_end, "type", "veth", "peer", "name", pod_end)
        self.ends.append(host_end)
        _ip("link", "set", host_end, "master", self.name)
        _ip("link", "set", host_end, "up")
        _ip("link", "set", pod_end, "netns", str(pid))
        address = f"{self.network}.{number}"
        _ip("addr", "add", f"{address}/24", "dev", pod_end, pid=pid)
        _ip("link", "set", pod_end, "up", pid=pid)
        _ip("link", "set", "lo", "up", pid=pid)
        return address

    def remove(self) -> None:
        for end in reversed(self.ends):  # a pod's end went with its namespace
            subprocess.run(["ip", "link", "del", end], capture_output=True, timeout=20)


class Pod(Container):
    """A real IPython shell as PID 1 of a pod's namespaces (network included), on the bridge.

    Cells are sent with :meth:`send` and answered in order with :meth:`answer`, so several
    pods start their kernels at once; :meth:`run` does both.
    """

    def __init__(self, name: str, tmp, env: dict[str, str], *, as_kernel: bool = False) -> None:
        runtime = tmp / f"{name}-runtime"
        runtime.mkdir()
        full = {k: v for k, v in env.items() if k != "JAX_NBMEM_SHARE_DIR"}
        full.update(JUPYTER_RUNTIME_DIR=str(runtime), JNM_DRIVER=_DRIVER)
        command = f'hostname {name} && exec {sys.executable} -c "$JNM_DRIVER"'
        if as_kernel:  # its command line as ipykernel's: what the node's tools take for a kernel
            launcher = tmp / f"{name}-kernel" / "ipykernel_launcher.py"
            launcher.parent.mkdir()
            launcher.write_text(_DRIVER)
            connection = runtime / f"kernel-{name}.json"
            command = f"hostname {name} && exec {sys.executable} {launcher} -f {connection}"
        self.name = name
        self.process = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "--mount", "--net",
             "sh", "-c", command],
            env=full, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.host_pid = wait_for(f"{name}'s shell", self._shell, 20)
        info = os.stat(f"/proc/{self.host_pid}/ns/pid")
        self.ns = [info.st_dev, info.st_ino]

    def send(self, cell: str) -> None:
        self.process.stdin.write(json.dumps(cell) + "\n")
        self.process.stdin.flush()

    def answer(self, timeout: float = 60) -> str:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"{self.name}: no answer within {timeout}s"
        answer = json.loads(self.process.stdout.readline())
        assert answer["error"] is None, answer
        return answer["out"]

    def run(self, cell: str, timeout: float = 60) -> str:
        self.send(cell)
        return self.answer(timeout)

    def status(self) -> dict:
        out = self.run("import jax_nbmem, json; print(json.dumps(jax_nbmem.status()))")
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        """SIGKILL to the pod's PID 1: its kernel dies without a word, the namespace with it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.host_pid, signal.SIGKILL)
        self.process.wait(20)


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@pytest.fixture
def node(tmp_path, simgpu_env, sim_state):
    """The host: the simulated GPU, the bridge, the exporter as the agent on the node's address.

    Yields a namespace with ``pod(name, address=None, **env)`` (a started pod, its kernel's
    extension not loaded yet), ``share``, ``state``, ``uuid``, ``agent`` (the exporter's
    Popen), ``address`` (the agent's) and ``env`` (the host's environment for the CLI).
    """
    sim_state.gpu(0, TOTAL).write()
    share = tmp_path / "share"
    share.mkdir(mode=0o755)
    try:
        bridge = Bridge()
    except subprocess.CalledProcessError as error:
        pytest.skip(f"no bridge for the pods here: {error.stderr.strip()}")
    pods: list[Pod] = []
    port = _free_port(bridge.node)
    host_env = {k: v for k, v in simgpu_env.items() if k != "JAX_NBMEM_SHARE_DIR"}
    pod_env = {k: v for k, v in {**clean_environ(), **host_env}.items()
               if not k.startswith("JAX_NBMEM_AGENT_")}  # fmt: skip

    def pod(name: str, address: str | None = None, as_kernel: bool = False, **env) -> Pod:
        """A pod told ``address`` (default: the agent's; ``env`` may give the downward API's
        ``JAX_NBMEM_AGENT_HOST`` and ``_PORT`` instead), on the bridge before its kernel runs;
        ``as_kernel``: its command line is ipykernel's (the culler acts on kernels only)."""
        given = {} if "JAX_NBMEM_AGENT_HOST" in env else {
            "JAX_NBMEM_AGENT_ADDRESS": address or f"{bridge.node}:{port}"}  # fmt: skip
        box = Pod(name, tmp_path, {**pod_env, **given, **env}, as_kernel=as_kernel)
        pods.append(box)
        bridge.attach(box.host_pid)
        return box

    agent, err = None, ""
    try:
        agent = subprocess.Popen(
            [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
             "--interval", "1", "--share-dir", str(share), "--agent-listen",
             f"{bridge.node}:{port}", "--kubernetes", "off"],
            env=host_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert agent.stdout.readline().startswith("jax-nbmem exporter: serving")
        yield SimpleNamespace(
            pod=pod, share=share, state=sim_state, agent=agent, env=host_env, bridge=bridge,
            uuid=sim_state._gpus[0].uuid, address=f"{bridge.node}:{port}",
        )  # fmt: skip
    finally:
        for box in pods:
            with contextlib.suppress(Exception):
                box.kill()
        if agent is not None:
            agent.kill()  # stopped (SIGSTOP) or not
            _, err = agent.communicate(timeout=30)
        bridge.remove()
    assert "Traceback" not in err, err


def _resolution(share) -> dict:
    path = share / "agent" / "resolution.json"
    return json.loads(path.read_text()) if path.exists() else {"processes": []}


def _kernels_in_resolution(share) -> dict[int, dict]:
    return {p["pid"]: p for p in _resolution(share)["processes"] if p.get("kernel")}


def _rows(report: dict) -> dict[int, dict]:
    return {row["pid"]: row for row in report["processes"]}


@pytest.mark.timeout(150)
def test_two_pods_over_tcp_name_each_other_and_root_sees_both_proven(node):
    alice = node.pod("alice-pod", JUPYTERHUB_USER="alice",
                     JPY_SESSION_NAME="/home/jovyan/hog.ipynb")  # fmt: skip
    # Bob's pod has the node's address as the downward API gives it (status.hostIP).
    host, port = node.address.rsplit(":", 1)
    bob = node.pod("bob-pod", JUPYTERHUB_USER="bob", JPY_SESSION_NAME="/home/jovyan/work.ipynb",
                   JAX_NBMEM_AGENT_HOST=host, JAX_NBMEM_AGENT_PORT=port)  # fmt: skip
    # Nobody answers at this address of the node: a wrong port in the pod's spec.
    wrong = f"{node.bridge.node}:{_free_port(node.bridge.node)}"
    carol = node.pod("carol-pod", address=wrong, JUPYTERHUB_USER="carol")
    for box in (alice, bob, carol):
        box.send("%load_ext jax_nbmem")
    for box in (alice, bob, carol):
        box.answer()
    alice.run(_ON_THE_GPU.format(uuid=node.uuid, pool=POOL))  # her default mode's pool
    bob.run("%jaxalloc off")
    node.state.process(0, alice.host_pid, POOL + 300 * MiB).process(0, bob.host_pid, 300 * MiB)
    node.state.write()

    # The agent proved both kernels by their host PIDs: in its resolution with what they said.
    def both_proven():
        kernels = _kernels_in_resolution(node.share)
        theirs = kernels.get(alice.host_pid, {}).get("kernel") or {}
        return kernels if bob.host_pid in kernels and theirs.get("gpus") else None

    kernels = wait_for("alice's pool and bob in the agent's resolution", both_proven, 30)
    assert kernels[alice.host_pid]["pid_in_container"] == 1
    assert kernels[alice.host_pid]["pid_ns"] == alice.ns
    assert kernels[bob.host_pid]["kernel"]["identity"]["hostname"] == "bob-pod"

    # Bob, in his pod: alice's kernel named from what the agent proved, his own row found
    # (once the resolution he holds was written after both registered: within 2 s or so).
    def alice_named():
        report = bob.status()
        theirs = _rows(report).get(alice.host_pid)
        named = theirs and theirs["source"] == "agent" and theirs["hub_user"]
        return report if named and report["pid"] is not None else None

    report = wait_for("bob's status naming alice's kernel and finding his own", alice_named, 20)
    rows = _rows(report)
    theirs, ours = rows[alice.host_pid], rows[bob.host_pid]
    assert (theirs["kind"], theirs["hub_user"]) == ("kernel", "alice")
    assert theirs["notebook"] == "/home/jovyan/hog.ipynb" and theirs["preallocated"] is True
    assert theirs["pid_in_container"] == 1
    assert (ours["kind"], ours["pid_in_container"]) == ("self", 1)
    assert report["pid"] == bob.host_pid and report["pid_in_container"] == 1
    assert report["agent"]["state"] == "fresh", report["agent"]
    (warning,) = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
    assert warning["pid"] == alice.host_pid and "hub user alice" in warning["message"]
    assert not [w for w in report["warnings"] if w["kind"] in ("pid-namespace", "agent-stale")]
    shown = bob.run("%jaxmem status")  # as a person reads it
    assert f"PID {alice.host_pid}" in shown or f"pid {alice.host_pid}" in shown, shown
    assert "[proven by the node agent]" in shown and "WARNING [blocking-preallocation]" in shown
    assert "Traceback" not in shown

    # Root on the host: both kernels proven, by host PID, with their PIDs in their pods.
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "status", "--json", "--share-dir",
         str(node.share)],
        env=node.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    host_rows = _rows(json.loads(done.stdout))
    for box, user in ((alice, "alice"), (bob, "bob")):
        row = host_rows[box.host_pid]
        assert (row["source"], row["hub_user"], row["pid_in_container"]) == ("agent", user, 1)

    # Carol's pod names an address where nobody listens: said, in her status, never raised.
    report = carol.status()
    assert report["agent"]["state"] == "absent"
    assert report["agent"]["reason"].startswith(f"cannot reach the node agent at {wrong}: ")
    assert report["pid"] is None and report["pid_in_container"] == 1
    assert {w["kind"] for w in report["warnings"]} >= {"pid-namespace", "blocking-preallocation"}
    shown = carol.run("%jaxmem status")
    assert f"Note: Node agent: cannot reach the node agent at {wrong}" in shown, shown
    assert "--agent-listen" in shown and "Traceback" not in shown

    # Alice's pod is killed: her registration goes with its connection, even while the driver
    # still lists her PID; once it forgets it, neither the agent's resolution nor bob lists her.
    alice.kill()
    wait_for("alice's kernel gone from the agent's resolution",
             lambda: alice.host_pid not in _kernels_in_resolution(node.share), 15)  # fmt: skip
    node.state.remove_process(alice.host_pid).write()
    wait_for("alice gone from the agent's resolution", lambda: alice.host_pid not in {
        p["pid"] for p in _resolution(node.share)["processes"]}, 15)  # fmt: skip
    assert bob.host_pid in _kernels_in_resolution(node.share)
    wait_for("alice gone from bob's status", lambda: alice.host_pid not in _rows(bob.status()),
             15)  # fmt: skip

    # The agent stops answering (stopped, its sockets open): bob's last resolution grows
    # stale and he is told so, by a warning, never a traceback.
    os.kill(node.agent.pid, signal.SIGSTOP)
    stale = wait_for("bob told the agent is stale", lambda: next((
        w for w in bob.status()["warnings"] if w["kind"] == "agent-stale"), None), 30)  # fmt: skip
    assert "the agent has stopped; " in stale["message"]
    assert f"the node agent at {node.address}" in stale["message"]  # what failed, said
    shown = bob.run("%jaxmem status")
    assert "WARNING [agent-stale]" in shown and "Traceback" not in shown
    assert psutil.pid_exists(bob.host_pid)


@pytest.fixture
def heard_nothing(monkeypatch):
    """This process as a fresh kernel: no resolution received, no exchange failed yet."""
    from jax_nbmem.node import agent_client_tcp

    monkeypatch.setattr(agent_client_tcp, "_latest", [None, "", 0])
    monkeypatch.setattr(agent_client_tcp, "_parsed", [0, None])
    monkeypatch.setattr(agent_client_tcp, "_trouble", [None])


def test_without_a_resolution_a_pod_is_told_why_before_and_after_trying(heard_nothing):
    from jax_nbmem.node.resolution import load_resolution

    def reason(environ):
        found = load_resolution(None, environ=environ)
        assert found.state == "absent" and not found.processes
        return found.reason

    assert "nor the node agent's address ($JAX_NBMEM_AGENT_ADDRESS" in reason({})
    assert "address is malformed" in reason({"JAX_NBMEM_AGENT_ADDRESS": "node-without-port"})
    assert reason({"JAX_NBMEM_AGENT_HOST": "10.0.0.1"}) == (
        "no resolution from the node agent at 10.0.0.1:9842 yet")  # fmt: skip


def test_an_agent_that_accepts_and_never_answers_is_said_silent(heard_nothing):
    from jax_nbmem.node.agent_client_tcp import TcpAgentClient
    from jax_nbmem.node.resolution import load_resolution
    from tests.agent.agent_client import beacon, claims

    with socket.socket() as silent:  # its backlog completes the handshake; nobody reads
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = ("127.0.0.1", silent.getsockname()[1])
        client = TcpAgentClient(address)
        client.send(beacon(claims()))  # at most its answer's timeout, on the writer's thread
        client.close()
    assert client.proven_pid is None
    environ = {"JAX_NBMEM_AGENT_ADDRESS": f"127.0.0.1:{address[1]}"}
    found = load_resolution(None, environ=environ)
    assert found.state == "absent"
    assert found.reason == f"the node agent at 127.0.0.1:{address[1]} did not answer in time"


def _culler_args(share, log, hub_port: int, tmp_path) -> tuple[list[str], dict[str, str]]:
    """The base manifest's culler, as rendered, in earnest: no --dry-run, a hub (that nobody
    answers: a warning asks no server), a short --idle, a --warn and --every longer than the
    test (one round: a second would warn again what the test takes away); its environment."""
    from tests.deploy.kubernetes import containers, pod_environment, render

    culler = containers(render(tmp_path / "render", None))["culler"]
    assert culler["command"] == ["jax-nbmem", "cull"]
    args = [a for a in culler["args"] if a != "--dry-run"]
    for option, value in (("--share-dir", str(share)), ("--log", str(log)), ("--idle", "2"),
                          ("--warn", "300"), ("--every", "600")):  # fmt: skip
        args[args.index(option) + 1] = value
    args += ["--hub-url", f"http://127.0.0.1:{hub_port}"]
    return args, {**pod_environment(culler), "JUPYTERHUB_API_TOKEN": "culler-token"}


def _pending(report: dict) -> list[dict]:
    return [w for w in report["warnings"] if w["kind"] == "cull-pending"]


@pytest.mark.timeout(180)
def test_the_culler_s_warning_reaches_its_kernel_in_a_pod_and_no_other(node, tmp_path):
    # No hub user claimed: these stand-in pods have no Kubernetes API to annotate them, so the
    # host proves only their Unix user (root here), and a claim of another would (rightly) stop
    # the culler (tests/hostile/test_authority_containers.py).
    alice = node.pod("alice-pod", as_kernel=True, JPY_SESSION_NAME="/home/jovyan/hog.ipynb")
    bob = node.pod("bob-pod", as_kernel=True, JUPYTERHUB_USER="bob",
                   JPY_SESSION_NAME="/home/jovyan/work.ipynb")  # fmt: skip
    for box in (alice, bob):
        box.send("%load_ext jax_nbmem")
    for box in (alice, bob):
        box.answer()
    alice.run(_ON_THE_GPU.format(uuid=node.uuid, pool=POOL))  # her default mode's pool
    bob.run("%jaxalloc off")
    node.state.process(0, alice.host_pid, POOL + 300 * MiB).process(0, bob.host_pid, 300 * MiB)
    node.state.write()

    def both_proven():
        kernels = _kernels_in_resolution(node.share)
        theirs = kernels.get(alice.host_pid, {}).get("kernel") or {}
        return kernels if bob.host_pid in kernels and theirs.get("gpus") else None

    wait_for("alice's pool and bob in the agent's resolution", both_proven, 30)
    # Bob's pod finds its own row before anything is said (his host PID, from the agent).
    wait_for("bob's own row", lambda: bob.status()["pid"] == bob.host_pid, 20)
    time.sleep(2.5)  # alice idle for longer than the culler's --idle

    # The culler, as the DaemonSet runs it, beside the agent: it warns alice's idle pool.
    args, env = _culler_args(node.share, tmp_path / "admin.log", _free_port("127.0.0.1"),
                             tmp_path)  # fmt: skip
    culler = subprocess.Popen([sys.executable, "-m", "jax_nbmem.cli", "cull", *args],
                              env={**node.env, **env}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        ready, _, _ = select.select([culler.stdout], [], [], 60)
        said = culler.stdout.readline() if ready else ""
        # Its start line: nobody answers at the hub's address, which is said, not fatal.
        assert said.startswith("jax-nbmem cull: started, in earnest"), said
        assert "does not answer (connection refused" in said and "starts anyway" in said, said
        ready, _, _ = select.select([culler.stdout], [], [], 60)
        said = culler.stdout.readline() if ready else ""
        assert said.startswith(f"jax-nbmem cull: warned kernel PID {alice.host_pid} "), said
        notice = node.share / f"jax_nbmem-cull-{alice.ns[1]}-1.json"
        assert json.loads(notice.read_text())["pid"] == alice.host_pid
        # A notice for bob's key that neither root nor the share directory's owner wrote: not
        # relayed (the agent trusts what a kernel would trust in a file). Written after the
        # culler's round, which clears notices it did not give.
        forged = node.share / f"jax_nbmem-cull-{bob.ns[1]}-1.json"
        forged.write_text(json.dumps({
            "pid": bob.host_pid, "started_at": None, "warned_at": 1.0, "deadline": 2e9,
            "reason": "idle-preallocated", "why": "forged", "key": f"{bob.ns[1]}-1"}))  # fmt: skip
        os.chown(forged, 4242, 4242)

        # Alice, in her pod with no share directory, is told by the agent, in her status.
        report = wait_for("the warning in alice's status", lambda: (
            r if _pending(r := alice.status()) else None), 20)  # fmt: skip
        (pending,) = _pending(report)
        assert pending["pid"] == alice.host_pid and pending["gpu"] == 0
        assert "will be shut down at " in pending["message"] and "unless it runs a cell" in (
            pending["message"])  # fmt: skip
        assert report["warnings"][0] == pending  # first, as on a host with the share directory
        shown = alice.run("%jaxmem status")
        assert "WARNING [cull-pending]: This kernel will be shut down at" in shown, shown
        # Bob's pod: neither alice's notice nor the forged one for his own key.
        report = bob.status()
        assert report["pid"] == bob.host_pid and not _pending(report), report["warnings"]
        assert "cull-pending" not in bob.run("%jaxmem status")

        # The notice taken away (as the culler does once she runs a cell): gone from her status.
        notice.unlink()
        wait_for("the warning gone from alice's status",
                 lambda: not _pending(alice.status()), 20)  # fmt: skip
    finally:
        culler.kill()
        _, err = culler.communicate(timeout=30)
    assert "Traceback" not in err, err
