"""The node agent over TCP: a kernel in a pod (PID and network namespaces of its own) is proven.

Each "pod" is ``unshare --net --pid --fork --mount-proc``: its own loopback, and one end of a
veth pair whose other end, in this host's namespace, carries the address the agent listens on
(as a pod reaches its node's ``status.hostIP``). The kernel is the real TCP client
(tests/agent/agent_client_net.py). Root only, as CI runs it.
"""

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jax_nbmem.agent.server import AgentServer, Registry
from tests.agent.namespaces import Contained, need_namespaces
from tests.waiting import wait_for

CLIENT = Path(__file__).with_name("agent_client_net.py")


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=20)


@pytest.fixture
def subnet():
    """A veth pair with a /24 of 10.213-254.x.0 and a /64 of fd00:213:x:y:: of this test's own
    (other runs on this machine pick others): ``(v4 prefix, v6 prefix, host end, pod end)``.
    """
    need_namespaces()
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        pytest.skip("needs iproute2's ip and nsenter")
    tag = f"{os.getpid() % 100000}{random.randrange(100)}"
    host_if, pod_if = f"jn{tag}h"[:15], f"jn{tag}p"[:15]
    _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", pod_if)
    network = f"10.{random.randrange(213, 255)}.{random.randrange(256)}"
    network6 = f"fd00:213:{random.randrange(65536):x}:{random.randrange(65536):x}:"
    try:
        _run("ip", "addr", "add", f"{network}.1/24", "dev", host_if)
        _run("ip", "-6", "addr", "add", f"{network6}:1/64", "dev", host_if, "nodad")
        _run("ip", "link", "set", host_if, "up")
        yield network, network6, host_if, pod_if
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=20)


def into_subnet(host_pid: int, subnet) -> None:
    """Move the veth pair's pod end into ``host_pid``'s network namespace, as ``.2`` of it."""
    network, network6, _, pod_if = subnet
    _run("ip", "link", "set", pod_if, "netns", str(host_pid))
    enter = ["nsenter", "-t", str(host_pid), "-n", "ip"]
    _run(*enter, "addr", "add", f"{network}.2/24", "dev", pod_if)
    _run(*enter, "-6", "addr", "add", f"{network6}:2/64", "dev", pod_if, "nodad")
    _run(*enter, "link", "set", pod_if, "up")
    _run(*enter, "link", "set", "lo", "up")


@contextlib.contextmanager
def pod(address: str, patches: list, *, subnet=None, hostname: str = "pod"):
    """The TCP client as PID 1 of a PID and network namespace of its own, named ``hostname``.

    With ``subnet`` (the fixture's), its veth end is moved in and given ``.2``; without, it
    shares this host's network namespace (a hostNetwork pod).
    """
    flags = ["--pid", "--fork", "--mount-proc", "--uts", "--mount"]
    flags += ["--net"] if subnet is not None else []
    inner = f"hostname {hostname}; exec {sys.executable} {CLIENT} {address} '{json.dumps(patches)}'"
    popen = subprocess.Popen(["unshare", *flags, "sh", "-c", inner], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)  # fmt: skip
    box = Contained(popen, sys.executable)
    try:
        if subnet is not None:
            into_subnet(box.host_pid, subnet)
        yield box
    finally:
        box.kill()


def _resolution_for(pid: int) -> tuple[float, str]:
    return 1000.0, json.dumps({"schema": 1, "asked_by": pid, "processes": []})


@pytest.fixture(params=["ipv4", "ipv6", "dual-stack"])
def agent_on(subnet, request):
    """The agent on the host's end of the veth; dual-stack: an IPv6 socket an IPv4 pod reaches
    (the agent sees it as ::ffff:a.b.c.d)."""
    network, network6 = subnet[:2]
    listen, dial = {
        "ipv4": (f"{network}.1", f"{network}.1"),
        "ipv6": (f"{network6}:1", f"[{network6}:1]"),
        "dual-stack": (f"::ffff:{network}.1", f"{network}.1"),
    }[request.param]
    server = AgentServer(None, Registry(), tcp=(listen, 0), first_line_s=5.0,
                         line_s=2.0, resolution=_resolution_for)  # fmt: skip
    server.start()
    yield server, f"{dial}:{server.tcp_address[1]}"
    server.stop()


def answers(box: Contained, count: int) -> list[dict]:
    return [json.loads(box.line()) for _ in range(count)]


def test_a_kernel_in_a_pod_of_its_own_is_proven_by_the_host_process_holding_its_socket(
    agent_on, subnet
):
    agent, address = agent_on
    with pod(address, [{}], subnet=subnet, hostname="alice-pod") as box:
        (said,) = answers(box, 1)
        (connection,) = agent._connections.values()
        if "::ffff:" in agent.tcp[0]:  # the dual-stack socket saw the pod's IPv4 end mapped
            assert connection.peer[0][0] == f"::ffff:{subnet[0]}.2"
        assert said == {"ok": True, "pid": box.host_pid, "reason": None}
        registration = agent.registry.proven()[box.host_pid]
        assert registration.view.pid_in_ns == 1 and registration.view.namespaced
        assert registration.content["identity"]["hostname"] == "alice-pod"
        # The node's resolution came over the same connection, made for this very caller.
        resolution = json.loads(box.line())
        assert resolution == {"resolution": {"schema": 1, "asked_by": box.host_pid,
                                             "processes": []}, "reason": None}  # fmt: skip
        assert box.line() == "READY"
    wait_for("the registration to go with its connection", lambda: not agent.registry.proven())


def test_forged_claims_over_tcp_are_refused_with_their_reason(agent_on, subnet):
    agent, address = agent_on
    patches = [{"pid_in_ns": 7}, {"start_ticks": 12345}, {"pid_ns": [1, 2]}, {"pid": 99}]
    with pod(address, patches, subnet=subnet) as box:
        said = answers(box, 4)
        assert [s["ok"] for s in said] == [False] * 4
        assert "pid_in_ns 7 is not" in said[0]["reason"]
        assert "start_ticks 12345 is not" in said[1]["reason"]
        assert "pid_ns [1, 2] is not the namespace" in said[2]["reason"]
        assert "the beacon's pid 99 is not its PID" in said[3]["reason"]
        assert agent.registry.proven() == {}
        assert agent.refused >= 4


def test_a_pod_claiming_another_pod_s_kernel_is_refused_and_the_other_keeps_its_proof(
    agent_on, subnet
):
    agent, address = agent_on
    with pod(address, [{}], subnet=subnet, hostname="alice-pod") as alice:
        assert answers(alice, 1)[0]["ok"]
        alice_view = agent.registry.proven()[alice.host_pid].view
        # Bob's pod is a host-network one here: it reaches the agent all the same, and claims
        # to be alice's kernel (her namespace, her PID 1, her start), word for word.
        forged = {"pid_ns": list(alice_view.pid_ns), "pid_in_ns": 1,
                  "start_ticks": alice_view.start_ticks}  # fmt: skip
        with pod(address, [forged], hostname="bob-pod") as bob:
            (said,) = answers(bob, 1)
            assert not said["ok"] and "is not the namespace the host sees" in said["reason"]
            assert set(agent.registry.proven()) == {alice.host_pid}
            # Judged as bob's own process, and the refusal names only what he claimed: no host
            # PID of the socket the agent found (issue 45).
            assert str(bob.host_pid) not in said["reason"] and "your process" in said["reason"]


def test_a_kernel_in_the_host_s_network_namespace_over_loopback_is_proven(tmp_path):
    need_namespaces()
    agent = AgentServer(None, Registry(), tcp=("127.0.0.1", 0), resolution=_resolution_for)
    agent.start()
    try:
        with pod(f"127.0.0.1:{agent.tcp_address[1]}", [{}], hostname="host-net") as box:
            (said,) = answers(box, 1)
            assert said == {"ok": True, "pid": box.host_pid, "reason": None}
            assert json.loads(box.line())["resolution"]["asked_by"] == box.host_pid
    finally:
        agent.stop()


def test_an_address_already_taken_is_a_said_error_and_nothing_is_left_listening(tmp_path):
    first = AgentServer(None, Registry(), tcp=("127.0.0.1", 0))
    first.start()
    try:
        from jax_nbmem.agent.server import AgentDirError

        share = tmp_path / "share"
        share.mkdir()
        second = AgentServer(str(share), Registry(), tcp=("127.0.0.1", first.tcp_address[1]))
        with pytest.raises(AgentDirError, match="--agent-listen"):
            second.start()
        assert not (share / "agent" / "agent.sock").exists()  # the Unix socket was undone
    finally:
        first.stop()


def test_one_process_s_fifth_tcp_connection_is_refused_when_its_look_ups_outrun_the_verdicts():
    """The per-PID count is the serving thread's: a look-up done before the verdict of the same
    process's previous connection was applied sees one too few. Held back here until all five
    look-ups are done, the fifth verdict is refused where it is applied."""
    agent = AgentServer(None, Registry(), tcp=("127.0.0.1", 0), first_line_s=600)
    looked_up = threading.Semaphore(0)
    holders = agent.peers.holders

    def counted_holders(*peer):
        found = holders(*peer)
        looked_up.release()
        return found

    applying = agent._apply
    all_looked_up = threading.Event()

    def held_apply(connection, verdict):
        all_looked_up.wait(60)
        applying(connection, verdict)

    agent.peers.holders, agent._apply = counted_holders, held_apply
    agent.start()
    socks = []
    try:
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", agent.tcp_address[1]), timeout=30)
            sock.sendall(b'{"request": "resolution"}\n')
            socks.append(sock)
        for _ in range(5):
            assert looked_up.acquire(timeout=30)
        all_looked_up.set()
        reasons = sorted(json.loads(s.makefile("rb").readline())["reason"] for s in socks)
        assert (
            reasons
            == [f"host PID {os.getpid()} has 4 connections already"]
            + ["the agent has no resolution yet"] * 4
        )
        assert agent._per_pid[os.getpid()] == 4
    finally:
        all_looked_up.set()
        for sock in socks:
            sock.close()
        agent.stop()
