"""A beacon name taken by another user is not fatal (issue 45 item 3).

Mallory pre-creates ``jax_nbmem-beacon-<pid>.json`` for the PID bob's kernel will have (and,
for good measure, look-alike fallback names of that PID) in the sticky share directory: bob's
kernel cannot replace a file of hers there. It writes its beacon under a fallback name of its
own, unpredictable, which every reader finds and trusts (bob's file, bob's live process), and
mallory's files are never taken for his. The agent's clean-up removes the fallback once bob's
kernel is gone. Root only (real users).
"""

import json
import os
import subprocess
import time

from jax_nbmem.agent.publish import clean_dead
from jax_nbmem.node.beacons import read_beacons
from tests.hostile.conftest import node

__all__ = ["node"]  # a fixture

_KERNEL = """
import json, os, sys, time
import psutil
from jax_nbmem.node.beacons import BeaconWriter
sys.stdin.readline()  # mallory has squatted by now
me = psutil.Process()
facts = {"schema": 1, "pid": me.pid, "started_at": me.create_time(), "user": "bob",
         "kernel_id": "k-bob", "mode_in_effect": "on", "cell_running": False,
         "last_cell_finished_at": time.time() - 30, "gpus": {}}
writer = BeaconWriter(lambda: facts, [sys.argv[1]], agent_socket=None)
writer.agent = None
print(json.dumps({"written": writer.write_now(), "paths": writer.paths,
                  "error": writer.last_error}), flush=True)
sys.stdin.readline()
writer.close()
print("closed", flush=True)
sys.stdin.readline()
"""


def _as_mallory(node, path, content: str) -> None:
    code = f"open({str(path)!r}, 'w').write({content!r})"
    subprocess.run(["python3", "-c", code], user=node.mallory.uid, group=node.mallory.gid,
                   check=True)  # fmt: skip


def test_a_squatted_beacon_name_falls_back_to_one_every_reader_finds(node):
    share = node.share
    kernel = subprocess.Popen(
        [node.python, "-c", _KERNEL, str(share)], user=node.bob.uid, group=node.bob.gid,
        extra_groups=[], env=node.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pid = kernel.pid
        forged = json.dumps({"schema": 1, "pid": pid, "started_at": time.time(), "user": "x"})
        _as_mallory(node, share / f"jax_nbmem-beacon-{pid}.json", forged)
        for suffix in ("0" * 16, "f" * 16):
            _as_mallory(node, share / f"jax_nbmem-beacon-{pid}.{suffix}.json", forged)
        kernel.stdin.write("\n")
        kernel.stdin.flush()
        said = json.loads(kernel.stdout.readline())
        assert said["written"], said
        (path,) = said["paths"]
        assert os.path.basename(path).startswith(f"jax_nbmem-beacon-{pid}.")
        assert os.stat(path).st_uid == node.bob.uid
        found = read_beacons([str(share)], pids=[pid])
        assert found[pid].kernel_id == "k-bob" and found[pid].mode_in_effect == "on"
        assert read_beacons([str(share)])[pid].kernel_id == "k-bob"  # listed, too
        kernel.stdin.write("\n")  # bob's kernel stops: its fallback goes with it
        kernel.stdin.flush()
        assert kernel.stdout.readline().strip() == "closed"
        assert not os.path.exists(path)
    finally:
        kernel.kill()
        kernel.wait()
    # What a kernel that died without its clean-up leaves, the agent's clean-up removes.
    left = share / f"jax_nbmem-beacon-{pid}.{'a' * 16}.json"
    left.write_text("{}")
    os.utime(left, (time.time() - 3600,) * 2)
    assert str(left) in clean_dead(str(share), pid_alive=lambda p: False)
