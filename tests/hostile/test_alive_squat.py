"""An alive-lock name taken by another user is not bob's liveness (issue 45, its known gap).

Mallory makes, first, ``jax_nbmem-alive-<key>.lock`` for the key bob's kernel will have, in the
sticky share directory: a file she holds locked for ever (bob's kernel would look alive after
its end, and the agent would never clear what it left) with look-alikes of the fallback names
besides, a private file of hers (bob's kernel
could not open it), a FIFO (opening it could hang), a link to root's secrets, a folder. Bob's
kernel takes none of them: it holds a lock of its own under an unpredictable name and says
why. Readers (the agent's clean-up, the claims ``status`` reads from other PID namespaces)
count only a lock of the beacon's owner: mallory's never makes bob's kernel alive, and what bob's
dead kernel left is cleared while she still holds hers. On the host and in a PID namespace (as
a container runs a kernel). Root only (real users).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time

import psutil
import pytest

from jax_nbmem.agent.publish import clean_dead
from jax_nbmem.node.alive import FALLBACK_LOCK, lock_path
from jax_nbmem.node.identity import own_identity
from jax_nbmem.node.neighbours import alive_by_lock, read_claims
from tests.hostile.conftest import node

__all__ = ["node"]  # a fixture

_KERNEL = """
import json, sys, time
import psutil
from jax_nbmem.node.beacons import BeaconWriter
from jax_nbmem.node.identity import beacon_key, own_identity
print(beacon_key(), flush=True)
sys.stdin.readline()  # mallory has squatted by now
me = psutil.Process()
facts = {"schema": 1, "pid": me.pid, "started_at": me.create_time(), "user": "bob",
         "kernel_id": "k-bob", "mode_in_effect": "on", "cell_running": False,
         "last_cell_finished_at": time.time() - 30, "gpus": {}, "identity": own_identity()}
writer = BeaconWriter(lambda: facts, [sys.argv[1]], agent_socket=None)
writer.agent = None
print(json.dumps({"written": writer.write_now(), "beacon": writer.paths,
                  "held": writer.alive.held, "problems": writer.alive.problems}), flush=True)
sys.stdin.read()
"""

# Mallory holds her file at the lock's name locked for as long as she likes.
_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


class _Squat:
    """What mallory made at one lock name, and the process that holds it, if any."""

    def __init__(self, node, path: str, kind: str) -> None:
        self.holder = None
        as_mallory = {"user": node.mallory.uid, "group": node.mallory.gid, "extra_groups": []}
        if kind == "held":
            self.holder = subprocess.Popen([node.python, "-c", _HOLDER, path], env=node.env,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           text=True, **as_mallory)  # fmt: skip
            assert self.holder.stdout.readline().strip() == "held"
            # And look-alikes of the fallback names, more than a reader asks: never crowding
            # out the owner's own.
            key = os.path.basename(path).removeprefix("jax_nbmem-alive-").removesuffix(".lock")
            alike = [f"{path[: -len('.lock')]}.{n:016x}.lock" for n in range(20)]
            made = "; ".join(f"os.close(os.open({a!r}, os.O_CREAT | os.O_WRONLY, 0o644))"
                             for a in alike)  # fmt: skip
            subprocess.run(["python3", "-c", f"import os; {made}"], check=True, **as_mallory)
            assert key and all(os.path.exists(a) for a in alike)
            return
        make = {
            "private": f"os.close(os.open({path!r}, os.O_CREAT | os.O_WRONLY, 0o600))",
            "fifo": f"os.mkfifo({path!r})",
            "symlink": f"os.symlink('/etc/shadow', {path!r})",
            "folder": f"os.mkdir({path!r})",
        }[kind]
        subprocess.run(["python3", "-c", f"import os; {make}"], check=True, **as_mallory)

    def close(self) -> None:
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()


def _kernel(node, namespace: bool) -> subprocess.Popen:
    argv = [node.python, "-c", _KERNEL, str(node.share)]
    if namespace:  # root makes the namespace, as a container runtime does; bob runs in it
        argv = [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "setpriv",
            f"--reuid={node.bob.uid}",
            f"--regid={node.bob.gid}",
            "--clear-groups",
            *argv,
        ]
        who = {}
    else:
        who = {"user": node.bob.uid, "group": node.bob.gid, "extra_groups": []}
    return subprocess.Popen(argv, env=node.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, **who)  # fmt: skip


def _kill(process: subprocess.Popen) -> None:
    """Kill a kernel and, for one in a namespace, the namespace's init (setpriv's change of
    UID cleared what --kill-child asked)."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        child.kill()
    process.kill()
    process.wait()


def _squatted_kernels(node, kinds, namespace=False):
    """One kernel of bob's per kind, each with its lock name taken by mallory: (key, said)."""
    kernels, squats, found = [], [], []
    try:
        for kind in kinds:
            kernel = _kernel(node, namespace)
            kernels.append(kernel)
            key = kernel.stdout.readline().strip()
            assert key, kind
            squats.append(_Squat(node, lock_path(str(node.share), key), kind))
            kernel.stdin.write("\n")
            kernel.stdin.flush()
            found.append((key, json.loads(kernel.stdout.readline())))
        return kernels, squats, found
    except BaseException:
        for process in kernels:
            _kill(process)
        for squat in squats:
            squat.close()
        raise


def _assert_held_its_own(node, kind, key, said) -> str:
    assert said["written"], (kind, said)
    (held,) = said["held"]
    match = FALLBACK_LOCK.fullmatch(os.path.basename(held))
    assert match and match.group(1) == key, (kind, held)
    info = os.lstat(held)
    assert stat.S_ISREG(info.st_mode) and info.st_uid == node.bob.uid, kind
    assert "held as" in said["problems"][lock_path(str(node.share), key)], (kind, said)
    return held


def test_a_squatted_lock_name_is_never_a_kernel_alive_on_the_host(node):
    kinds = ["held", "private", "fifo", "symlink", "folder"]
    started = time.monotonic()
    kernels, squats, found = _squatted_kernels(node, kinds)
    try:
        assert time.monotonic() - started < 60  # the FIFO hung nobody
        share = str(node.share)
        pairs = zip(kinds, found, strict=True)
        helds = [_assert_held_its_own(node, kind, *one) for kind, one in pairs]
        beacons = [said["beacon"][0] for _, said in found]
        for key, _ in found:  # alive, by bob's own lock only
            assert alive_by_lock([share], key, node.bob.uid) is True
        clean_dead(share)  # nothing of bob's live kernels goes
        assert all(os.path.exists(path) for path in beacons + helds)
        for kernel in kernels:  # SIGKILL: their files stay, their locks go
            _kill(kernel)
        for key, _ in found:  # mallory still holds hers at the first one's name
            assert alive_by_lock([share], key, node.bob.uid) is False
        removed = clean_dead(share, pid_alive=lambda pid: False)
        assert set(beacons + helds) <= set(removed), removed
        assert squats[0].holder.poll() is None  # hers is hers: still held, still there
        assert os.path.exists(lock_path(share, found[0][0]))
        assert os.path.exists("/etc/shadow")
    finally:
        for kernel in kernels:
            _kill(kernel)
        for squat in squats:
            squat.close()


@pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("setpriv") is None,
                    reason="needs unshare and setpriv for PID namespaces (as CI has)")  # fmt: skip
def test_a_squatted_lock_name_is_never_a_container_kernel_alive(node):
    share = str(node.share)
    kernels, squats, found = _squatted_kernels(node, ["held"], namespace=True)
    ((key, said),) = found
    try:
        assert "-" in key  # <ns inode>-<pid>: a kernel of another PID namespace
        held = _assert_held_its_own(node, "held", key, said)
        host = own_identity()
        claims = read_claims([share], host)
        assert [c.kernel_id for c in claims if c.pid == int(key.split("-")[1])] == ["k-bob"]
        _kill(kernels[0])  # bob's kernel, its namespace's init
        deadline = time.monotonic() + 20
        while alive_by_lock([share], key, node.bob.uid) is not False:
            assert time.monotonic() < deadline, "bob's kernel never ended"
            time.sleep(0.2)
        assert read_claims([share], host) == []  # mallory's lock does not keep it alive
        removed = clean_dead(share)
        assert {said["beacon"][0], held} <= set(removed), removed
        assert squats[0].holder.poll() is None
    finally:
        for kernel in kernels:
            _kill(kernel)
        for squat in squats:
            squat.close()
