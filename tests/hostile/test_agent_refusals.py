"""Refusals tell the caller nothing about other processes (issue 37 item 2).

Bob's kernel is proven in a container of his. Mallory, a real user on the host, sends lines
that claim his process, piece by piece and whole; each refusal may name what she claimed and
her own host PID, and nothing else: no number of bob's (PID namespace, start ticks, host
PID), nor one of her own process that she did not claim. Root only.
"""

import json
import re

from tests.agent.namespaces import contained
from tests.hostile.agents import CLIENT, as_user, reachable_share, running, serving, users

__all__ = ["reachable_share", "users"]  # fixtures


def _numbers(value) -> set[int]:
    return {int(n) for n in re.findall(r"\d+", json.dumps(value))}


def test_refusals_name_only_the_caller_s_own_claims(users, reachable_share):
    mallory, bob = users
    with serving(reachable_share) as agent:
        with contained(as_user(bob, CLIENT, agent.path, "[{}]"), hostname="bob-box") as box:
            assert json.loads(box.line()) == {"ok": True, "pid": box.host_pid}
            seen = agent.registry.proven()[box.host_pid].view
            bob_values = {*seen.pid_ns, seen.start_ticks, box.host_pid}
            forgeries = [
                {"pid_ns": list(seen.pid_ns)},
                {"pid_in_ns": 1},
                {"start_ticks": seen.start_ticks},
                {"pid": 1},
                {
                    "pid_ns": list(seen.pid_ns),
                    "pid_in_ns": 1,
                    "start_ticks": seen.start_ticks,
                    "pid": 1,
                },  # fmt: skip
                {"boot_id": "0"},
            ]
            attack = as_user(mallory, CLIENT, agent.path, json.dumps(forgeries))
            with running(attack) as mallory_process:
                answers = [json.loads(mallory_process.stdout.readline()) for _ in forgeries]
                hers = mallory_process.pid  # as_user.py runs the client in its own process
                agent_view = agent.registry.viewer.view(hers)
                assert agent_view.uid == mallory.uid
        assert not any(answer["ok"] for answer in answers)
        her_values = {*agent_view.pid_ns, agent_view.start_ticks}
        for forged, answer in zip(forgeries, answers, strict=True):
            allowed = _numbers(forged) | {hers}
            told = _numbers(answer["reason"]) - allowed
            assert not told & bob_values, (answer, bob_values)
            assert not told & her_values, (answer, her_values)
        assert box.host_pid not in agent.registry.proven()  # he left; nothing of his stayed
