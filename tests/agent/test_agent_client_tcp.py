"""The kernel's TCP client: its address from the downward API's variables, proof, resolution."""

import json
import logging

import pytest

from jax_nbmem.agent.server import AgentServer, Registry
from jax_nbmem.node import agent_client_tcp
from jax_nbmem.node.agent_client_tcp import (
    TcpAgentClient,
    agent_address,
    network_client,
    network_resolution,
    parsed_network_resolution,
)
from tests.agent.agent_client import beacon, claims
from tests.waiting import wait_for


def test_the_address_comes_from_the_pod_s_environment():
    assert agent_address({}) is None
    assert agent_address({"JAX_NBMEM_AGENT_HOST": "10.0.3.7"}) == ("10.0.3.7", 9842)
    assert agent_address({"JAX_NBMEM_AGENT_HOST": "fd00::7", "JAX_NBMEM_AGENT_PORT": "7000"}) == (
        "fd00::7", 7000)  # fmt: skip
    both = {"JAX_NBMEM_AGENT_ADDRESS": "[fd00::9]:9000", "JAX_NBMEM_AGENT_HOST": "10.0.3.7"}
    assert agent_address(both) == ("fd00::9", 9000)  # the whole address wins
    for bad in ({"JAX_NBMEM_AGENT_ADDRESS": "10.0.3.7"},
                {"JAX_NBMEM_AGENT_HOST": "10.0.3.7", "JAX_NBMEM_AGENT_PORT": "http"},
                {"JAX_NBMEM_AGENT_ADDRESS": "h:70000"}):  # fmt: skip
        with pytest.raises(ValueError):
            agent_address(bad)


def test_a_malformed_address_is_logged_and_no_client_made(caplog):
    with caplog.at_level(logging.WARNING, logger="jax_nbmem"):
        assert network_client({"JAX_NBMEM_AGENT_PORT": "x", "JAX_NBMEM_AGENT_HOST": "h"}) is None
    assert "no node agent" in caplog.text
    assert network_client({}) is None
    assert isinstance(network_client({"JAX_NBMEM_AGENT_HOST": "127.0.0.1"}), TcpAgentClient)


WRITTEN = [1000.0]  # when the agent's resolution was written: a test moves it on


def _text_for(pid):
    written_at = WRITTEN[0]
    return written_at, json.dumps({"schema": 1, "written_at": written_at, "for": pid,
                                   "processes": []})  # fmt: skip


@pytest.fixture
def agent():
    server = AgentServer(None, Registry(), tcp=("127.0.0.1", 0), resolution=_text_for)
    server.start()
    yield server
    server.stop()


def test_this_process_is_proven_over_loopback_and_reads_the_resolution_once_per_change(agent):
    import os

    client = TcpAgentClient(("127.0.0.1", agent.tcp_address[1]), resolution_every_s=0.0)
    try:
        client.send(beacon(claims()))
        assert client.proven_pid == os.getpid() and client.last_reason is None
        data, source = network_resolution()
        assert json.loads(data)["for"] == os.getpid()
        assert source == f"the node agent at 127.0.0.1:{agent.tcp_address[1]}"
        parsed = []

        def parse(data, source):
            parsed.append(source)
            return json.loads(data)

        first = parsed_network_resolution(parse)
        assert parsed_network_resolution(parse) is first and len(parsed) == 1
        assert client.written_at == 1000.0
        client.keep_alive(beacon(claims()))  # due again, unchanged: nothing new sent
        assert client.ask_resolution() and parsed_network_resolution(parse) is first
        WRITTEN[0] = 1005.0  # the agent's next pass
        client.keep_alive(beacon(claims()))
        second = parsed_network_resolution(parse)
        assert second is not first and second["written_at"] == 1005.0 and len(parsed) == 2
        assert client.written_at == 1005.0
    finally:
        client.close()
    wait_for("the agent to forget it", lambda: not agent.registry.proven())


def test_a_refused_claim_is_said_and_an_agent_that_restarted_is_registered_with_again(agent):
    port = agent.tcp_address[1]
    client = TcpAgentClient(("127.0.0.1", port))
    client.send(beacon({**claims(), "start_ticks": 1}))
    assert client.proven_pid is None and "start_ticks 1 is not" in client.last_reason
    client.send(beacon(claims()))
    assert client.proven_pid is not None
    agent.stop()
    restarted = AgentServer(None, Registry(), tcp=("127.0.0.1", port), resolution=_text_for)
    restarted.start()
    try:
        client._last_attempt = -agent_client_tcp.RECONNECT_S  # no 5 s wait in a test
        client.keep_alive(beacon(claims()))
        assert client.proven_pid is not None and restarted.registry.proven()
    finally:
        client.close()
        restarted.stop()


def test_no_agent_listening_is_silent_and_tried_again_at_most_every_few_seconds(caplog):
    import socket

    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    client = TcpAgentClient(("127.0.0.1", port))
    with caplog.at_level(logging.INFO, logger="jax_nbmem"):
        client.send(beacon(claims()))
        attempt = client._last_attempt
        client.send(beacon(claims()))
        assert client._last_attempt == attempt  # not again before RECONNECT_S
    assert client.proven_pid is None
    assert caplog.text.count("cannot reach the node agent") == 1
