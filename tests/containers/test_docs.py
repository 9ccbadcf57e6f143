"""docs/containers.md's DockerSpawner config: what it asks Docker for is what Docker accepts."""

from __future__ import annotations

import re

from traitlets.config import Config

from tests.jupyterlab import REPO_ROOT

DOCS = REPO_ROOT / "docs" / "containers.md"


def dockerspawner_config() -> Config:
    """The ``python`` block of the DockerSpawner section, run as jupyterhub_config.py would be."""
    text = DOCS.read_text()
    section = text[text.index("## DockerSpawner") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "no python block in the DockerSpawner section"
    c = Config()
    exec(compile(block.group(1), str(DOCS), "exec"), {"c": c, "get_config": lambda: c})
    return c


def test_the_share_directory_is_one_host_folder_at_the_same_path_in_every_container():
    c = dockerspawner_config()
    share = c.DockerSpawner.environment["JAX_NBMEM_SHARE_DIR"]
    assert c.DockerSpawner.volumes == {share: share}
    assert c.JupyterHub.spawner_class == "dockerspawner.DockerSpawner"


def test_the_gpus_come_from_the_nvidia_runtime_and_never_the_hosts_pid_namespace():
    import docker

    host_config = dict(dockerspawner_config().DockerSpawner.extra_host_config)
    assert "pid_mode" not in host_config and "privileged" not in host_config
    made = docker.types.HostConfig(version="1.44", **host_config)  # what DockerSpawner passes on
    (request,) = made["DeviceRequests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]  # --gpus all
    assert "PidMode" not in made
