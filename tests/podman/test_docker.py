"""Issue 39 with Docker (Debian's docker.io): DockerSpawner's shape, one user's container.

``dockerd`` runs here as root with vfs storage and neither bridge nor iptables (conftest);
Carol's ``carol.ipynb`` (``jupyter-carol``) runs in the default mode and holds 60 GiB of an
80 GiB simulated GPU, as uid 1000, the share directory at its own path, no host PID
namespace; the node agent is ``jax-nbmem exporter --share-dir S`` on the host.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.containers.scenario import resolved
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(600)
GiB = 1 << 30


def test_the_agent_proves_the_kernel_in_dockers_container_by_its_id(docker_scenario):
    node, _, carol = docker_scenario
    carol.run("%load_ext jax_nbmem")
    carol.run("import jax.numpy as jnp\nx = jnp.ones((1024, 1024))\nx.block_until_ready()")
    wait_for("carol's pool on the GPU", lambda: node.listed().get(carol.pid, 0) >= 60 * GiB)
    content = wait_for("carol proven", lambda: resolved(node.share_dir, carol.pid))
    (entry,) = [e for e in content["processes"] if e["pid"] == carol.pid]
    assert entry["pid_in_container"] == carol.pid_in_container > 1
    assert entry["container"]["runtime"] == "docker" and entry["container"]["id"] == carol.id
    ids = carol.runtime("ps", "--no-trunc", "--format", "{{.ID}}").stdout.split()
    assert carol.id in ids
    assert entry["kernel"]["hub_user"] == "carol"
    # Docker's name is read from /var/lib/docker/containers/<id>/config.v2.json; this dockerd's
    # data root is the test's own, so the agent has no name and says why.
    assert entry["container"]["name"] is None and entry["container"]["name_reason"], entry


def test_in_dockers_container_status_advises_the_pid_there(docker_scenario):
    node, _, carol = docker_scenario
    wait_for("carol proven", lambda: resolved(node.share_dir, carol.pid))
    cli = [node.python, "-m", "jax_nbmem.cli"]
    done = carol.exec(*cli, "status")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if "[blocking-preallocation]" in line]
    assert f"jax-nbmem shutdown {carol.pid_in_container} --yes`, its PID in this container" in line
    dry = carol.exec(*cli, "shutdown", str(carol.pid_in_container), "--dry-run")
    assert dry.returncode == 0 and "not in this PID namespace" not in dry.stdout + dry.stderr
    report = json.loads(carol.exec(*cli, "status", "--json").stdout)
    assert report["agent"]["state"] == "fresh"
    (row,) = [row for row in report["processes"] if row["pid"] == carol.pid]
    assert row["pid_in_container"] == carol.pid_in_container and row["hub_user"] == "carol"
    assert os.stat(f"/proc/{carol.pid}/ns/pid").st_ino != os.stat("/proc/self/ns/pid").st_ino
