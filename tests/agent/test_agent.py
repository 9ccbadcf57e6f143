"""The node agent's socket: a kernel in a PID namespace is proven by its host PID, forgeries not."""

import json
import os
import socket
import time

import pytest

from jax_nbmem.agent.publish import clean_dead
from jax_nbmem.agent.server import AgentDirError, AgentServer, Registry, prepare_agent_dir
from tests.agent.namespaces import client_args, contained, need_namespaces
from tests.waiting import wait_for


@pytest.fixture
def share(tmp_path):
    folder = tmp_path / "share"
    folder.mkdir()
    folder.chmod(0o1777)
    return folder


@pytest.fixture
def agent(share):
    server = AgentServer(str(share), Registry(), first_line_s=3.0, line_s=1.0)
    server.start()
    yield server
    server.stop()


def test_the_directory_and_socket_are_made_as_the_contract_says(agent, share):
    assert (share / "agent").stat().st_mode & 0o7777 == 0o755
    assert (share / "agent" / "agent.sock").stat().st_mode & 0o777 == 0o666
    agent.stop()
    assert not (share / "agent" / "agent.sock").exists()
    agent.stop()  # a second stop is a no-op


@pytest.mark.parametrize("how", ["symlink", "group-writable", "someone-else-s", "a-file"])
def test_an_unsafe_agent_directory_is_refused_and_left_alone(share, tmp_path, how):
    path = share / "agent"
    if how == "symlink":
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
    elif how == "a-file":
        path.write_text("")
    else:
        path.mkdir()
        path.chmod(0o775 if how == "group-writable" else 0o755)
        if how == "someone-else-s":
            if os.geteuid() != 0:
                pytest.skip("giving a directory to someone else takes root")
            os.chown(path, 4242, 4242)
    before = os.lstat(path)
    with pytest.raises(AgentDirError, match=str(path)) as refused:
        prepare_agent_dir(str(share))
    assert "remove it" in str(refused.value)
    after = os.lstat(path)
    assert (after.st_mode, after.st_uid, after.st_ino) == (before.st_mode, before.st_uid,
                                                           before.st_ino)  # fmt: skip
    assert not os.path.exists(tmp_path / "elsewhere" / "agent.sock")


def test_a_second_agent_on_the_same_directory_is_refused(agent, share):
    with pytest.raises(AgentDirError, match="another agent already listens"):
        AgentServer(str(share), Registry()).start()
    # Its probe connected to the first agent, which lets it go when it sees it closed.
    wait_for("the second agent's probe to be let go", lambda: agent.connections == 0)


def test_a_kernel_in_a_pid_namespace_is_proven_by_its_host_pid(agent, share):
    with contained(client_args(agent.path), hostname="alice-box") as box:
        answer = json.loads(box.line())
        assert answer == {"ok": True, "pid": box.host_pid}  # its PID 1 arrived as the host's
        proven = agent.registry.proven()
        registration = proven[box.host_pid]
        assert registration.view.pid_in_ns == 1 and registration.view.namespaced
        assert (
            registration.beacon.pid == box.host_pid and registration.beacon.hub_user == "alice-box"
        )
        assert registration.content["identity"]["hostname"] == "alice-box"
        assert registration.key == f"{registration.view.pid_ns[1]}-1"


def test_forged_claims_are_refused_with_a_reason(agent):
    with contained(client_args(agent.path), hostname="a") as a:
        assert json.loads(a.line())["ok"]
        ns_a = os.stat(f"/proc/{a.host_pid}/ns/pid")
        forgeries = [
            {"pid_ns": [ns_a.st_dev, ns_a.st_ino]},  # another container's namespace
            {"start_ticks": 12345},  # another start: an earlier process of that PID
            {"pid_in_ns": 2},  # another PID in its namespace
            {"pid": 2},  # a beacon for another PID
            {"boot_id": "00000000-0000-0000-0000-000000000000"},
            {"pid_ns": "nonsense"},
            {},  # then the truth: proven
        ]
        with contained(client_args(agent.path, json.dumps(forgeries)), hostname="b") as b:
            answers = [json.loads(b.line()) for _ in forgeries]
            reasons = [answer.get("reason", "") for answer in answers[:-1]]
            assert "pid_ns" in reasons[0] and "namespace the host sees" in reasons[0]
            assert "start_ticks 12345" in reasons[1]
            assert "pid_in_ns 2" in reasons[2]
            assert "the beacon's pid 2" in reasons[3]
            assert "boot_id" in reasons[4]
            assert "pid_ns is not [device, inode]" in reasons[5]
            assert not any(answer["ok"] for answer in answers[:-1])
            assert answers[-1] == {"ok": True, "pid": b.host_pid}
            assert set(agent.registry.proven()) == {a.host_pid, b.host_pid}
            assert agent.refused == 6


def test_a_killed_kernel_s_registration_and_files_go(agent, share):
    with contained(client_args(agent.path, share_dir=share), hostname="dead") as dead:
        assert json.loads(dead.line())["ok"]
        key = json.loads(dead.line())["key"]
        assert dead.line() == "READY"
        with contained(client_args(agent.path, share_dir=share), hostname="live") as live:
            assert json.loads(live.line())["ok"]
            live_key = json.loads(live.line())["key"]
            assert live.line() == "READY" and live_key != key and live_key.endswith("-1")
            # Beside them: a symlink and a file of someone else's naming, and a dead host PID.
            (share / "jax_nbmem-alive-999999-1.lock").symlink_to(
                share / f"jax_nbmem-alive-{key}.lock"
            )
            (share / "jax_nbmem-notes.json").write_text("{}")
            stale = share / "jax_nbmem-beacon-2147000000.json"
            stale.write_text("{}")
            os.utime(stale, (time.time() - 600, time.time() - 600))
            alive_keys = [r.key for r in agent.registry.proven().values()]
            assert clean_dead(str(share), alive_keys) == [str(stale)]  # nothing alive touched
            dead.kill()
            wait_for("the dead kernel's registration to go",
                     lambda: dead.host_pid not in agent.registry.proven())  # fmt: skip
            assert live.host_pid in agent.registry.proven()
            removed = clean_dead(str(share), [r.key for r in agent.registry.proven().values()])
            gone = [f"jax_nbmem-beacon-{key}.json", f"jax_nbmem-alive-{key}.lock"]
            assert sorted(removed) == sorted(str(share / name) for name in gone)
            left = sorted(p.name for p in share.iterdir())
            assert left == sorted(["agent", "jax_nbmem-alive-999999-1.lock", "jax_nbmem-notes.json",
                                   f"jax_nbmem-alive-{live_key}.lock",
                                   f"jax_nbmem-beacon-{live_key}.json"])  # fmt: skip


def test_a_namespace_without_proc_mounted(agent, tmp_path):
    # /proc left as the host's: /proc/self is still the process itself, its claims hold.
    with contained(client_args(agent.path), mount_proc=False) as box:
        assert json.loads(box.line()) == {"ok": True, "pid": box.host_pid}
    # No /proc at all: it can claim no namespace nor start, and is refused, with the reason.
    with contained(client_args(agent.path), blank_proc=True) as box:
        answer = json.loads(box.line())
        assert not answer["ok"] and "pid_ns is not [device, inode]" in answer["reason"]
        assert box.host_pid not in agent.registry.proven()


def _connect(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    return sock, sock.makefile("rb")


def test_bad_lines_are_refused_and_the_connection_closed(agent):
    for line in (b"[1, 2]\n", b"not json\n", b"[" * 100000 + b"\n", b"x" * (70 * 1024)):
        sock, answers = _connect(agent.path)
        sock.sendall(line)
        answer = json.loads(answers.readline())
        assert answer["ok"] is False and answer["reason"] in (
            "not a JSON object",
            "a line over 64 KiB",
        )
        assert answers.readline() == b""  # closed
        sock.close()
    sock, answers = _connect(agent.path)
    sock.sendall(b'{"schema": 1}\n')  # an object without claims: refused, still connected
    assert "no identity claims" in json.loads(answers.readline())["reason"]
    sock.sendall(b'{"par')  # a line never finished
    assert "unfinished" in json.loads(answers.readline())["reason"]
    sock.close()


def test_connections_are_limited(share):
    server = AgentServer(str(share), Registry(), max_per_pid=2, first_line_s=1.0)
    server.start()
    try:
        held = [_connect(server.path) for _ in range(2)]
        sock, answers = _connect(server.path)
        assert "has 2 connections already" in json.loads(answers.readline())["reason"]
        for _sock, answers in held:  # and whoever proves nothing is let go
            assert "nothing proven after 1 s" in json.loads(answers.readline())["reason"]
    finally:
        server.stop()


def test_a_registration_needs_the_host_to_read_the_namespace(share, monkeypatch):
    need_namespaces()
    from jax_nbmem.agent.hostview import HostViewer

    monkeypatch.setattr(HostViewer, "_pid_ns", staticmethod(
        lambda base: (None, "its PID namespace is unreadable: needs CAP_SYS_PTRACE")))  # fmt: skip
    server = AgentServer(str(share), Registry())
    server.start()
    try:
        with contained(client_args(server.path)) as box:
            answer = json.loads(box.line())
            assert not answer["ok"] and "CAP_SYS_PTRACE" in answer["reason"]
    finally:
        server.stop()
