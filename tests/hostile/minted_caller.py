"""Connections to the node agent from PID namespaces a user mints herself (a script).

    python minted_caller.py SOCKET NAMESPACES BEACON_BYTES

Run as an ordinary user (as_user.py). For each of NAMESPACES it makes a user and a PID
namespace of its own (``unshare(CLONE_NEWUSER | CLONE_NEWPID)``, what ``unshare --user
--pid`` does: no privilege needed) and, as PID 1 there, connects to SOCKET. With
BEACON_BYTES 0 it sends nothing; else it proves itself honestly, with a beacon padded to about
BEACON_BYTES (under a key the contract does not have). Each prints one line: ``{"refused":
REASON}``, ``{"proven": HOST_PID}`` or ``{"opened": true}`` (nothing sent, not refused within
a second), then holds its connection until killed.
"""

import ctypes
import json
import os
import select
import signal
import socket
import sys
import time

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000


def _say(what: dict) -> None:
    os.write(1, json.dumps(what).encode() + b"\n")  # one write: the processes share stdout


def _claims() -> dict:
    info = os.stat("/proc/self/ns/pid")  # the host's /proc: it still names this process
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rpartition(")")[2].split()[19])
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return {"pid_ns": [info.st_dev, info.st_ino], "pid_in_ns": os.getpid(),
            "start_ticks": ticks, "boot_id": boot, "hostname": socket.gethostname()}  # fmt: skip


def _beacon(size: int) -> bytes:
    content = {"schema": 1, "pid": os.getpid(), "started_at": time.time() - 1,
               "user": "jovyan", "kernel_id": f"minted-{os.getpid()}", "notebook": "flood.ipynb",
               "mode_requested": "off", "mode_in_effect": "off", "pool_fraction": 0.0,
               "gpus": {}, "cell_running": False, "last_cell_finished_at": time.time() - 60,
               "identity": _claims()}  # fmt: skip
    content["padding"] = "x" * max(0, size - len(json.dumps(content)) - 16)
    return json.dumps(content).encode() + b"\n"


def _inside(path: str, size: int) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        if size:
            sock.sendall(_beacon(size))
        readable, _, _ = select.select([sock], [], [], 30 if size else 1)
        line = sock.recv(65536).split(b"\n")[0] if readable else b""
    except OSError as error:
        _say({"refused": f"connect: {error}"})
        signal.pause()
    if not line:
        _say({"opened": True})
    else:
        said = json.loads(line)
        _say({"proven": said["pid"]} if said.get("ok") else {"refused": said.get("reason")})
    signal.pause()  # held (or refused) until killed


def main() -> None:
    path, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(count):
        child = os.fork()
        if child:
            os.waitpid(child, 0)  # the maker exits once its namespace has its first process
            continue
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWPID) != 0:
            _say({"refused": f"unshare: {os.strerror(ctypes.get_errno())}"})
            os._exit(1)
        if os.fork() == 0:  # PID 1 of the new namespace
            _inside(path, size)
        os._exit(0)
    signal.pause()


if __name__ == "__main__":
    main()
