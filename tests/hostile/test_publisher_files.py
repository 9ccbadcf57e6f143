"""A publisher file hides no kernel its server did not start (issue 45 item 3).

With ``--defer-to-servers`` the exporter leaves the kernels a Jupyter server says it publishes
to that server. Every DockerSpawner container runs as uid 1000, so mallory (another
container, the same uid) can write a publisher file for bob's kernel: naming bob's kernel as
the "server" (its PID and start, readable by anyone) and listing it, with no identity, which
is the host-namespace branch of the reader. Only processes the named server started are
deferred: bob's kernel stays in the exporter's series. Root only (a throwaway user).
"""

import json
import subprocess
import time

import psutil

from jax_nbmem.tenants.publishers import published_pids
from tests.hostile.agents import reachable_share, users
from tests.tenants.test_publishers import wait_for_child

__all__ = ["reachable_share", "users"]  # fixtures


def _claim(share, server: int, pids: list[int], owner) -> None:
    path = share / f"jax_nbmem-publisher-{server}.json"
    content = {"schema": 1, "pid": server, "started_at": psutil.Process(server).create_time(),
               "url": "http://server/", "pids": pids, "interval_s": 2.0,
               "written_at": time.time()}  # fmt: skip
    subprocess.run(["python3", "-c", f"open({str(path)!r}, 'w').write({json.dumps(content)!r})"],
                   user=owner.uid, group=owner.gid, check=True)  # fmt: skip


def test_a_file_naming_another_container_s_kernel_defers_nothing(users, reachable_share):
    jovyan, _ = users  # the uid every container runs as
    bob_server = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], user=jovyan.uid,
                                  group=jovyan.gid)  # fmt: skip
    mallory = subprocess.Popen(["sleep", "60"], user=jovyan.uid, group=jovyan.gid)
    try:
        bob_kernel = wait_for_child(bob_server.pid)
        _claim(reachable_share, bob_kernel, [bob_kernel], jovyan)  # the kernel as its own server
        _claim(reachable_share, mallory.pid, [bob_kernel], jovyan)  # her process as its server
        assert published_pids([str(reachable_share)]) == {}
        # What bob's server started is its to publish: a file naming it defers its kernel.
        _claim(reachable_share, bob_server.pid, [bob_kernel], jovyan)
        assert published_pids([str(reachable_share)]) == {bob_kernel: "http://server/"}
    finally:
        for process in (bob_server, mallory):
            process.kill()
            process.wait()
