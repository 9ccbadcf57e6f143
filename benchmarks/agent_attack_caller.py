"""The processes of benchmarks/agent_attack.py: an attacker's and an honest kernel's (a script).

    python agent_attack_caller.py UID:GID MODE ARGS...

Run by root's Python; it drops to UID:GID first (no supplementary groups), after importing
what it needs (root's standard library may be unreadable to that user). Modes:

- ``sockets N``: holds N TCP sockets (N/2 loopback pairs) in its network namespace.
- ``idle HOST PORT N``: opens N TCP connections to the agent, sends nothing, holds them.
- ``flood HOST PORT WIDTH``: WIDTH connections at a time, each sending one first line (a
  beacon) and closing after its answer, again and again.
- ``unread SOCKET PROCESSES CONNECTIONS``: PROCESSES processes with CONNECTIONS each: every
  connection proves its process, asks for the resolution and never reads it.
- ``kernel SOCKET COUNT``: an honest kernel: COUNT registrations, each a new connection, one
  line and its answer; prints, as JSON, each one's seconds to its answer, the answers' set
  and how many proved it.

Each mode prints READY once set up (``kernel`` prints its figures and exits).
"""

import importlib
import json
import os
import selectors
import socket
import sys
import time

from tests.agent.agent_client import claims, patched


def _drop(user: str) -> None:
    uid, gid = (int(part) for part in user.split(":"))
    importlib.import_module("encodings.idna")  # socket's, lazily: unreadable after the drop
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _ready() -> None:
    print("READY", flush=True)


def _hold_forever() -> None:
    while True:
        time.sleep(3600)


def sockets(count: int) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    held = []
    for _ in range(count // 2):
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        held += [client, server]
    _ready()
    _hold_forever()


def idle(host: str, port: int, count: int) -> None:
    held = []
    for _ in range(count):
        try:
            held.append(socket.create_connection((host, port), timeout=10))
        except OSError:
            continue
    _ready()
    _hold_forever()


def flood(host: str, port: int, width: int) -> None:
    """First lines, WIDTH at a time, each on a new connection, for as long as it runs."""
    line = json.dumps(patched(claims(), {})).encode() + b"\n"
    selector = selectors.DefaultSelector()

    def one() -> None:
        try:
            sock = socket.create_connection((host, port), timeout=10)
            sock.sendall(line)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        except OSError:
            time.sleep(0.01)

    for _ in range(width):
        one()
    _ready()
    while True:
        for key, _ in selector.select(timeout=1):
            selector.unregister(key.fileobj)
            key.fileobj.close()
            one()
        while len(selector.get_map()) < width:
            one()


def unread(path: str, processes: int, connections: int) -> None:
    for _ in range(processes):
        if os.fork() == 0:
            line = json.dumps(patched(claims(), {})).encode() + b"\n"
            held = []
            for _ in range(connections):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
                sock.sendall(line)
                sock.recv(4096)  # proven (or not: either way it then asks and never reads)
                sock.sendall(b'{"request": "resolution"}\n')
                held.append(sock)
            _hold_forever()
    _ready()
    _hold_forever()


def kernel(path: str, count: int) -> None:
    took, answers, proven = [], set(), 0
    for _ in range(count):
        line = json.dumps(patched(claims(), {})).encode() + b"\n"
        began = time.perf_counter()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        try:
            sock.connect(path)
            sock.sendall(line)
            answer = sock.makefile("rb").readline()
            took.append(time.perf_counter() - began)
            said = json.loads(answer) if answer else {"ok": False, "reason": "closed"}
            answers.add("ok" if said.get("ok") else said.get("reason"))
            proven += said.get("ok") is True
        except OSError as error:
            answers.add(f"failed: {error}")
        finally:
            sock.close()
        time.sleep(0.05)  # a kernel registers now and then, not in a loop
    said = {"seconds": took, "answers": sorted(answers), "proven": proven}
    print(json.dumps(said), flush=True)


def main() -> None:
    _drop(sys.argv[1])
    mode, args = sys.argv[2], sys.argv[3:]
    if mode == "sockets":
        sockets(int(args[0]))
    elif mode == "idle":
        idle(args[0], int(args[1]), int(args[2]))
    elif mode == "flood":
        flood(args[0], int(args[1]), int(args[2]))
    elif mode == "unread":
        unread(args[0], int(args[1]), int(args[2]))
    elif mode == "kernel":
        kernel(args[0], int(args[1]))
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
