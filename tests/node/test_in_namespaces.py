"""Kernels in real PID namespaces (as containers run them), one share directory, one GPU.

Each "container" is ``unshare --pid --fork --mount-proc --uts`` with a host name of its own and
a Jupyter runtime directory of its own, running a real IPython shell with jax_nbmem loaded, as
PID 1 of its namespace: so every container's kernel has the same PID there. The simulated GPU
lists the *host* PIDs (what a real driver lists), written here from outside the namespaces; the
node agent's resolution, where a test has one, is written by hand as the agent writes it.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from jax_nbmem.node.alive import lock_alive
from jax_nbmem.node.identity import start_ticks
from tests.ipython_session import clean_environ
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare for PID namespaces (as CI runs)",
)

GiB, MiB = 1 << 30, 1 << 20
TOTAL = 80 * GiB

_DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, os, sys
    from IPython.testing.globalipapp import start_ipython
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    shell = start_ipython()
    for line in sys.stdin:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            result = shell.run_cell(json.loads(line))
        error = result.error_in_exec or result.error_before_exec
        answer = {"out": out.getvalue(), "error": repr(error) if error else None}
        answers.write(json.dumps(answer) + "\\n")
    """
)

# A kernel whose JAX runs on the GPU says, in its beacon, its mode and pool there. JAX runs on
# the CPU here (no counters for a GPU), so this cell gives the beacon what a GPU run says.
_ON_THE_GPU = """
import jax_nbmem.notebook.beacon as _b
_real = _b.beacon_facts
_b.beacon_facts = lambda s: {{**_real(s), "mode_in_effect": "on", "pool_fraction": 0.75,
    "gpus": {{{uuid!r}: {{"bytes_in_use": 1 << 30, "pool_bytes": {pool}, "bytes_limit": {pool},
                         "peak_bytes_in_use": 1 << 30}}}}}}
"""


class Container:
    """One PID namespace with a host name and runtime directory of its own, a shell as PID 1."""

    def __init__(self, name: str, share, tmp, env: dict[str, str]) -> None:
        runtime = tmp / f"{name}-runtime"
        runtime.mkdir()
        full = clean_environ()
        full.update(env)
        full.update(JUPYTER_RUNTIME_DIR=str(runtime), JAX_NBMEM_SHARE_DIR=str(share),
                    JNM_DRIVER=_DRIVER)  # fmt: skip
        command = f'hostname {name} && exec {sys.executable} -c "$JNM_DRIVER"'
        self.name = name
        self.process = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "sh", "-c", command],
            env=full, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.host_pid = wait_for(f"{name}'s shell", self._shell, 20)
        info = os.stat(f"/proc/{self.host_pid}/ns/pid")
        self.ns = [info.st_dev, info.st_ino]  # read while it lives

    def _shell(self) -> int | None:
        for child in psutil.Process(self.process.pid).children():
            try:
                if "JNM_DRIVER" in " ".join(child.cmdline()) or "python" in child.name():
                    return child.pid
            except psutil.Error:
                pass
        return None

    def pid_here(self, host_pid: int) -> int:
        with open(f"/proc/{host_pid}/status") as f:
            line = next(line for line in f if line.startswith("NSpid:"))
        return int(line.split()[-1])

    def run(self, cell: str, timeout: float = 60) -> str:
        self.process.stdin.write(json.dumps(cell) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"{self.name}: no answer within {timeout}s to {cell!r}"
        answer = json.loads(self.process.stdout.readline())
        assert answer["error"] is None, (cell, answer)
        return answer["out"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def node(tmp_path, simgpu_env, sim_state):
    """A GPU node: the share directory, the simulated GPU, and containers started on demand."""
    share = tmp_path / "share"
    share.mkdir(mode=0o1777)
    sim_state.gpu(0, TOTAL).write()
    started: list[Container] = []

    def container(name, **env):
        box = Container(name, share, tmp_path, {**simgpu_env, **env})
        started.append(box)
        box.run("%load_ext jax_nbmem")
        return box

    container.share, container.state = share, sim_state
    container.uuid = sim_state._gpus[0].uuid
    yield container
    for box in started:
        box.close()


def beacon_path(share, box: Container):
    return share / f"jax_nbmem-beacon-{box.ns[1]}-1.json"


def hog_and_worker(node):
    """Alice's kernel preallocated 60 GiB (default mode); Bob's, `off`, holds 300 MiB."""
    alice = node("alice-box", JUPYTERHUB_USER="alice", JPY_SESSION_NAME="/home/jovyan/hog.ipynb")
    bob = node("bob-box", JUPYTERHUB_USER="bob", JPY_SESSION_NAME="/home/jovyan/work.ipynb")
    pool = int(0.75 * TOTAL)
    alice.run(_ON_THE_GPU.format(uuid=node.uuid, pool=pool))
    bob.run("%jaxalloc off")
    state = node.state
    state.process(0, alice.host_pid, pool + 300 * MiB).process(0, bob.host_pid, 300 * MiB)
    state.write()
    wait_for("alice's beacon with its pool", lambda: beacon_path(node.share, alice).exists()
             and "pool_bytes" in beacon_path(node.share, alice).read_text(), 20)  # fmt: skip
    return alice, bob


def status_of(box: Container) -> dict:
    out = box.run("import jax_nbmem, json; print(json.dumps(jax_nbmem.status()))")
    return json.loads(out.strip().splitlines()[-1])


def test_kernels_with_the_same_pid_in_two_containers_keep_their_own_beacons(node):
    alice = node("alice-box", JUPYTERHUB_USER="alice")
    bob = node("bob-box", JUPYTERHUB_USER="bob")
    assert alice.pid_here(alice.host_pid) == bob.pid_here(bob.host_pid) == 1
    assert alice.ns != bob.ns
    for box, hub_user in ((alice, "alice"), (bob, "bob")):
        path = wait_for(f"{box.name}'s beacon", lambda b=box: beacon_path(node.share, b).exists())
        content = json.loads(beacon_path(node.share, box).read_text())
        assert content["hub_user"] == hub_user and content["pid"] == 1
        assert (
            content["identity"]["pid_ns"] == box.ns and content["identity"]["hostname"] == box.name
        )
        assert content["identity"]["start_ticks"] == start_ticks(f"/proc/{box.host_pid}/stat")
        assert path and lock_alive(str(node.share), f"{box.ns[1]}-1") is True
    # No plain `<pid>` name: that is a host kernel's, and PID 1 is every container's.
    assert not (node.share / "jax_nbmem-beacon-1.json").exists()


def test_a_foreign_beacon_is_a_claim_and_sigkill_frees_its_lock(node):
    alice = node("alice-box", JUPYTERHUB_USER="alice", JPY_SESSION_NAME="/home/jovyan/hog.ipynb")
    bob = node("bob-box", JUPYTERHUB_USER="bob")
    wait_for("alice's beacon", lambda: beacon_path(node.share, alice).exists())
    claims = "from jax_nbmem.node.neighbours import read_claims; print(sorted(c.hub_user for c in read_claims()))"  # noqa: E501
    assert bob.run(claims).strip() == "['alice']"
    key = f"{alice.ns[1]}-1"
    os.kill(alice.host_pid, signal.SIGKILL)  # the container dies without a word
    wait_for("alice's lock released", lambda: lock_alive(str(node.share), key) is False, 10)
    assert beacon_path(node.share, alice).exists()  # its file stays, but it is dead
    assert bob.run(claims).strip() == "[]"


def write_resolution(share, entries, written_at=None):
    agent = share / "agent"
    agent.mkdir(mode=0o755, exist_ok=True)
    os.chmod(agent, 0o755)
    path = agent / "resolution.json"
    path.write_text(json.dumps({
        "schema": 1, "agent": {"pid": os.getpid(), "hostname": "node", "boot_id": None,
                               "version": "test"},
        "written_at": time.time() if written_at is None else written_at, "interval_s": 2.0,
        "processes": entries,
    }))  # fmt: skip
    os.chmod(path, 0o644)


def entry(box: Container, host_pid: int, uuid, kernel=None, name=None) -> dict:
    return {
        "pid": host_pid, "pid_in_container": box.pid_here(host_pid), "pid_ns": box.ns,
        "start_ticks": start_ticks(f"/proc/{host_pid}/stat"), "gpus": [uuid], "kernel": kernel,
        "source": "agent",
        "container": {"id": f"{box.name}-0123456789ab", "runtime": "docker",
                      "name": name or box.name, "pod_uid": None, "pod": None, "namespace": None},
    }  # fmt: skip


def test_with_the_agent_bob_names_alice_and_finds_his_own_row(node):
    alice, bob = hog_and_worker(node)
    kernel = json.loads(beacon_path(node.share, alice).read_text())  # what alice sent the agent
    write_resolution(node.share, [
        entry(alice, alice.host_pid, node.uuid, kernel=kernel, name="jupyter-alice"),
        entry(bob, bob.host_pid, node.uuid, name="jupyter-bob"),
    ])  # fmt: skip
    report = status_of(bob)
    rows = {row["pid"]: row for row in report["processes"]}
    theirs, ours = rows[alice.host_pid], rows[bob.host_pid]
    assert (theirs["kind"], theirs["source"], theirs["hub_user"]) == ("kernel", "agent", "alice")
    assert theirs["notebook"] == "/home/jovyan/hog.ipynb" and theirs["preallocated"] is True
    assert theirs["container"]["name"] == "jupyter-alice" and theirs["pid_in_container"] == 1
    assert (ours["kind"], ours["pid_in_container"]) == ("self", 1)
    assert report["pid"] == bob.host_pid and report["pid_in_container"] == 1
    assert report["agent"]["state"] == "fresh"
    (warning,) = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
    assert warning["pid"] == alice.host_pid
    assert "hub user alice" in warning["message"] and "jupyter-alice" in warning["message"]
    shown = bob.run("%jaxmem status")  # as a person reads it
    assert f"pid {alice.host_pid}" in shown and "container jupyter-alice (pid 1 there)" in shown
    assert "[proven by the node agent]" in shown and "WARNING [blocking-preallocation]" in shown


def test_without_the_agent_bob_still_warns_and_names_alice_only_as_inferred(node):
    alice, bob = hog_and_worker(node)
    report = status_of(bob)
    (warning,) = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
    assert warning["pid"] == alice.host_pid
    assert "hub user alice" in warning["message"] and "inferred" in warning["message"]
    # Bob's own row is a host PID nobody resolves: the advice is the node agent.
    (namespace,) = [w for w in report["warnings"] if w["kind"] == "pid-namespace"]
    assert "jax-nbmem exporter --share-dir" in namespace["message"]
    rows = {row["pid"]: row for row in report["processes"]}
    assert rows[alice.host_pid]["source"] == "inferred"
    assert report["pid"] is None and report["pid_in_container"] == 1  # no agent: host PID unknown

    # A second kernel elsewhere that also says it holds such a pool: nobody is named.
    carol = node("carol-box", JUPYTERHUB_USER="carol")
    carol.run(_ON_THE_GPU.format(uuid=node.uuid, pool=int(0.75 * TOTAL)))
    wait_for("carol's pool in her beacon", lambda: "pool_bytes" in (
        beacon_path(node.share, carol).read_text() if beacon_path(node.share, carol).exists()
        else ""), 20)  # fmt: skip
    report = status_of(bob)
    (warning,) = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
    assert "alice" not in warning["message"] and "carol" not in warning["message"]

    # A stale resolution: agent-stale, and the same fallback.
    write_resolution(node.share, [entry(bob, bob.host_pid, node.uuid)], time.time() - 120)
    kinds = [w["kind"] for w in status_of(bob)["warnings"]]
    assert "agent-stale" in kinds and "blocking-preallocation" in kinds


def test_jaxmem_shutdown_in_a_container_translates_or_refuses(node, tmp_path):
    alice, bob = hog_and_worker(node)
    # A second kernel in bob's container (ipykernel with a connection file, by its command line).
    bob.run(
        "import subprocess, sys; other = subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(300)', '-m', 'ipykernel_launcher', '-f', "
        f"'{tmp_path}/kernel-other.json'])"
    )
    children = psutil.Process(bob.host_pid).children
    other = wait_for("bob's other kernel", lambda: next(
        (c.pid for c in children() if "kernel-other" in " ".join(c.cmdline())), None))  # fmt: skip
    here = bob.pid_here(other)
    state = node.state
    state.process(0, other, GiB).process(0, here, GiB)  # `here` as a host PID: someone else
    state.write()
    kernel = json.loads(beacon_path(node.share, alice).read_text())
    write_resolution(node.share, [
        entry(alice, alice.host_pid, node.uuid, kernel=kernel, name="jupyter-alice"),
        entry(bob, bob.host_pid, node.uuid), entry(bob, other, node.uuid),
    ])  # fmt: skip

    refused = bob.run(f"%jaxmem shutdown {alice.host_pid} --yes")
    assert "another container (jupyter-alice)" in refused and "nothing done" in refused
    assert psutil.pid_exists(alice.host_pid)

    # NVML lists `here` (the other kernel's number in bob's container) as a host PID that no
    # entry resolves: it is not the kernel that carries that number here.
    refused = bob.run(f"%jaxmem shutdown {here} --yes")
    assert "nothing done" in refused and psutil.pid_exists(other)

    stopped = bob.run(f"%jaxmem shutdown {other} --yes")
    assert f"PID {here} in this container" in stopped, stopped
    wait_for("the other kernel gone", lambda: not psutil.pid_exists(other)
             or psutil.Process(other).status() == psutil.STATUS_ZOMBIE, 10)  # fmt: skip


class FakeAgent:
    """A listener on S/agent/agent.sock as the node agent's: each line with its peer's host PID."""

    def __init__(self, share) -> None:
        import socket
        import struct
        import threading

        agent = share / "agent"
        agent.mkdir(mode=0o755, exist_ok=True)
        self.path = str(agent / "agent.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        os.chmod(self.path, 0o666)
        self.server.listen()
        self.lines: list[tuple[int, dict]] = []
        self.connections = []

        def serve(conn) -> None:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid = struct.unpack("3i", creds)[0]
            with conn, conn.makefile("rb") as lines:
                for line in lines:
                    self.lines.append((pid, json.loads(line)))
                    conn.sendall(json.dumps({"ok": True, "pid": pid}).encode() + b"\n")

        def accept() -> None:
            while True:
                try:
                    conn, _ = self.server.accept()
                except OSError:
                    return
                self.connections.append(conn)
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()

    def restart(self) -> None:
        """Drop every connection, as an agent that restarts does (the kernels connect again)."""
        for conn in self.connections:
            conn.close()
        self.connections.clear()

    def close(self) -> None:
        self.server.close()
        self.restart()


def test_kernels_send_their_beacons_to_the_agent_which_sees_their_host_pids(node):
    agent = FakeAgent(node.share)
    try:
        alice = node("alice-box", JUPYTERHUB_USER="alice")
        bob = node("bob-box", JUPYTERHUB_USER="bob")

        def sent_by(box):
            return [line for pid, line in agent.lines if pid == box.host_pid]

        for box in (alice, bob):
            (first, *_) = wait_for(
                f"{box.name}'s beacon at the agent", lambda b=box: sent_by(b), 20
            )
            identity = first["identity"]
            assert identity["pid_in_ns"] == 1 and identity["pid_ns"] == box.ns
            assert identity["start_ticks"] == start_ticks(f"/proc/{box.host_pid}/stat")
            assert identity["hostname"] == box.name and first["hub_user"] == box.name[:-4]
        # The agent's answer: the kernel now knows the host PID it was proven as.
        # (The answer comes on the agent's client thread: looked at until it is in.)
        proven = "import jax_nbmem; print(jax_nbmem._session().beacon.agent.proven_pid)"
        wait_for("bob's kernel to know its proven host PID",
                 lambda: bob.run(proven).strip() == str(bob.host_pid), 20)  # fmt: skip

        # The agent restarts: each kernel registers again, within the 5 s backoff (and a bit).
        before = len(sent_by(bob))
        agent.restart()
        wait_for("bob registered again", lambda: len(sent_by(bob)) > before, 15)
    finally:
        agent.close()


def test_a_namespace_without_proc_claims_what_it_can_and_still_writes_its_beacon(tmp_path):
    code = (
        "import json, os; from jax_nbmem.node.identity import own_identity, beacon_key\n"
        "from jax_nbmem.node.beacons import BeaconWriter\n"
        f"w = BeaconWriter(lambda: {{'schema': 1, 'pid': os.getpid(), 'started_at': 1.0}}, {str(tmp_path)!r})\n"  # noqa: E501
        "print(json.dumps([own_identity(), beacon_key(), w.write_now(), w.alive.held != []]))"
    )
    found = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount", "sh", "-c",
         f'umount -l /proc && exec {sys.executable} -c "$CODE"'],
        env={**clean_environ(), "CODE": code}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    identity, key, written, locked = json.loads(found.stdout)
    # Nothing to say of its namespace or start: the PID names it, as on the host.
    assert (
        identity["pid_ns"] is None
        and identity["start_ticks"] is None
        and identity["pid_in_ns"] == 1
    )
    assert key == "1" and written and locked
