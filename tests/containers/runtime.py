"""What makes a harness container look like one of Docker's to the host: a cgroup and a name.

Docker puts each container's processes in a cgroup named after its id (``/docker/<id>`` with
the cgroupfs driver, ``/system.slice/docker-<id>.scope`` with systemd's) and keeps its name in
``/var/lib/docker/containers/<id>/config.v2.json``; that is all the node agent reads to name a
container from the host. Here: a cgroup of that shape in the first hierarchy root may write
(cgroup v1's ``pids``, else the v2 tree), and the config file only where no Docker lives
(``/var/lib/docker`` absent: it is made, and removed afterwards); on a real Docker host the
name is left unknown rather than written into Docker's own data.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DockerLook", "docker_look"]

DOCKER_ROOT = Path("/var/lib/docker")
_OURS = ".jax_nbmem-tests"  # marks a /var/lib/docker the tests made (no Docker lives here)
_V1 = Path("/sys/fs/cgroup/pids")
_V2 = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))


@dataclass
class DockerLook:
    """A container's Docker id, its cgroup (``procs``: where its processes go) and its name."""

    id: str
    name: str
    cgroup: Path
    config: Path | None  # the config.v2.json written (None: not written)

    @property
    def procs(self) -> Path:
        return self.cgroup / "cgroup.procs"

    def join(self, pid: int) -> None:
        """Move process ``pid`` into the container's cgroup (its children follow)."""
        self.procs.write_text(f"{pid}\n")

    def remove(self) -> None:
        """Remove the cgroup (once empty) and the config written for it."""
        for _ in range(50):
            try:
                self.cgroup.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # processes still leaving it
                time.sleep(0.1)
        if self.config is not None:
            shutil.rmtree(self.config.parent, ignore_errors=True)
        containers = DOCKER_ROOT / "containers"
        with contextlib.suppress(OSError):
            if sorted(os.listdir(containers)) == [_OURS]:  # the last of ours: leave no trace
                (containers / _OURS).unlink()
                containers.rmdir()
                DOCKER_ROOT.rmdir()


def _cgroup_parent() -> tuple[Path, str] | None:
    """Where a cgroup can be made, and the shape of its name (``{id}`` in it)."""
    if (_V1 / "cgroup.procs").exists() and os.access(_V1, os.W_OK):
        return _V1 / "docker", "{id}"
    for root in _V2:
        if (root / "cgroup.controllers").exists() and os.access(root, os.W_OK):
            return root / "system.slice", "docker-{id}.scope"
    return None


def docker_look(name: str) -> DockerLook | None:
    """A cgroup and a name for container ``name`` as Docker would make them; None: no cgroup."""
    parent = _cgroup_parent()
    if parent is None:
        return None
    folder, shape = parent
    container_id = secrets.token_hex(32)
    cgroup = folder / shape.format(id=container_id)
    try:
        cgroup.mkdir(parents=True)
    except OSError:
        return None
    containers, config = DOCKER_ROOT / "containers", None
    if not DOCKER_ROOT.exists():
        containers.mkdir(parents=True, mode=0o710)
        (containers / _OURS).touch()
    if (containers / _OURS).exists():
        config = containers / container_id / "config.v2.json"
        config.parent.mkdir(mode=0o700)
        config.write_text(json.dumps({"ID": container_id, "Name": f"/{name}"}))
    return DockerLook(container_id, name, cgroup, config)
