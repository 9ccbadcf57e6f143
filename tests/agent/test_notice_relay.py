"""The node agent relays the culler's notice to the kernel it is meant for, over the kernel's own
connection: its wire form, what the kernel makes of it, and whose notice is never relayed.

The agent and the kernel's real TCP client run in this process here (the caller the agent
finds holding the socket is this very process, proven by its own claims); kernels in pods of
their own, with the real culler, are in test_kernel_over_tcp.py.
"""

from __future__ import annotations

import json
import os

import pytest

from jax_nbmem.agent.server import AgentServer, Registry
from jax_nbmem.node import agent_client_tcp
from jax_nbmem.node.agent_client_tcp import TcpAgentClient, network_notice
from jax_nbmem.node.notices import Notice, read_notice, relayed_notice, write_notice
from tests.agent.agent_client import beacon, claims

RESOLUTION = json.dumps({"schema": 1, "processes": []})


@pytest.fixture
def fresh(monkeypatch):
    """This process as a fresh kernel: nothing received from an agent yet."""
    monkeypatch.setattr(agent_client_tcp, "_latest", [None, "", 0])
    monkeypatch.setattr(agent_client_tcp, "_parsed", [0, None])
    monkeypatch.setattr(agent_client_tcp, "_trouble", [None])
    monkeypatch.setattr(agent_client_tcp, "_notice", [None])


@pytest.fixture
def agent(tmp_path, fresh):
    if os.geteuid() != 0:
        pytest.skip("the agent reads its callers' /proc/PID/ns as root does (as CI runs)")
    share = tmp_path / "share"
    share.mkdir(mode=0o755)
    server = AgentServer(str(share), Registry(), tcp=("127.0.0.1", 0),
                         resolution=lambda pid: (1000.0, RESOLUTION))  # fmt: skip
    server.start()
    client = TcpAgentClient(server.tcp_address, resolution_every_s=3600)
    try:
        yield server, client, share
    finally:
        client.close()
        server.stop()


def _notice(pid: int, **changes) -> Notice:
    fields = dict(pid=pid, started_at=None, warned_at=1000.0, deadline=2e9,
                  reason="idle-preallocated", why="idle for 2 h, it holds a pool")  # fmt: skip
    return Notice(**{**fields, **changes})


def test_the_agent_relays_a_proven_kernel_its_own_notice_only(agent):
    server, client, share = agent
    asked_before = client.ask_resolution()  # not connected yet: nothing asked, nothing kept
    assert asked_before is False and network_notice() is None
    client.send(beacon(claims()))
    assert client.proven_pid == os.getpid()
    assert client.ask_resolution() and network_notice() is None  # no notice: none relayed

    # Another process's notice (a PID not its own): never relayed to this caller.
    write_notice(str(share), _notice(os.getpid() + 1))
    assert client.ask_resolution() and network_notice() is None

    # Its own, written as the culler writes it (root's, in the share directory): relayed, in
    # the answer with the resolution, then in the "unchanged" one.
    mine = _notice(os.getpid())
    write_notice(str(share), mine)
    client.written_at = None
    assert client.ask_resolution()
    assert network_notice() == read_notice([str(share)], os.getpid()).__dict__
    assert agent_client_tcp.network_resolution()[0] == RESOLUTION.encode()
    assert client.written_at == 1000.0
    assert client.ask_resolution() and network_notice()["deadline"] == 2e9  # unchanged
    assert relayed_notice(network_notice(), os.getpid()) == mine
    assert relayed_notice(network_notice(), os.getpid() + 1) is None  # not for another PID
    assert relayed_notice(network_notice(), os.getpid(), key="4026532000-1") is None

    # Taken away: gone from the next answer.
    os.unlink(share / f"jax_nbmem-cull-{os.getpid()}.json")
    assert client.ask_resolution() and network_notice() is None

    # One that neither root nor the share directory's owner wrote: not trusted, not relayed.
    path = write_notice(str(share), mine)
    os.chown(path, 4242, 4242)
    client.written_at = None
    assert client.ask_resolution() and network_notice() is None
    os.chown(path, 0, 0)
    assert client.ask_resolution() and network_notice() is not None
    client.close()  # a lost connection: what it relayed no longer stands
    assert network_notice() is None


def test_a_caller_that_proved_nothing_gets_no_notice(agent):
    server, client, share = agent
    write_notice(str(share), _notice(os.getpid()))
    forged = {**beacon(claims()), "identity": {**claims(), "start_ticks": 1}}
    client.send(forged)
    assert client.proven_pid is None and "start_ticks 1 is not" in client.last_reason
    assert client.ask_resolution() and network_notice() is None


def test_the_notice_first_leaves_the_answer_readable_by_a_plain_json_reader():
    resolution = b'{"ok":true,"written_at":5.0,"resolution":{"schema":1,"processes":[]}}'
    notice = {"pid": 7, "why": "caf\u00e9 \u2014 }{,", "deadline": 2e9}
    line = b'{"notice":' + json.dumps(notice).encode() + b"," + resolution[1:]
    # A kernel of an earlier version reads it as one JSON object (its fast path declines).
    assert json.loads(line) == {"notice": notice, **json.loads(resolution)}
    assert agent_client_tcp._split(line) == (None, None)
    found, rest = agent_client_tcp._without_notice(line)
    assert found == notice and rest == resolution
    assert agent_client_tcp._split(rest) == (5.0, b'{"schema":1,"processes":[]}')
    for broken in (b'{"notice":{"pid": 7', b'{"notice":{}}', b'{"notice":[1]]'):
        assert agent_client_tcp._without_notice(broken) == (None, broken)
    assert agent_client_tcp._without_notice(resolution) == (None, resolution)
