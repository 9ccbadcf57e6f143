"""Issue 44 item 1: hub users whose Unix users are named otherwise, proven from the hub's records.

A stand-in hub maps hub users to the stand-in servers of bob and mallory (real Unix users) and
carries, in each server's model, the spawner's record a real hub shows to a token with the
scope ``admin:server_state``: LocalProcessSpawner's ``{"pid"}`` and ``started``, or
SystemdSpawner's ``{"unit_name"}``. Root's ``jax-nbmem shutdown <PID> --yes --hub-url …``:

- stops bob's kernel as the hub user his server's record names (on today's code: refused,
  since his Unix user is not named like his hub user);
- stops nothing for mallory's kernel that claims bob's hub user, nor for one under a PID the
  hub still records for a server that ended (it started long after), nor where her Unix name is
  another person's hub user (on today's code: bob's kernel was stopped), nor with a token that
  sees no record (told which scope it lacks);
- with a systemd unit's record: believes the kernel's cgroup ``system.slice/<unit>.service``
  (made here by root in the cgroup v2 tree, as systemd would), and not a cgroup of the same
  name under a user's delegated ``user@UID.service``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import psutil
import pytest

from jax_nbmem.cli.command import main
from tests.hostile.conftest import HUB_TOKEN, StandInHub, StandInServer
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(180)

BOBS_KERNEL = "b0b0b0b0-bob-kernel"


class RecordsHub(StandInHub):
    """The stand-in hub, whose models of ``records``' users carry the spawner's record."""

    def __init__(self, servers: dict[str, StandInServer], records: dict[str, dict]) -> None:
        self.records = records
        super().__init__(servers)

    def _answer(self, handler, method: str) -> None:
        parts = handler.path.strip("/").split("/")
        asks_user = parts[:3] == ["hub", "api", "users"] and len(parts) == 4
        if method != "GET" or not asks_user or parts[3] not in self.records:
            return super()._answer(handler, method)
        self.requests.append((method, handler.path))
        if handler.headers.get("Authorization") != f"token {HUB_TOKEN}":
            return self._send(handler, 403, {"message": "bad token"})
        server = {"url": f"/user/{parts[3]}/", "stopped": False, **self.records[parts[3]]}
        return self._send(handler, 200, {"name": parts[3], "servers": {"": server}})


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _spawned(server: StandInServer, before_s: float = 0.3) -> dict:
    """LocalProcessSpawner's record of ``server``: its PID, its start a moment before."""
    began = psutil.Process(server.pid).create_time()
    return {"state": {"pid": server.pid}, "started": _iso(began - before_s)}


@contextmanager
def _hub(servers: dict, records: dict) -> Iterator[RecordsHub]:
    hub = RecordsHub(servers, records)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("JUPYTERHUB_API_TOKEN", HUB_TOKEN)
            patch.delenv("JUPYTERHUB_API_URL", raising=False)
            yield hub
    finally:
        hub.close()


def _shutdown(capsys, hub: RecordsHub, node, pid: int) -> tuple[int, str]:
    log = str(node.folder / "admin.log")
    code = main(["shutdown", str(pid), "--yes", "--hub-url", hub.url,
                 "--share-dir", str(node.share), "--log", log])  # fmt: skip
    said = capsys.readouterr()
    return code, said.out + said.err


def _as(hub_user: str, kernel_id: str, **more) -> dict:
    return {"id": kernel_id, "env": {"JUPYTERHUB_USER": hub_user}, **more}


def test_a_kernel_is_its_hub_users_by_the_spawners_pid_and_a_claim_of_it_stops_nothing(
    servers, capsys
):
    hub_bob = f"h{servers.bob.name}"
    bob = servers.server(servers.bob, [_as(hub_bob, BOBS_KERNEL)])
    mallory = servers.server(servers.mallory, [_as(hub_bob, "3a11-claims-bob",
                                                   command_line_id=BOBS_KERNEL)])  # fmt: skip
    hers = mallory.kernels["3a11-claims-bob"]
    with _hub({hub_bob: bob}, {hub_bob: _spawned(bob)}) as hub:
        code, said = _shutdown(capsys, hub, servers, hers)
        assert code == 1 and "nothing done" in said, said
        claim = f"it claims hub user {hub_bob}, but it runs as Unix user {servers.mallory.name}"
        assert claim in said
        record = f"the hub records its server as PID {bob.pid}, which is not one of PID {hers}'s"
        assert f"{record} real ancestors ({mallory.pid}" in said
        assert bob.deletes() == [] and hub.deletes() == []

        code, said = _shutdown(capsys, hub, servers, bob.kernels[BOBS_KERNEL])
        assert code == 0, said
        assert f"through its Jupyter server {hub.url}/user/{hub_bob}/" in said
        assert f"hub user {hub_bob} (Unix user {servers.bob.name})" in said
    assert bob.deletes() == [BOBS_KERNEL]
    wait_for("bob's kernel gone", lambda: not psutil.pid_exists(bob.kernels[BOBS_KERNEL]), 30)
    entry = json.loads((servers.folder / "admin.log").read_text().splitlines()[-1])
    assert (entry["hub_user"], entry["user"], entry["kernel_id"]) == (
        hub_bob, servers.bob.name, BOBS_KERNEL)  # fmt: skip
    assert entry["proven_owner"]["is_hub_user"] is True
    assert f"its spawner's PID {bob.pid}, a real ancestor" in entry["proven_owner"]["source"]
    assert psutil.pid_exists(hers)


def test_a_pid_the_hub_records_for_a_server_that_ended_proves_nothing(servers, capsys):
    # The hub still records hub user h-victim's server as PID P after it ended; P is now
    # mallory's server's (as if reused). Her kernel claims h-victim and names bob's kernel id.
    bob = servers.server(servers.bob, [{"id": BOBS_KERNEL}])
    mallory = servers.server(servers.mallory, [_as("h-victim", "3a11-reused",
                                                   command_line_id=BOBS_KERNEL)])  # fmt: skip
    stale = _spawned(mallory, before_s=3600)
    with _hub({"h-victim": bob}, {"h-victim": stale}) as hub:
        code, said = _shutdown(capsys, hub, servers, mallory.kernels["3a11-reused"])
    assert code == 1 and "nothing done" in said, said
    assert f"PID {mallory.pid} started 3600 s after the hub recorded the start" in said
    assert "another process that was given the same PID" in said
    assert bob.deletes() == [] and hub.deletes() == []


def test_a_unix_user_named_like_another_persons_hub_user_is_not_taken_for_them(servers, capsys):
    # On a hub that maps names, hub user "<mallory's Unix name>" may be someone else: here,
    # the server of that hub user is bob's. Mallory's kernel claims nothing and its command
    # line names bob's kernel. Today's code asked that hub user's server, which stopped bob's.
    bob = servers.server(servers.bob, [{"id": BOBS_KERNEL}])
    mallory = servers.server(servers.mallory, [{"id": "3a11-namesake",
                                                "command_line_id": BOBS_KERNEL}])  # fmt: skip
    namesake = servers.mallory.name
    with _hub({namesake: bob}, {namesake: _spawned(bob)}) as hub:
        code, said = _shutdown(capsys, hub, servers, mallory.kernels["3a11-namesake"])
    assert code == 1 and "nothing done" in said, said
    assert f"the hub's record of hub user {namesake} does not prove it theirs" in said
    assert bob.deletes() == [] and hub.deletes() == []
    assert psutil.pid_exists(bob.kernels[BOBS_KERNEL])


def test_a_token_that_sees_no_record_is_told_the_scope_it_lacks(servers, capsys):
    hub_bob = f"h{servers.bob.name}"
    bob = servers.server(servers.bob, [_as(hub_bob, BOBS_KERNEL)])
    unrecorded = {"started": _spawned(bob)["started"]}  # a token without admin:server_state
    with _hub({hub_bob: bob}, {hub_bob: unrecorded}) as hub:
        code, said = _shutdown(capsys, hub, servers, bob.kernels[BOBS_KERNEL])
    assert code == 1 and "nothing done" in said, said
    assert "only to a token with the scope admin:server_state, which this one lacks" in said
    assert bob.deletes() == [] and hub.deletes() == []


# ---- SystemdSpawner: the unit's cgroup ----------------------------------------------------


def _cgroup2_root() -> Path | None:
    """Where the cgroup v2 tree is mounted (pure v2: /sys/fs/cgroup; hybrid: .../unified)."""
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            fields = line.split()
            kind = fields[fields.index("-") + 1]
            if kind == "cgroup2" and " rw," in f" {fields[5]},":
                return Path(fields[4])
    return None


@contextmanager
def _cgroups() -> Iterator:
    """``place(path, *pids)``: each PID into the cgroup ``path`` (made as needed), undone after."""
    root = _cgroup2_root()
    if root is None or not os.access(root / "cgroup.procs", os.W_OK):
        pytest.skip("needs a writable cgroup v2 tree (root, and cgroup2 mounted read-write)")
    made: list[Path] = []
    moved: list[int] = []

    def place(path: str, *pids: int) -> None:
        folder = root
        for part in path.strip("/").split("/"):
            folder = folder / part
            if not folder.exists():
                folder.mkdir()
                made.append(folder)
        for pid in pids:
            (folder / "cgroup.procs").write_text(str(pid))
            moved.append(pid)

    try:
        yield place
    finally:
        for pid in moved:
            try:
                (root / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass  # it ended
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass


def test_a_systemd_units_cgroup_proves_its_hub_user_and_a_users_lookalike_is_not(servers, capsys):
    hub_bob = f"h{servers.bob.name}"
    unit = f"jupyter-{hub_bob}-singleuser"
    bob = servers.server(servers.bob, [_as(hub_bob, BOBS_KERNEL)])
    mallory = servers.server(servers.mallory, [_as(hub_bob, "3a11-lookalike",
                                                   command_line_id=BOBS_KERNEL)])  # fmt: skip
    hers = mallory.kernels["3a11-lookalike"]
    uid = servers.mallory.uid
    record = {"state": {"unit_name": unit}, "started": _iso(0)}  # the unit decides, not the time
    with _cgroups() as place, _hub({hub_bob: bob}, {hub_bob: record}) as hub:
        # What systemd delegates to mallory, with a cgroup of the unit's name made in it.
        place(f"user.slice/user-{uid}.slice/user@{uid}.service/system.slice/{unit}.service", hers)
        code, said = _shutdown(capsys, hub, servers, hers)
        assert code == 1 and "nothing done" in said, said
        refused = f"the hub records its server as the systemd unit {unit}.service, but PID {hers}"
        cgroup = f"/user.slice/user-{uid}.slice/user@{uid}.service/system.slice/{unit}.service"
        assert f"{refused} runs in the cgroup {cgroup}, which is not that unit's" in said
        assert bob.deletes() == [] and hub.deletes() == []

        # Bob's server and kernel in the unit's own cgroup, as systemd-run starts them.
        place(f"system.slice/{unit}.service", bob.pid, bob.kernels[BOBS_KERNEL])
        code, said = _shutdown(capsys, hub, servers, bob.kernels[BOBS_KERNEL])
        assert code == 0, said
        assert f"through its Jupyter server {hub.url}/user/{hub_bob}/" in said
    assert bob.deletes() == [BOBS_KERNEL] and psutil.pid_exists(hers)
    entry = json.loads((servers.folder / "admin.log").read_text().splitlines()[-1])
    assert entry["proven_owner"]["source"].endswith(
        f"its systemd unit {unit}.service, whose cgroup /system.slice/{unit}.service it runs in"
    )
