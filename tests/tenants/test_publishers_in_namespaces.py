"""A Jupyter server in a container publishes its kernels; the host's exporter defers to it.

The server is a stand-in: a Python process as PID 1 of a PID namespace of its own that starts
a "kernel" (a child that sleeps) and writes its publisher file with
:func:`jax_nbmem.tenants.publishers.write_claim` every half second, as the server extension
does after each snapshot in a container without the node agent (its kernels' host PIDs
unknown, their PIDs in the container listed). Root only (as CI runs).
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil
import pytest

from jax_nbmem.cli.exporter import Exporter, ExporterSettings
from jax_nbmem.tenants.publishers import published_pids
from tests.agent.namespaces import contained, need_namespaces
from tests.waiting import wait_for

_SERVER = """
import json, subprocess, sys, time
from jax_nbmem.tenants.publishers import write_claim
kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(json.dumps({"kernel": kernel.pid}), flush=True)
while True:
    write_claim([sys.argv[1]], url=sys.argv[2], pids=[], interval_s=0.5,
                pids_in_container=[kernel.pid])
    time.sleep(0.5)
"""


def server(name, share):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    url = f"http://{name}:8888/"
    return contained([sys.executable, "-c", _SERVER, str(share), url], hostname=name, env=env)


def kernel_of(box) -> int:
    """The stand-in's kernel, by host PID."""
    (kernel,) = wait_for("its kernel", lambda: psutil.Process(box.host_pid).children(), 20)
    return kernel.pid


def publisher_file(share) -> dict:
    (path,) = wait_for("its publisher file", lambda: list(share.glob("jax_nbmem-publisher-*")), 20)
    return path.name, json.loads(path.read_text())


@pytest.fixture
def share(tmp_path):
    need_namespaces()
    directory = tmp_path / "share"
    directory.mkdir()
    return directory


def test_the_host_defers_a_container_server_s_own_kernels_and_nothing_forged(
    share, tmp_path, sleeper
):
    with server("alice-box", share) as alice:
        in_box = json.loads(alice.line())["kernel"]  # its kernel's PID in the container
        kernel = kernel_of(alice)
        assert in_box != kernel
        name, content = publisher_file(share)
        assert name == f"jax_nbmem-publisher-{content['identity']['pid_ns'][1]}-1.json"
        # The host finds the server from its identity, and its kernel by PID in the container.
        assert published_pids([str(share)]) == {kernel: "http://alice-box:8888/"}
        exporter = Exporter(
            ExporterSettings(share_dir=str(share), defer_to_servers=True, agent=False)
        )
        assert exporter.take_snapshot().deferred_pids == frozenset({kernel})

        forged = tmp_path / "forged"
        forged.mkdir()

        def believed(changes, name=name) -> dict:
            for old in forged.iterdir():
                old.unlink()
            (forged / name).write_text(json.dumps({**content, "written_at": time.time(),
                                                   **changes}))  # fmt: skip
            return published_pids([str(forged)])

        # A copy word for word: its server holds no lock on it, so it is not its word (issue
        # 45: every container writes as the same uid). What follows is refused all the same.
        assert believed({}) == {}
        # Another start (the namespace's PID 1 restarted, or a guess): not that server.
        ticks = content["identity"]["start_ticks"]
        assert believed({"identity": {**content["identity"], "start_ticks": ticks + 1}}) == {}
        # A host process it did not start (root's sleeper) is not its to hide, nor a host PID
        # that happens to equal its kernel's PID in the container.
        assert believed({"pids": [sleeper, in_box], "pids_in_container": []}) == {}
        # Its name says another server (PID 2 of that namespace) than its content.
        other_name = name.replace("-1.json", "-2.json")
        assert believed({}, name=other_name) == {}
        alice.kill()  # SIGKILL: its file stays, fresh for a little while
        assert (share / name).exists()
        assert published_pids([str(share)]) == {}  # no such server runs: its kernels come back
