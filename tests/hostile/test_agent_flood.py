"""The node agent keeps serving an honest kernel while a user floods it (issue 37 item 3).

Correctness, not speed (the figures are benchmarks/agent_attack.py's): while mallory, a real
user, holds every connection the agent lets her hold, from her own user on the host and from
PID namespaces of hers, bob's kernel in a container still registers; while her look-ups are
held up, bob's registration is judged all the same. Root only.
"""

import json
import os
import socket
import threading

from jax_nbmem.agent.netpeer import PeerFinder
from tests.agent.namespaces import client_args, contained
from tests.agent.test_agent_tcp import pod, subnet
from tests.hostile.agents import IDLE, as_user, reachable_share, running, serving, users
from tests.waiting import wait_for

__all__ = ["reachable_share", "subnet", "users"]  # fixtures


def _reasons(stdout, processes: int, wanted: str) -> list[str]:
    """Refusals a flood printed, read until one has ``wanted`` (after each process's count)."""
    seen, opened = [], 0
    while not any(wanted in reason for reason in seen):
        said = json.loads(stdout.readline())
        opened += "opened" in said
        seen += [said["refused"]] if "refused" in said else []
    return seen


def test_an_idle_connection_flood_leaves_room_for_an_honest_kernel(users, reachable_share):
    mallory, _bob = users
    limits = {"max_connections": 48, "max_per_group": 16, "reserved": 8, "first_line_s": 600}
    with serving(reachable_share, **limits) as agent:
        flood = as_user(mallory, IDLE, agent.path, 200, 50)  # 50 processes, 4 connections each
        # Her user's flood first, judged before her namespaces start: started together, they
        # could take the room first and her user's refusals would name the reserve instead.
        with running(flood) as on_host:
            said = _reasons(on_host.stdout, 50, "connections to the agent already")
            assert f"your user (uid {mallory.uid}) has 16 connections" in said[-1]
            with (
                contained(flood, hostname="m1") as in_ns,
                contained(flood, hostname="m2") as in_other_ns,
            ):
                _flooded_namespaces(agent, mallory, in_ns, in_other_ns)


def _flooded_namespaces(agent, mallory, in_ns, in_other_ns) -> None:
    """While her user and two of her namespaces hold all they may, bob's container registers."""
    _reasons(in_ns.popen.stdout, 50, "")
    _reasons(in_other_ns.popen.stdout, 50, "")
    wait_for("the agent to judge every connection of the flood",
             lambda: agent.refused + agent.connections >= 600)  # fmt: skip
    assert agent.admission.open_in(("uid", mallory.uid)) == 16  # her user's share
    assert agent.connections == 40  # two namespaces more: the second up to the reserve
    # Bob's kernel, in a container of his own, finds a slot kept for callers with none.
    with contained(client_args(agent.path), hostname="bob-box") as box:
        assert json.loads(box.line()) == {"ok": True, "pid": box.host_pid}
        assert box.host_pid in agent.registry.proven()
    # and his connection was let go with him (once the agent saw it close)
    wait_for("bob's connection to close", lambda: agent.connections == 40)


class _HeldUp(PeerFinder):
    """The host's own answer, but a caller from ``slow_address`` waits until released: the
    cost of a namespace with many sockets, made as long as the test needs."""

    def __init__(self, slow_address: str) -> None:
        super().__init__()
        self.slow_address = slow_address
        self.release = threading.Event()
        self.held = 0

    def holders(self, peer, agent):
        if peer[0] == self.slow_address:
            self.held += 1
            self.release.wait(120)
        return super().holders(peer, agent)


def test_one_caller_s_slow_look_ups_do_not_delay_another_s_registration(subnet):
    network = subnet[0]
    finder = _HeldUp(f"{network}.1")  # mallory: the host's end of the pod network
    with serving(None, tcp=(f"{network}.1", 0), peers=finder, first_line_s=600) as agent:
        address = f"{network}.1:{agent.tcp_address[1]}"
        floods = []
        for _ in range(6):
            sock = socket.create_connection((f"{network}.1", agent.tcp_address[1]), timeout=30)
            sock.sendall(b'{"request": "resolution"}\n')
            floods.append(sock)
        try:
            wait_for("mallory's look-up to be under way", lambda: finder.held == 1)
            with pod(address, [{}], subnet=subnet, hostname="bob-pod") as box:
                said = json.loads(box.line())
                assert said == {"ok": True, "pid": box.host_pid, "reason": None}
                assert finder.held == 1  # hers wait their turn, one at a time, and still wait
                # Released while the pod lives (its veth, and so the address, goes with it).
                finder.release.set()
                answers = [json.loads(sock.makefile("rb").readline()) for sock in floods]
            reasons = sorted(answer["reason"] for answer in answers)  # all judged in the end
            assert reasons[:2] == [f"host PID {os.getpid()} has 4 connections already"] * 2
            assert reasons[2:] == ["the agent has no resolution yet"] * 4
        finally:
            finder.release.set()
            for sock in floods:
                sock.close()
