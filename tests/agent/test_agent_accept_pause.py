"""An agent out of descriptors rests its listener and says so at a bounded rate (issue 52).

Before, ``accept`` failing with EMFILE returned at once and the selector fired again at once:
a core spent and a log line each time (1.5 million in 30 s). The agent runs here as a process
of its own, its open-files limit lowered to what it holds; 20 connections wait in its queue.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

from jax_nbmem.agent.accepting import AcceptPause
from tests.jupyterlab import REPO_ROOT
from tests.waiting import wait_for

AGENT = """
import logging, os, resource, sys
logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
from jax_nbmem.agent.server import AgentServer, Registry
agent = AgentServer(sys.argv[1], Registry())
print(agent.start(), flush=True)
sys.stdin.readline()
# Out of files from now on: the limit at what is open (existing descriptors stay).
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) - 1, 4096))
print("lowered", flush=True)
sys.stdin.read()
"""


def test_an_agent_out_of_files_rests_and_logs_its_accept_failures_rarely(tmp_path):
    share = tmp_path / "share"
    share.mkdir(mode=0o755)
    log = tmp_path / "agent.log"
    with open(log, "w") as stderr:
        agent = subprocess.Popen([sys.executable, "-c", AGENT, str(share)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=stderr, text=True,
                                 env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})  # fmt: skip
    held = []
    try:
        path = agent.stdout.readline().strip()
        agent.stdin.write("lower\n")
        agent.stdin.flush()
        assert agent.stdout.readline().strip() == "lowered"
        for _ in range(20):  # in the listener's queue: the agent cannot take them
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            held.append(sock)
        wait_for("the agent out of files", lambda: "accept failed" in log.read_text(), 20)
        time.sleep(3)
        said = log.read_text()
        assert "Too many open files" in said and "resting" in said, said[-500:]
        assert said.count("accept failed") <= 2, said.count("accept failed")
        assert agent.poll() is None
    finally:
        for sock in held:
            sock.close()
        agent.kill()
        agent.wait(20)


class _Listener:
    def fileno(self) -> int:
        return 5


class _Selector:
    def __init__(self) -> None:
        self.keys = {}

    def get_key(self, listener):
        return type("Key", (), {"data": self.keys[listener]})

    def unregister(self, listener) -> None:
        del self.keys[listener]

    def register(self, listener, events, data) -> None:
        self.keys[listener] = data


def test_a_pause_doubles_to_its_most_and_comes_back(caplog):
    pause = AcceptPause(logging.getLogger("jax_nbmem.test"), "agent", first_s=0.01, most_s=0.04)
    selector, listener = _Selector(), _Listener()
    selector.register(listener, 1, "unix")
    with caplog.at_level(logging.WARNING, "jax_nbmem.test"):
        for expected in (0.01, 0.02, 0.04, 0.04):
            pause.failed(selector, listener, OSError(24, "Too many open files"))
            assert listener not in selector.keys and pause.wait_s(1.0) <= expected
            time.sleep(expected)
            pause.resume(selector)
            assert selector.keys[listener] == "unix"
    assert len(caplog.records) == 1 and pause.failures == 4  # said once in 10 s
    pause.accepted()
    pause.failed(selector, listener, OSError(24, "Too many open files"))
    assert pause.wait_s(1.0) <= 0.01


class _OutOfFiles(_Listener):
    def accept(self):
        raise OSError(24, "Too many open files\x1b[2J")  # a terminal escape in what is said


def test_accept_hands_over_a_connection_or_none_and_rests_a_failing_listener(caplog):
    pause = AcceptPause(logging.getLogger("jax_nbmem.test"), "agent", first_s=0.01, most_s=0.04)
    selector = _Selector()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.setblocking(False)
        selector.register(listener, 1, "tcp")
        assert pause.accept(selector, listener) is None  # nothing waits: still listening
        assert selector.keys[listener] == "tcp" and pause.failures == 0
        failing = _OutOfFiles()
        selector.register(failing, 1, "unix")
        with caplog.at_level(logging.WARNING, "jax_nbmem.test"):
            assert pause.accept(selector, failing) is None
        assert failing not in selector.keys and pause.failures == 1
        said = caplog.records[0].getMessage()
        assert "accept failed" in said and "Too many open files" in said and "\x1b" not in said
        with socket.create_connection(listener.getsockname()):
            accepted = pause.accept(selector, listener)
            assert accepted is not None
            sock, address = accepted
            sock.close()
            assert address[0] == "127.0.0.1"
        time.sleep(0.02)
        pause.resume(selector)
        pause.accept(selector, failing)  # the connection before made the rest short again
        assert pause.wait_s(1.0) <= 0.01
