"""A reader that does not read is dropped, and costs the agent a reference, not its answer
(issue 37 item 3). The node's resolution here is 4 MiB, more than a socket buffers."""

import json
import socket

import pytest

from tests.agent.namespaces import client_args, contained
from tests.hostile.agents import reachable_share, serving
from tests.waiting import wait_for

__all__ = ["reachable_share"]  # a fixture

_BIG = json.dumps({"schema": 1, "processes": [{"pid": n, "pad": "x" * 400} for n in range(10000)]})


def _resolution(pid):
    return 1000.0, _BIG


def _asking(path: str, times: int = 1) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(b'{"request": "resolution"}\n' * times)
    return sock


@pytest.mark.parametrize(
    ("asks", "write_s"),
    [(1, 1.0), (3, 600.0)],  # its answer stalls for write_s; or a third waits behind two
    ids=["asks-once-never-reads", "asks-three-times-unread"],
)
def test_a_reader_that_does_not_read_is_dropped_and_others_are_served(
    reachable_share, asks, write_s
):
    assert len(_BIG) > 4 << 20
    with serving(reachable_share, resolution=_resolution, write_s=write_s) as agent:
        stuck = _asking(agent.path, asks)
        try:
            wait_for("the reader to be dropped", lambda: agent.connections == 0)
            with contained(client_args(agent.path), hostname="bob-box") as box:
                assert json.loads(box.line()) == {"ok": True, "pid": box.host_pid}
        finally:
            stuck.close()


def test_unread_answers_share_the_one_encoded_resolution(reachable_share):
    with serving(reachable_share, resolution=_resolution, write_s=600) as agent:
        readers = [_asking(agent.path) for _ in range(3)]
        try:

            def queued():
                connections = list(agent._connections.values())
                return len(connections) == 3 and all(c.queued for c in connections) and connections

            connections = wait_for("three answers queued", queued)
            buffers = {id(max(c.outbox, key=lambda q: len(q[0]))[0].obj) for c in connections}
            assert len(buffers) == 1  # one 4 MiB answer, referred to three times
            assert all(c.unread() < len(_BIG) for c in connections)  # the socket took some
        finally:
            for sock in readers:
                sock.close()
