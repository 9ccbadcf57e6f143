"""The alive lock (liveness across PID namespaces) and the node agent's client, on their own."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading

from jax_nbmem.node import agent_client
from jax_nbmem.node.agent_client import AgentClient
from jax_nbmem.node.alive import AliveLock, fallback_locks, lock_alive, lock_path
from jax_nbmem.node.identity import beacon_key, own_identity, start_ticks


def test_identity_is_read_once_and_names_the_beacon_by_namespace():
    identity = own_identity()
    assert identity["pid_in_ns"] == os.getpid()
    assert identity["start_ticks"] == start_ticks(f"/proc/{os.getpid()}/stat")
    assert beacon_key(identity) == str(os.getpid())  # the host's namespace: as before
    other = {**identity, "pid_ns": [4, 4026532999], "pid_in_ns": 1}
    assert beacon_key(other) == "4026532999-1"
    assert beacon_key({**identity, "pid_ns": None}) == str(os.getpid())  # unreadable: the PID


def test_start_ticks_of_a_command_name_with_spaces_and_parentheses(tmp_path):
    stat = tmp_path / "stat"
    fields = " ".join(str(n) for n in range(3, 53))
    stat.write_text(f"42 (a) b) (c) {fields}")
    assert start_ticks(str(stat)) == 22  # field 22, whatever the name holds
    stat.write_text("garbage")
    assert start_ticks(str(stat)) is None


def test_a_lock_tells_alive_until_its_holder_dies(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        f"import sys, time; sys.path.insert(0, {os.getcwd()!r})\n"
        "from jax_nbmem.node.alive import AliveLock\n"
        f"AliveLock([{str(tmp_path)!r}], 'k').hold(); print('held', flush=True); time.sleep(60)"
    )], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lock_alive(str(tmp_path), "k") is True
        holder.kill()
        holder.wait()
        assert lock_alive(str(tmp_path), "k") is False  # SIGKILL: the file stays, the lock goes
        assert os.path.exists(lock_path(str(tmp_path), "k"))
    finally:
        holder.kill()
    assert lock_alive(str(tmp_path), "missing") is None


def test_what_is_no_lock_file_tells_nothing(tmp_path):
    os.mkfifo(lock_path(str(tmp_path), "fifo"))
    os.symlink("/etc/passwd", lock_path(str(tmp_path), "link"))
    assert lock_alive(str(tmp_path), "fifo") is None
    assert lock_alive(str(tmp_path), "link") is None
    for key, why in (("fifo", "not a regular file"), ("link", "symbolic links")):
        held = AliveLock([str(tmp_path)], key)
        held.hold()  # a name no lock's: the kernel holds an unpredictable one of its own
        (path,) = held.held
        assert os.path.basename(path).startswith(f"jax_nbmem-alive-{key}.") and held.paths == [path]
        said = held.problems[lock_path(str(tmp_path), key)]
        assert why in said and "held as" in said
        held.hold()  # held: nothing more made
        assert held.held == [path] and len(os.listdir(tmp_path)) == 3
        held.release()
        assert not os.path.exists(path) and os.path.lexists(lock_path(str(tmp_path), key))


def test_a_lock_file_left_by_another_user_is_not_taken_for_ours(tmp_path, other_user):
    _, uid, gid = other_user
    path = lock_path(str(tmp_path), "77")
    with open(path, "w"):
        pass
    os.chown(path, uid, gid)
    os.chmod(path, 0o644)
    lock = AliveLock([str(tmp_path)], "77")
    lock.hold()
    (held,) = lock.held
    assert held != path and f"owned by uid {uid}" in lock.problems[path]
    assert lock_alive(str(tmp_path), "77", owner=os.geteuid()) is None  # only hers at its name
    assert lock_alive(str(tmp_path), "77", owner=uid) is False  # hers, and nobody holds it
    fallbacks = fallback_locks(str(tmp_path))["77"]
    assert fallbacks == [os.path.basename(held)]
    assert lock_alive(str(tmp_path), "77", owner=os.geteuid(), fallbacks=fallbacks) is True
    lock.release()
    lock.release()  # a second release is a no-op
    assert not os.path.exists(held) and os.path.exists(path)  # hers is not ours to remove


class Agent:
    """A socket server that answers each line with ``reply(line)`` (bytes, or None to hang up)."""

    def __init__(self, path, reply) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen()
        self.lines = []

        def serve() -> None:
            while True:
                try:
                    conn, _ = self.server.accept()
                except OSError:
                    return
                with conn, conn.makefile("rb") as lines:
                    for line in lines:
                        self.lines.append(json.loads(line))
                        answer = reply(line)
                        if answer is None:
                            break
                        conn.sendall(answer)

        threading.Thread(target=serve, daemon=True).start()

    def close(self) -> None:
        self.server.close()


def test_no_agent_socket_is_no_agent_silently(tmp_path, caplog):
    client = AgentClient(str(tmp_path / "agent" / "agent.sock"))
    with caplog.at_level(logging.INFO, logger="jax_nbmem"):
        client.send({"pid": 1})
    assert client.proven_pid is None and not caplog.records


def test_the_agent_answer_is_kept_and_refusals_logged_once(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(agent_client, "RECONNECT_S", 0.0)
    answers = iter([b'{"ok": true, "pid": 4242}\n', b'{"ok": false, "reason": "ns differs"}\n',
                    b'{"ok": false, "reason": "ns differs"}\n', b"not json\n"])  # fmt: skip
    agent = Agent(str(tmp_path / "agent.sock"), lambda line: next(answers, None))
    client = AgentClient(str(tmp_path / "agent.sock"))
    try:
        with caplog.at_level(logging.INFO, logger="jax_nbmem"):
            client.send({"pid": 1})
            assert client.proven_pid == 4242
            client.send({"pid": 1})
            client.send({"pid": 1})
            assert client.proven_pid is None and client.last_reason == "ns differs"
            client.send({"pid": 1})  # an answer that is no JSON: the connection is dropped
        refusals = [r for r in caplog.records if "ns differs" in r.getMessage()]
        assert len(refusals) == 1  # said once, never raised
        assert client._sock is None and len(agent.lines) == 4
        client.send({"huge": "x" * 70000})  # over 64 KiB: not sent at all
        assert len(agent.lines) == 4
    finally:
        client.close()
        agent.close()
