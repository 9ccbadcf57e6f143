"""A cgroup in a user's delegated subtree never takes another container's name (issue 45).

Mallory moves a process of hers into ``docker-<bob's container id>.scope`` under her own
``user@UID.service`` (systemd delegates that subtree to her). Bob's container, of the same id,
runs under root's Docker (``/system.slice``) and is named ``jupyter-bob`` from root's store.
Mallory's cgroup may only ever name a container of hers, from her own store, as her claim:
never bob's name, whichever the agent looked at first. A synthetic /proc (the cgroup paths as
the kernel writes them), root's and mallory's real stores. Root only (a throwaway user).
"""

import json
import os

import pytest

from jax_nbmem.agent.cgroups import ContainerNames
from jax_nbmem.agent.hostview import HostViewer
from tests.agent.test_hostview import fake_process
from tests.hostile.agents import users

__all__ = ["users"]  # a fixture

BOBS_ID = "d0" * 32


def _store(root, name: str, owner=None) -> None:
    folder = root / "containers" / BOBS_ID
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.v2.json").write_text(json.dumps({"Name": f"/{name}"}))
    if owner is not None:
        for path in (root, root.parent, root.parent.parent, root / "containers", folder,
                     folder / "config.v2.json"):  # fmt: skip
            os.chown(path, owner.uid, owner.gid)


@pytest.mark.parametrize("first", ["bob", "mallory"])
def test_a_delegated_cgroup_names_only_its_user_s_own_container(tmp_path, users, first):
    mallory, _bob = users
    _store(tmp_path / "docker", "jupyter-bob")  # root's Docker
    _store(mallory.home / ".local" / "share" / "docker", "mallory-box", owner=mallory)
    proc = tmp_path / "proc"
    fake_process(proc, 500, nspids=(500, 1), ticks=5,
                 cgroup=f"0::/system.slice/docker-{BOBS_ID}.scope\n")  # fmt: skip
    delegated = f"/user.slice/user-{mallory.uid}.slice/user@{mallory.uid}.service"
    fake_process(proc, 600, nspids=(600, 1), ticks=6, uid=mallory.uid,
                 cgroup=f"0::{delegated}/app.slice/docker-{BOBS_ID}.scope\n")  # fmt: skip
    viewer = HostViewer(str(proc), names=ContainerNames(docker_root=str(tmp_path / "docker")))
    order = [500, 600] if first == "bob" else [600, 500]
    seen = {pid: viewer.view(pid).container for pid in order}
    assert (seen[500].name, seen[500].rootless_uid) == ("jupyter-bob", None)
    assert seen[600].name == "mallory-box"  # her own store's name: her claim
    assert seen[600].rootless_uid == mallory.uid
