"""A publisher file hides no kernel its server did not start and did not write (issue 45).

With ``--defer-to-servers`` the exporter leaves the kernels a Jupyter server says it publishes
to that server. Every DockerSpawner container runs as uid 1000, so mallory (another
container, the same uid) can write a publisher file for bob's kernel, with no identity (the
host-namespace branch of the reader): naming bob's kernel as the "server" (its PID and start,
readable by anyone), her own process, or bob's real server, listing bob's kernel. Only a file
its server holds a lock on is its word, and only processes that server started are deferred:
bob's kernel stays in the exporter's series. Root only (a throwaway user).
"""

import json
import subprocess
import time

import psutil

from jax_nbmem.tenants.publishers import published_pids
from tests.hostile.agents import reachable_share, users
from tests.tenants.test_publishers import wait_for_child

__all__ = ["reachable_share", "users"]  # fixtures


def _claim(share, server: int, pids: list[int], owner, name: str | None = None) -> None:
    path = share / (name or f"jax_nbmem-publisher-{server}.json")
    content = {"schema": 1, "pid": server, "started_at": psutil.Process(server).create_time(),
               "url": "http://server/", "pids": pids, "interval_s": 2.0,
               "written_at": time.time()}  # fmt: skip
    # Written in place (opened with truncation, not renamed over): a lock on it stays.
    code = f"open({str(path)!r}, 'w').write({json.dumps(content)!r})"
    subprocess.run(["python3", "-c", code], user=owner.uid, group=owner.gid, check=True)


def test_a_file_naming_another_container_s_kernel_defers_nothing(users, reachable_share):
    jovyan, _ = users  # the uid every container runs as
    held = reachable_share / "bob-server-claim"
    subprocess.run(["python3", "-c", f"open({str(held)!r}, 'w')"], user=jovyan.uid,
                   group=jovyan.gid, check=True)  # fmt: skip
    # Bob's server holds a lock on its claim (flock(1), as write_claim does) and starts a kernel.
    bob_server = subprocess.Popen(["flock", "--shared", str(held), "sh", "-c", "sleep 60 & wait"],
                                  user=jovyan.uid, group=jovyan.gid)  # fmt: skip
    mallory = subprocess.Popen(["sleep", "60"], user=jovyan.uid, group=jovyan.gid)
    try:
        bob_kernel = wait_for_child(bob_server.pid, "sleep")
        _claim(reachable_share, bob_kernel, [bob_kernel], jovyan)  # the kernel as its own server
        _claim(reachable_share, mallory.pid, [bob_kernel], jovyan)  # her process as its server
        _claim(reachable_share, bob_server.pid, [bob_kernel], jovyan)  # bob's server: no lock
        assert published_pids([str(reachable_share)]) == {}
        # Bob's server's own file, the one it holds: what it started is its to publish.
        (reachable_share / f"jax_nbmem-publisher-{bob_server.pid}.json").unlink()
        _claim(reachable_share, bob_server.pid, [bob_kernel], jovyan, name=held.name)
        held.rename(reachable_share / f"jax_nbmem-publisher-{bob_server.pid}.json")
        assert published_pids([str(reachable_share)]) == {bob_kernel: "http://server/"}
    finally:
        for process in (bob_server, mallory):
            process.kill()
            process.wait()
