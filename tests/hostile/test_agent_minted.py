"""PID namespaces a user mints herself buy her no more of the node agent (issue 45 item 1).

Any user can make user and PID namespaces (``unshare --user --pid``), thousands of them. The
agent counts the connections of a namespace a non-root user made against that user (its
owning user namespace, walked up to the one below the host's, and that one's owner), so
mallory's hundred namespaces hold one user's share, and bob's kernel, in a namespace he made
himself, still registers. A namespace root made (a container) keeps its own group. Root only.
"""

import json
from pathlib import Path

from jax_nbmem.agent.admission import unix_group
from tests.agent.namespaces import client_args, contained
from tests.hostile.agents import as_user, reachable_share, running, serving, users
from tests.waiting import wait_for

__all__ = ["reachable_share", "users"]  # fixtures

MINTED = Path(__file__).with_name("minted_caller.py")


def _lines(stdout, count: int) -> list[dict]:
    return [json.loads(stdout.readline()) for _ in range(count)]


def test_namespaces_a_user_mints_count_as_hers_and_leave_room_for_others(users, reachable_share):
    mallory, bob = users
    limits = {"max_connections": 48, "max_per_group": 16, "reserved": 8, "first_line_s": 600}
    with serving(reachable_share, **limits) as agent:
        with running(as_user(mallory, MINTED, agent.path, 60, 0)) as flood:
            said = _lines(flood.stdout, 60)
            refused = [line["refused"] for line in said if "refused" in line]
            assert len(refused) == 44, said
            assert f"your user (uid {mallory.uid}) has 16 connections" in refused[-1]
            assert agent.admission.open_in(("uid", mallory.uid)) == 16
            assert agent.connections == 16
            # Bob proves his kernel from a namespace he minted too: his own share, not hers.
            with running(as_user(bob, MINTED, agent.path, 1, 2000)) as honest:
                (answer,) = _lines(honest.stdout, 1)
                assert "proven" in answer, answer
                assert answer["proven"] in agent.registry.proven()
            # A container root made keeps a group of its own (not root's user's).
            with contained(client_args(agent.path), hostname="bob-box") as box:
                assert json.loads(box.line()) == {"ok": True, "pid": box.host_pid}
                group = unix_group("/proc", box.host_pid, 0)
                assert group[0] == "pid_ns", group
            wait_for("bob's connections to be let go", lambda: agent.connections == 16)
