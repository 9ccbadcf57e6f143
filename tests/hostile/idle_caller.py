"""Many idle connections to the node agent's socket, as an attacker holds them (a script).

    python idle_caller.py SOCKET COUNT

Opens COUNT connections and sends nothing; prints ``{"opened": N}`` (those the kernel
accepted), then each connection's first line from the agent within a second, counted as
``{"refused": R, "reasons": [...]}`` (the agent refuses at accept, before any line), then
READY, and holds the rest open until killed.
"""

import json
import select
import socket
import sys
import time


def main() -> None:
    path, count = sys.argv[1], int(sys.argv[2])
    held = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            continue
        held.append(sock)
    print(json.dumps({"opened": len(held)}), flush=True)
    refused, reasons, waiting = 0, set(), list(held)
    deadline = time.monotonic() + 5
    while waiting and time.monotonic() < deadline:
        readable, _, _ = select.select(waiting, [], [], 0.5)
        for sock in readable:
            waiting.remove(sock)
            line = sock.recv(65536).split(b"\n")[0]
            if line:
                refused += 1
                reasons.add(json.loads(line)["reason"])
        if not readable and len(waiting) < len(held):
            break  # the refusals came at once; the rest were let in
    print(json.dumps({"refused": refused, "reasons": sorted(reasons)}), flush=True)
    print("READY", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
