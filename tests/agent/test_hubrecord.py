"""The hub's record of a server, read strictly, and the cgroup shapes a systemd unit has.

jax_nbmem/agent/hubrecord.py: what of a JupyterHub user model is taken (a running server's
spawner state: LocalProcessSpawner's PID, SystemdSpawner's unit; its start), and which cgroup
paths are a unit's own (slices only above it: what systemd, as root, makes), read from
``/proc/PID/cgroup`` as cgroup v2, hybrid and v1 hosts write it. The hostile side (real users,
real cgroups, a stand-in hub) is tests/hostile/test_hub_records.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from jax_nbmem.agent.authority import ancestors
from jax_nbmem.agent.facts import FactError, prove_process
from jax_nbmem.agent.hubrecord import (
    ServerRecord,
    prove_record,
    server_records,
    systemd_cgroup,
    unit_holds,
)
from tests.jupyterlab import REPO_ROOT


def _model(**servers) -> dict:
    return {"name": "alice", "servers": servers}


def test_only_running_servers_are_taken_with_what_their_spawner_recorded():
    model = _model(**{
        "": {"url": "/user/alice/", "started": "2026-12-05T20:00:00.500000Z",
             "state": {"pid": 4242}},
        "gpu": {"url": "/user/alice/gpu/", "started": "2026-12-05T20:00:00Z",
                "state": {"unit_name": "jupyter-alice"}},
        "old": {"url": "/user/alice/old/", "stopped": True, "state": {"pid": 7}},
        "nostate": {"url": "/user/alice/nostate/", "started": None},
    })  # fmt: skip
    first, second, third = server_records(model, "alice")
    assert (first.server, first.pid, first.unit, first.has_state) == ("", 4242, None, True)
    assert first.started == pytest.approx(1796500800.5)
    assert (second.server, second.pid, second.unit) == ("gpu", None, "jupyter-alice")
    assert (third.has_state, third.pid, third.started) == (False, None, None)


@pytest.mark.parametrize("state", [{"pid": True}, {"pid": 1}, {"pid": "4242"}, {"pid": -5},
                                   {"unit_name": ""}, {"unit_name": 3}, "not a dict"])  # fmt: skip
def test_a_record_of_another_shape_names_nothing_checkable(state):
    (record,) = server_records(_model(**{"": {"state": state}}), "alice")
    assert record.pid is None and record.unit is None


def test_an_answer_that_is_not_that_users_model_is_refused():
    with pytest.raises(FactError, match="not its model"):
        server_records(_model(), "bob")
    with pytest.raises(FactError, match="not its model"):
        server_records(["alice"], "alice")
    assert server_records({"name": "alice"}, "alice") == []


@pytest.mark.parametrize(
    ("path", "held"),
    [
        ("/system.slice/jupyter-alice.service", True),
        ("/system.slice/jupyter-alice.service/kernels", True),  # below the unit: the unit's
        ("/jupyter.slice/jupyter-users.slice/jupyter-alice.service", True),  # --slice
        (
            "/user.slice/user-1001.slice/user@1001.service/system.slice/jupyter-alice.service",
            False,
        ),  # fmt: skip  (a user's delegated subtree)
        ("/user.slice/user-1001.slice/session-3.scope/jupyter-alice.service", False),
        ("/../system.slice/jupyter-alice.service", False),  # another cgroup namespace's view
        ("/system.slice/jupyter-alice-singleuser.service", False),
        ("/system.slice/docker-abc.scope/jupyter-alice.service", False),
        ("system.slice/jupyter-alice.service", False),
        ("/.slice/jupyter-alice.service", False),
    ],
)
def test_a_units_cgroup_is_its_own_under_slices_only(path, held):
    assert unit_holds(path, "jupyter-alice.service") is held


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("0::/system.slice/jupyter-alice.service\n", "/system.slice/jupyter-alice.service"),
        (
            "12:memory:/x\n1:name=systemd:/system.slice/u.service\n0::/system.slice/u.service\n",
            "/system.slice/u.service",
        ),  # fmt: skip  (hybrid)
        (
            "12:memory:/user.slice\n1:name=systemd:/system.slice/u.service\n",
            "/system.slice/u.service",
        ),  # fmt: skip  (v1: systemd's own hierarchy, no other)
        ("4:memory:/system.slice/u.service\n1:name=systemd:/\n0::/\n", "/"),
        ("4:memory:/system.slice/u.service\n", None),
    ],
)
def test_systemds_hierarchy_is_read_from_proc_pid_cgroup(tmp_path, text, path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(text)
    assert systemd_cgroup(4242, str(tmp_path)) == path
    assert systemd_cgroup(4343, str(tmp_path)) is None


def test_a_record_naming_neither_or_an_odd_unit_proves_nothing():
    me = prove_process(os.getpid())
    bare = ServerRecord("alice", "", None, 0.0, True, None, None)
    with pytest.raises(FactError, match="names neither a PID nor a systemd unit"):
        prove_record(me, (), bare)
    climbing = ServerRecord("alice", "", None, 0.0, True, None, "../user.slice/x")
    with pytest.raises(FactError, match="which is no unit name"):
        prove_record(me, (), climbing)
    not_above = ServerRecord("alice", "", None, 0.0, True, os.getppid(), None)
    with pytest.raises(FactError, match="not one of PID"):
        prove_record(me, (), not_above)


def test_a_pid_record_is_an_ancestor_started_within_the_hubs_start():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kernel = prove_process(child.pid)
        began = psutil.Process(os.getpid()).create_time()
        fresh = ServerRecord("alice", "", None, began - 0.5, True, os.getpid(), None)
        said = prove_record(kernel, ancestors(kernel), fresh)
        assert said.startswith(f"the hub's record of hub user alice's server: its spawner's "
                               f"PID {os.getpid()}, a real ancestor of the same user")  # fmt: skip
        stale = ServerRecord("alice", "", None, began - 3600, True, os.getpid(), None)
        with pytest.raises(FactError, match="started 3600 s after the hub recorded the start"):
            prove_record(kernel, ancestors(kernel), stale)
        early = ServerRecord("alice", "", None, began + 60, True, os.getpid(), None)
        with pytest.raises(FactError, match="started 60 s before the hub recorded the start"):
            prove_record(kernel, ancestors(kernel), early)
    finally:
        child.kill()
        child.wait()


_READ_PLANTED = """
import sys
from jax_nbmem.agent.facts import parent_pid
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.agent.hubrecord import systemd_cgroup
proc = sys.argv[1]
print(systemd_cgroup(4242, proc), parent_pid(4242, proc), HostViewer(proc).start_ticks(4242))
print(systemd_cgroup(4343, proc), parent_pid(4343, proc))
"""


def test_the_proc_readers_share_one_that_never_waits_on_a_fifo_nor_follows_a_link(tmp_path):
    """The cgroup, stat and status readers are one (``read_proc``): a FIFO or a link planted in
    a tree read as ``/proc`` (a container's, a test's) is nothing, never a hang or elsewhere."""
    (tmp_path / "4242").mkdir()
    for name in ("cgroup", "stat", "status"):
        os.mkfifo(tmp_path / "4242" / name)
    (tmp_path / "4343").mkdir()
    for name, text in (
        ("cgroup", "0::/system.slice/jupyter-alice.service\n"),
        ("stat", "4343 (python) S 77 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99\n"),
    ):
        (tmp_path / f"elsewhere-{name}").write_text(text)
        (tmp_path / "4343" / name).symlink_to(tmp_path / f"elsewhere-{name}")
    done = subprocess.run([sys.executable, "-c", _READ_PLANTED, str(tmp_path)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.splitlines() == ["None None None", "None None"]
