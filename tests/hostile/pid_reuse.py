"""The PID-reuse attack on the node agent, inside a PID namespace of its own (a script, root).

    python pid_reuse.py SHARE MALLORY_UID:GID BOB_UID:GID pidfd|ticks

Run as the namespace's init (``unshare --pid --fork --mount-proc``), so that its PIDs are
this script's to hand out (``/proc/sys/kernel/ns_last_pid``) and the agent, serving here, sees
them as its host PIDs. Mallory proves her process on the agent's socket, hands the socket to
a child and exits; bob's process is made with her PID; the child then sends a line claiming
to be bob's process (his PID, his start, the namespace they share). Prints one JSON line: the
PIDs, what the child was answered (``closed`` when the agent had closed the connection), the
host PIDs proven after it, and bob's start ticks; then exits.
"""

import json
import os
import socket
import sys
import time

from jax_nbmem.agent.server import AgentServer, Registry
from tests.agent.agent_client import claims, patched
from tests.waiting import wait_for


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[19])


def _as(user: str) -> None:
    uid, gid = (int(x) for x in user.split(":"))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _mallory(path: str, user: str, to_driver: int, go: int) -> None:
    """Prove, fork the child that keeps the socket, exit. The child waits for bob's PID."""
    _as(user)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    replies = sock.makefile("r")
    mine = claims()
    sock.sendall(json.dumps(patched(mine, {})).encode() + b"\n")
    proven = json.loads(replies.readline())
    if os.fork() == 0:  # the child: it holds the proven connection
        said = {"proven": proven, "start_ticks": mine["start_ticks"]}
        os.write(to_driver, json.dumps(said).encode() + b"\n")
        bob = int(os.read(go, 64))
        try:
            forged = {"pid_in_ns": bob, "start_ticks": _ticks(bob), "pid": bob}
            sock.sendall(json.dumps(patched(claims(), forged)).encode() + b"\n")
            line = replies.readline()
            answer = json.loads(line) if line else "closed"
        except OSError:
            answer = "closed"
        except BaseException as error:
            answer = {"error": repr(error)}
        os.write(to_driver, json.dumps({"answer": answer}).encode() + b"\n")
        os._exit(0)
    os._exit(0)


def main() -> None:
    share, mallory_user, bob_user, how = sys.argv[1:5]
    agent = AgentServer(share, Registry(), peer_pidfd=how == "pidfd")
    agent.start()
    reports, to_driver = os.pipe()
    go_read, go = os.pipe()
    mallory = os.fork()
    if mallory == 0:
        try:
            _mallory(agent.path, mallory_user, to_driver, go_read)
        except BaseException as error:  # said to the driver, which then fails with it
            os.write(to_driver, json.dumps({"error": repr(error)}).encode() + b"\n")
            os._exit(1)
    reader = os.fdopen(reports)
    first = json.loads(reader.readline())
    if "error" in first:
        sys.exit(f"mallory failed: {first['error']}")
    os.waitpid(mallory, 0)  # she has exited; her child holds the socket
    # A later clock tick (cycling through 32,768 PIDs takes longer than one), then her PID.
    began = first["start_ticks"]
    wait_for("clock ticks after mallory's start", lambda: _ticks_now() > began + 2)
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(mallory - 1))
    bob_waits, bob_go = os.pipe()
    bob = os.fork()
    if bob == 0:
        _as(bob_user)
        os.read(bob_waits, 1)  # lives until the driver says
        os._exit(0)
    os.write(go, str(bob).encode())
    second = json.loads(reader.readline())
    proven = sorted(agent.registry.proven())
    report = {"mallory": mallory, "bob": bob, "first": first["proven"],
              "answer": second["answer"], "proven": proven, "bob_ticks": _ticks(bob)}  # fmt: skip
    print(json.dumps(report), flush=True)
    os.write(bob_go, b"x")
    agent.stop()


def _ticks_now() -> int:
    """Clock ticks since boot now (what a process made now has as its start)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


if __name__ == "__main__":
    main()
