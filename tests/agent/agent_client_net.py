"""A kernel in a pod, reaching the node agent over TCP with the real client (run as a script).

    python agent_client_net.py HOST:PORT PATCHES

It waits until the agent's address answers (the test gives its network namespace an address
after it started), then sends one beacon line per entry of PATCHES with
:class:`~jax_nbmem.node.agent_client_tcp.TcpAgentClient` (as tests/agent/agent_client.py
makes them: each patch merged into its identity claims, ``{"pid": ...}`` and ``{"beacon":
{...}}`` into the beacon) and prints ``{"ok", "pid", "reason"}`` for each; then it asks for
the resolution and prints ``{"resolution": ...}`` (or its reason), then READY, and sleeps.
"""

import json
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from agent_client import claims, patched  # noqa: E402  (beside this file)

from jax_nbmem.node import agent_client_tcp  # noqa: E402


def _wait_for(address: tuple[str, int]) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(address, timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main() -> None:
    os.environ[agent_client_tcp.ENV_AGENT_ADDRESS] = sys.argv[1]
    patches = json.loads(sys.argv[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    client = agent_client_tcp.network_client()
    _wait_for(client.address)
    mine = claims()
    for patch in patches:
        client._last_attempt = -agent_client_tcp.RECONNECT_S  # each patch: a connection now
        client.send(patched(mine, patch))
        said = {"ok": client.proven_pid is not None, "pid": client.proven_pid,
                "reason": client.last_reason}  # fmt: skip
        print(json.dumps(said), flush=True)
    found = agent_client_tcp.network_resolution()
    print(json.dumps({"resolution": json.loads(found[0]) if found else None,
                      "reason": client.resolution_reason}), flush=True)  # fmt: skip
    print("READY", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
