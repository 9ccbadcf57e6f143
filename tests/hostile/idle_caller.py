"""Many idle connections to the node agent's socket, as an attacker holds them (a script).

    python idle_caller.py SOCKET COUNT PROCESSES

Forks PROCESSES processes (the agent allows a few connections per process), each opening its
share of COUNT connections and sending nothing. Each prints ``{"opened": N}``, then
``{"refused": REASON}`` for each connection the agent refuses (at accept, before any line),
and holds the rest open until killed.
"""

import json
import os
import select
import signal
import socket
import sys


def _say(what: dict) -> None:
    os.write(1, json.dumps(what).encode() + b"\n")  # one write: the processes share stdout


def _hold(path: str, count: int) -> None:
    held = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            continue
        held.append(sock)
    _say({"opened": len(held)})
    while held:
        readable, _, _ = select.select(held, [], [])
        for sock in readable:
            held.remove(sock)
            line = sock.recv(65536).split(b"\n")[0]
            if line:
                _say({"refused": json.loads(line)["reason"]})
            sock.close()
    signal.pause()  # every connection refused: held until killed all the same


def main() -> None:
    path, count, processes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    children = []
    for number in range(processes):
        child = os.fork()
        if child == 0:
            _hold(path, count // processes + (number < count % processes))
            os._exit(0)
        children.append(child)
    for child in children:
        os.waitpid(child, 0)


if __name__ == "__main__":
    main()
