"""A kernel's side of the agent's socket, as the contract has it, for tests (run as a script).

    python agent_client.py SOCKET PATCHES [SHARE_DIR]

It computes its own identity claims (PID namespace, PID in it, start ticks, boot id, host
name), then sends one beacon line per entry of PATCHES (a JSON list of dicts: each is merged
into the claims, ``{"pid": ...}`` and ``{"beacon": {...}}`` into the beacon itself; ``[{}]`` is
one honest line; ``[]`` connects and proves nothing) and
prints each answer as a line. With SHARE_DIR it also holds its alive lock and writes its
beacon file there, under the contract's key. Then it prints READY and sleeps until killed.
"""

import fcntl
import json
import os
import signal
import socket
import sys
import time


def claims() -> dict:
    try:
        info = os.stat("/proc/self/ns/pid")
        pid_ns = [info.st_dev, info.st_ino]
    except OSError:
        pid_ns = None
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        ticks = None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = None
    return {
        "pid_ns": pid_ns,
        "pid_in_ns": os.getpid(),
        "start_ticks": ticks,
        "boot_id": boot,
        "hostname": socket.gethostname(),
    }


def beacon(identity: dict) -> dict:
    return {
        "schema": 1,
        "pid": os.getpid(),
        "started_at": time.time() - 1,
        "user": "jovyan",
        "kernel_id": "k-" + socket.gethostname(),
        "notebook": "work.ipynb",
        "mode_requested": "off",
        "mode_in_effect": "off",
        "pool_fraction": 0.0,
        "gpus": {},
        "cell_running": False,
        "last_cell_finished_at": time.time() - 120,
        "hub_user": socket.gethostname(),
        "identity": identity,
    }


def patched(mine: dict, patch: dict) -> dict:
    """The beacon with ``patch``: merged into the claims; ``pid`` and ``beacon`` into it."""
    claimed = {k: v for k, v in patch.items() if k not in ("pid", "beacon")}
    content = {**beacon({**mine, **claimed}), **patch.get("beacon", {})}
    if "pid" in patch:
        content["pid"] = patch["pid"]
    return content


def main() -> None:
    path, patches = sys.argv[1], json.loads(sys.argv[2])
    share = sys.argv[3] if len(sys.argv) > 3 and not sys.argv[3].startswith("-") else ""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # as a kernel does (PID 1 needs it)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    replies = sock.makefile("r")
    mine = claims()
    for patch in patches:
        sock.sendall(json.dumps(patched(mine, patch)).encode() + b"\n")
        print(replies.readline().strip(), flush=True)
    if share:
        ns = mine["pid_ns"]
        key = str(os.getpid()) if ns is None or ns[1] == 0xEFFFFFFC else f"{ns[1]}-{os.getpid()}"
        lock = os.open(
            os.path.join(share, f"jax_nbmem-alive-{key}.lock"), os.O_RDWR | os.O_CREAT, 0o644
        )
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(os.path.join(share, f"jax_nbmem-beacon-{key}.json"), "w") as f:
            json.dump(beacon(mine), f)
        print(json.dumps({"key": key}), flush=True)
    print("READY", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
