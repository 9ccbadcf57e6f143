"""Issue 12: every kernel says what it knows of itself, and readers trust only what they can check.

The first tests write and read beacons in this process with real files and real processes; the
rest run real kernels on the simulated GPU: two of this user's kernels seen from a third and from
the CLI, a kernel seen by another user (a throwaway account, when the suite runs as root as CI
does), a live panel left idle, and the file's removal at unload and at exit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from jax_nbmem import simgpu
from jax_nbmem.gpu.nvml import GpuMemory, GpuProcess
from jax_nbmem.node import beacons as beacons_module
from jax_nbmem.node.beacons import SCHEMA, BeaconWriter, read_beacons
from jax_nbmem.simgpu import GIB
from jax_nbmem.tenants.advice import warnings_for
from jax_nbmem.tenants.attribution import attribute
from jax_nbmem.tenants.status import format_status
from jax_nbmem.tenants.verdicts import ProcessInfo
from tests.kernels import execute, running_kernel
from tests.waiting import wait_for

TOTAL = 80 * GIB
UUID = "GPU-12121212-3434-5656-7878-909090909090"
PREALLOCATED = int(0.75 * TOTAL) + (300 << 20)  # 75% plus the CUDA context


def _facts(pid: int | None = None, **changes) -> dict:
    pid = os.getpid() if pid is None else pid
    facts = {
        "schema": SCHEMA,
        "pid": pid,
        "started_at": psutil.Process(pid).create_time(),
        "user": psutil.Process(pid).username(),
        "kernel_id": None,
        "notebook": "/home/ada/mine.ipynb",
        "mode_requested": "off",
        "mode_in_effect": "off",
        "pool_fraction": 0.0,
        "gpus": {UUID: {"bytes_in_use": 5 * GIB, "pool_bytes": 0, "bytes_limit": TOTAL}},
        "cell_running": False,
        "last_cell_finished_at": time.time() - 30,
        "jax": "0.10.2",
        "jaxlib": "0.10.2",
        "jax_nbmem": "0.1",
        "variables": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    }
    facts.update(changes)
    return facts


def _write_file(path: Path, content) -> None:
    path.write_text(content if isinstance(content, str) else json.dumps(content))


# --- Writing and reading, in this process ------------------------------------------------------


def test_a_beacon_is_written_world_readable_rewritten_only_on_change_and_removed(tmp_path):
    facts = _facts()
    writer = BeaconWriter(lambda: dict(facts), str(tmp_path))
    assert writer.write_now()
    path = Path(writer.path)
    assert path.name == f"jax_nbmem-beacon-{os.getpid()}.json"
    assert path.stat().st_mode & 0o777 == 0o644
    first = json.loads(path.read_text())
    assert first["mode_in_effect"] == "off" and first["written_at"] > 0
    assert not writer.write_now()  # nothing changed: not rewritten
    facts["cell_running"] = True
    assert writer.write_now()
    assert json.loads(path.read_text())["cell_running"] is True
    alive = f"jax_nbmem-alive-{os.getpid()}.lock"  # held for the kernel's life
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive, path.name]  # no partial file

    (beacon,) = read_beacons([str(tmp_path)]).values()
    assert (beacon.pid, beacon.mode, beacon.cell_running) == (os.getpid(), "off", True)
    assert beacon.idle_s() == 0.0

    writer.close()
    assert not path.exists() and not (tmp_path / alive).exists()
    writer.close()  # a second close is a no-op


def test_the_thread_keeps_it_current_within_a_second(tmp_path):
    facts = _facts(cell_running=True)
    writer = BeaconWriter(lambda: dict(facts), str(tmp_path))
    writer.start()
    try:
        wait_for("the beacon", lambda: Path(writer.path).exists(), 5)
        facts["cell_running"] = False
        wait_for(
            "the cell's end in the beacon",
            lambda: json.loads(Path(writer.path).read_text())["cell_running"] is False,
            3,
        )
    finally:
        writer.close()
    assert not Path(writer.path).exists()


def test_a_writer_that_cannot_write_says_why_and_raises_nothing(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    writer = BeaconWriter(_facts, str(blocker / "beacons"))
    assert writer.write_now() is False
    assert "cannot write" in writer.last_error

    def broken():
        raise RuntimeError("facts exploded")

    writer = BeaconWriter(broken, str(tmp_path))
    assert writer.write_now() is False and "facts exploded" in writer.last_error


def test_readers_skip_what_they_cannot_trust_and_never_fail(tmp_path):
    good = tmp_path / f"jax_nbmem-beacon-{os.getpid()}.json"
    _write_file(good, {**_facts(), "written_at": time.time()})
    # A dead kernel's beacon: the process is gone.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_started = psutil.Process(gone.pid).create_time()
    gone.wait()
    dead = {**_facts(), "pid": gone.pid, "started_at": gone_started, "written_at": time.time()}
    _write_file(tmp_path / f"jax_nbmem-beacon-{gone.pid}.json", dead)
    # A recycled PID: a live process, but not the one that wrote it (another start time).
    parent = psutil.Process().ppid()
    recycled = {**_facts(parent), "started_at": psutil.Process(parent).create_time() - 3600}
    _write_file(tmp_path / f"jax_nbmem-beacon-{parent}.json", {**recycled, "written_at": 1.0})
    _write_file(tmp_path / "jax_nbmem-beacon-malformed.json", "{not json")
    _write_file(tmp_path / "jax_nbmem-beacon-list.json", "[1, 2]")
    _write_file(tmp_path / "jax_nbmem-beacon-schema.json", {**_facts(), "schema": 99})
    _write_file(tmp_path / "jax_nbmem-beacon-pid.json", {**_facts(), "pid": "1; rm -rf /"})
    _write_file(tmp_path / "jax_nbmem-beacon-huge.json", " " * (200 * 1024) + "{}")
    (tmp_path / "jax_nbmem-beacon-link.json").symlink_to(good)
    (tmp_path / "jax_nbmem-beacon-dir.json").mkdir()
    fifo = tmp_path / "jax_nbmem-beacon-fifo.json"
    os.mkfifo(fifo)  # opened without blocking, and not a regular file: skipped
    _write_file(tmp_path / "unrelated.json", {**_facts(), "notebook": "/other.ipynb"})

    found = read_beacons([str(tmp_path), str(tmp_path / "missing"), str(good)])
    assert list(found) == [os.getpid()]
    assert found[os.getpid()].path == str(good)
    assert found[os.getpid()].notebook == "/home/ada/mine.ipynb"


def test_odd_values_inside_a_beacon_are_dropped_not_believed(tmp_path):
    odd = _facts(
        notebook=7,
        gpus={UUID: {"bytes_in_use": -1, "pool_bytes": True, "bytes_limit": "lots"}, "x": 3},
        last_cell_finished_at="yesterday",
        pool_fraction="0.75",
    )
    path = tmp_path / f"jax_nbmem-beacon-{os.getpid()}.json"
    _write_file(path, {**odd, "written_at": time.time()})
    (beacon,) = read_beacons([str(tmp_path)]).values()
    assert beacon.notebook is None and beacon.pool_fraction is None
    assert beacon.gpus == {UUID: {"bytes_in_use": None, "pool_bytes": None, "bytes_limit": None}}
    assert beacon.idle_s() is None
    for said, read in (([UUID], (UUID,)), ([UUID, 7], None), (UUID, None), ([""], None)):
        _write_file(path, {**odd, "pool_gpus": said, "written_at": time.time()})
        (beacon,) = read_beacons([str(tmp_path)]).values()
        assert beacon.pool_gpus == read, said


def test_the_newest_of_two_beacons_for_one_process_wins(tmp_path):
    old, new = tmp_path / "a", tmp_path / "b"
    old.mkdir(), new.mkdir()
    _write_file(old / f"jax_nbmem-beacon-{os.getpid()}.json", {**_facts(), "written_at": 10.0})
    _write_file(
        new / f"jax_nbmem-beacon-{os.getpid()}.json",
        {**_facts(notebook="/renamed.ipynb"), "written_at": 20.0},
    )
    assert read_beacons([str(old), str(new)])[os.getpid()].notebook == "/renamed.ipynb"
    assert read_beacons([str(new), str(old)])[os.getpid()].notebook == "/renamed.ipynb"


def test_a_beacon_owned_by_another_user_cannot_speak_for_a_process(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    path = tmp_path / f"jax_nbmem-beacon-{os.getpid()}.json"
    _write_file(path, {**_facts(), "written_at": time.time()})
    assert os.getpid() in read_beacons([str(tmp_path)])
    os.chown(path, 65534, 65534)  # nobody claims to be this (root's) process
    assert read_beacons([str(tmp_path)]) == {}


# --- Verdicts from beacons (real Beacon objects, a made-up GPU) --------------------------------


def _gpu(free: int, index: int = 0) -> GpuMemory:
    return GpuMemory(index, UUID, "Simulated H200", TOTAL, TOTAL - free, free)


def _foreign_kernel(pid: int, user: str = "grace") -> ProcessInfo:
    # What another user's kernel looks like from here: its environment and maps unreadable.
    return ProcessInfo(
        pid, "kernel", user=user, cmdline="python -m ipykernel_launcher -f kernel-7.json",
        kernel_id="7", reason="environment not readable (another user's process)",
    )  # fmt: skip


def test_a_beacon_outranks_the_start_environment_and_carries_mode_pool_and_idleness(tmp_path):
    pid = os.getpid()
    _write_file(tmp_path / f"jax_nbmem-beacon-{pid}.json", {**_facts(), "written_at": time.time()})
    beacons = read_beacons([str(tmp_path)])
    process = GpuProcess(pid, 0, PREALLOCATED)
    # Our own start environment says "default mode": without the beacon, a preallocating JAX.
    (tenant,) = attribute(
        [process], [_gpu(TOTAL - PREALLOCATED)], own_pid=-1, environ={}, beacons=beacons,
        sessions={},
    )  # fmt: skip
    assert (tenant.source, tenant.mode, tenant.preallocated) == ("beacon", "off", False)
    assert tenant.jax["bytes_in_use"] == 5 * GIB and tenant.jax["pool_bytes"] == 0
    assert 29 <= tenant.idle_s <= 60 and tenant.idle_source == "beacon"
    assert tenant.notebook == "/home/ada/mine.ipynb"
    assert tenant.to_dict()["source"] == "beacon"

    pool = {UUID: {"bytes_in_use": GIB, "pool_bytes": int(0.75 * TOTAL)}}
    pooled = _facts(mode_in_effect="on", pool_fraction=0.75, gpus=pool)
    _write_file(tmp_path / f"jax_nbmem-beacon-{pid}.json", {**pooled, "written_at": time.time()})
    (tenant,) = attribute(
        [process], [_gpu(TOTAL - PREALLOCATED)], own_pid=-1, environ={},
        beacons=read_beacons([str(tmp_path)]), sessions={},
    )  # fmt: skip
    assert (tenant.source, tenant.mode, tenant.preallocated) == ("beacon", "on", True)


def test_another_users_kernel_the_size_of_a_pool_is_probably_preallocation(monkeypatch):
    from jax_nbmem.tenants import advice, attribution

    pid = os.getppid()  # a live PID, here standing for another user's kernel
    monkeypatch.setattr(attribution, "inspect_process", lambda p, **_: _foreign_kernel(p))
    monkeypatch.setattr(advice, "may_stop_others", lambda: False)  # seen as a user, not root
    for used in (PREALLOCATED, int(0.75 * 0.9 * TOTAL) + (300 << 20)):  # default, then late
        gpu = _gpu(TOTAL - used - GIB)
        (tenant,) = attribute([GpuProcess(pid, 0, used)], [gpu], own_pid=1, beacons={})
        assert (tenant.source, tenant.preallocated) == ("memory size", True), used
        (warning,) = warnings_for([tenant], [gpu], own_backend_started=True)
        assert warning.kind == "blocking-preallocation" and warning.pid == pid
        message = warning.message
        assert "probably JAX preallocation" in message and "user grace" in message
        assert f"PID {pid}" in message and "ipykernel_launcher" in message and "GiB" in message
        assert "Ask its owner (grace)" in message and "administrator" in message
    # A size that is no pool says nothing of preallocation.
    (tenant,) = attribute([GpuProcess(pid, 0, 20 * GIB)], [_gpu(59 * GIB)], own_pid=1, beacons={})
    assert (tenant.source, tenant.preallocated) == ("unknown", None)
    text = format_status(
        {"nvml": {"available": True}, "gpus": [], "processes": [tenant.to_dict()], "warnings": []}
    )
    assert "preallocated" not in text


# --- Real kernels on the simulated GPU ---------------------------------------------------------


def _kernel_pid(manager) -> int:
    return manager.provisioner.process.pid


def _beacon_of(pid: int, dirs, **expect):
    def check():
        beacon = read_beacons(dirs).get(pid)
        if beacon is None or any(getattr(beacon, k) != v for k, v in expect.items()):
            return None
        return beacon

    return wait_for(f"beacon of {pid} with {expect}", check, 20)


def _cli_status(env, *args):
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "status", "--json", *args],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


START_JAX = "import jax.numpy as jnp; jnp.ones(1).block_until_ready()"


@pytest.mark.kernel
def test_two_kernels_seen_from_a_third_and_from_the_cli(simgpu_env, sim_state):
    runtime = [os.environ["JUPYTER_RUNTIME_DIR"]]
    lean_env = {**simgpu_env, "JPY_SESSION_NAME": "/home/ada/lean.ipynb"}
    hog_env = {**simgpu_env, "JPY_SESSION_NAME": "/home/ada/hog.ipynb"}
    with running_kernel(env=lean_env) as (lean, lean_client), \
            running_kernel(env=hog_env) as (hog, hog_client):  # fmt: skip
        # A: the product's own workflow, `%jaxalloc off` in its first cell; its start
        # environment still says JAX's default mode.
        out, error = execute(lean_client, "%load_ext jax_nbmem\n%jaxalloc off")
        assert error is None, out
        # B: JAX's default, preallocating mode.
        out, error = execute(hog_client, "%load_ext jax_nbmem")
        assert error is None, out
        for client in (lean_client, hog_client):
            out, error = execute(client, START_JAX)
            assert error is None, out
        lean_pid, hog_pid = _kernel_pid(lean), _kernel_pid(hog)
        _beacon_of(lean_pid, runtime, mode_in_effect="off")
        _beacon_of(hog_pid, runtime, mode_in_effect="on")
        # A holds 75% of GPU 0 with its arrays; B's pool is 75% of GPU 1.
        sim_state.gpu(0, total=TOTAL, uuid=UUID).gpu(1, total=TOTAL)
        sim_state.process(0, lean_pid, PREALLOCATED).process(1, hog_pid, PREALLOCATED).write()

        report = _cli_status(simgpu_env)
        by_pid = {p["pid"]: p for p in report["processes"]}
        lean_seen, hog_seen = by_pid[lean_pid], by_pid[hog_pid]
        assert (lean_seen["source"], lean_seen["mode"], lean_seen["preallocated"]) == (
            "beacon", "off", False
        )  # fmt: skip
        assert lean_seen["mode_at_start"] == "on"  # what /proc alone would have believed
        assert (hog_seen["source"], hog_seen["mode"], hog_seen["preallocated"]) == (
            "beacon", "on", True
        )  # fmt: skip
        assert hog_seen["idle_source"] == "beacon" and hog_seen["idle_s"] >= 0
        (warning,) = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
        assert warning["pid"] == hog_pid and "hog.ipynb" in warning["message"]
        assert "as the kernel itself reports" in warning["message"]

        with running_kernel(env=simgpu_env) as (_, third):
            text, error = execute(third, "%load_ext jax_nbmem\n%jaxmem status")
            assert error is None, text
            rows = [line.split() for line in text.splitlines() if line.strip().startswith("pid ")]
            lines = {row[1]: " ".join(row) for row in rows}
            assert "[the kernel's own report]" in lines[str(lean_pid)]
            assert "preallocated" not in lines[str(lean_pid)]
            assert "(mode: off)" in lines[str(lean_pid)]
            assert "[preallocated]" in lines[str(hog_pid)]
            (blocking,) = [w for w in text.splitlines() if "[blocking-preallocation]" in w]
            assert "hog.ipynb" in blocking and "lean.ipynb" not in blocking


@pytest.fixture
def open_folder(simgpu_lib):
    """A folder the other user can reach (pytest's own are root's alone): state, shared dir."""
    folder = Path(tempfile.mkdtemp(prefix="jax_nbmem-two-users-"))
    folder.chmod(0o755)
    shared = folder / "share"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky and world-writable, like /tmp
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# The other user's view: a child that imports everything (and loads the simulated NVML) as root,
# whose home it can no longer read, then becomes the other user and asks for the status. It can
# also forge a beacon that claims a process it does not own.
_AS_OTHER_USER = textwrap.dedent(
    """
    import json, os, sys, time
    import psutil
    from jax_nbmem.tenants import status
    from jax_nbmem.node.beacons import SCHEMA
    uid, gid, share, forge = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    status.collect(share_dir=share or None)  # every lazy import done while root's files open
    os.setgroups([]); os.setgid(gid); os.setuid(uid)
    if forge:
        claim = {"schema": SCHEMA, "pid": forge, "started_at": psutil.Process(forge).create_time(),
                 "notebook": "/forged.ipynb", "mode_in_effect": "off", "pool_fraction": 0.0,
                 "written_at": time.time() + 3600}
        with open(os.path.join(share, "jax_nbmem-beacon-forged.json"), "w") as out:
            json.dump(claim, out)
    report = status.collect(share_dir=share or None)
    print(json.dumps({"report": report, "uid": os.getuid()}))
    """
)


def _seen_by(other_user, env, share: str = "", forge: int = 0) -> dict:
    _, uid, gid = other_user
    done = subprocess.run(
        [sys.executable, "-c", _AS_OTHER_USER, str(uid), str(gid), share, str(forge)],
        capture_output=True, text=True, env=env, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["uid"] == uid
    return answer["report"]


@pytest.mark.kernel
def test_another_users_kernel_by_its_size_by_its_beacon_and_never_by_a_forgery(
    other_user, open_folder, simgpu_lib
):
    share = str(open_folder / "share")
    state = simgpu.SimState(open_folder / "gpu.state")
    env = simgpu.env_for_subprocess(simgpu_lib.parent, state.path)
    reader_env = {**env, "HOME": str(open_folder), "JUPYTER_RUNTIME_DIR": str(open_folder / "rt")}
    kernel_env = {**env, "JPY_SESSION_NAME": "/root/big.ipynb", "JAX_NBMEM_SHARE_DIR": share}
    with running_kernel(env=kernel_env) as (manager, client):
        out, error = execute(client, f"%load_ext jax_nbmem\n%jaxalloc off\n{START_JAX}")
        assert error is None, out
        pid = _kernel_pid(manager)
        _beacon_of(pid, [share], mode_in_effect="off")
        state.gpu(0, total=TOTAL, uuid=UUID).process(0, pid, PREALLOCATED).write()

        # Without the shared directory: all the other user has is NVML's bytes and the
        # command line. 75% of the GPU is probably a preallocated pool, and it is said so.
        report = _seen_by(other_user, reader_env)
        (seen,) = [p for p in report["processes"] if p["pid"] == pid]
        assert (seen["source"], seen["preallocated"], seen["user"]) == ("memory size", True, "root")
        (warning,) = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
        assert warning["pid"] == pid and "probably JAX preallocation" in warning["message"]
        assert "user root" in warning["message"] and "ipykernel" in warning["message"]
        assert "Ask its owner (root)" in warning["message"]

        # With it, the kernel's own word: its mode is off, its memory its arrays'.
        report = _seen_by(other_user, reader_env, share=share)
        (seen,) = [p for p in report["processes"] if p["pid"] == pid]
        assert (seen["source"], seen["mode"], seen["preallocated"]) == ("beacon", "off", False)
        assert seen["notebook"] == "/root/big.ipynb"
        assert not [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]

        # The other user writes a beacon claiming root's kernel: not believed.
        report = _seen_by(other_user, reader_env, share=share, forge=pid)
        (seen,) = [p for p in report["processes"] if p["pid"] == pid]
        assert seen["source"] == "beacon" and seen["notebook"] == "/root/big.ipynb"
        forged = Path(share) / "jax_nbmem-beacon-forged.json"
        assert forged.stat().st_uid == other_user[1]
        # Without root's own beacon, the forgery still does not count: judged by size again.
        execute(client, "%unload_ext jax_nbmem")
        wait_for(
            "the beacon gone",
            lambda: not (Path(share) / f"jax_nbmem-beacon-{pid}.json").exists(),
            10,
        )
        report = _seen_by(other_user, reader_env, share=share, forge=pid)
        (seen,) = [p for p in report["processes"] if p["pid"] == pid]
        assert (seen["source"], seen["preallocated"]) == ("memory size", True)
        assert seen["notebook"] is None


@pytest.mark.kernel
def test_a_live_panel_left_idle_is_idle_and_its_beacon_goes_at_unload_and_exit(
    simgpu_env, sim_state
):
    runtime = os.environ["JUPYTER_RUNTIME_DIR"]
    env = {**simgpu_env, "JPY_SESSION_NAME": "/home/ada/panel.ipynb"}
    with running_kernel(env=env) as (manager, client):
        out, error = execute(client, "%load_ext jax_nbmem\n%jaxmem")  # the live panel
        assert error is None, out
        pid = _kernel_pid(manager)
        path = Path(runtime) / f"jax_nbmem-beacon-{pid}.json"
        _beacon_of(pid, [runtime], cell_running=False)
        sim_state.gpu(0, total=TOTAL, uuid=UUID).process(0, pid, 2 * GIB).write()
        finished = time.time()
        # Ten idle seconds, with comm traffic the whole time, as a live widget makes.
        while time.time() - finished < 10.5:
            client.comm_info()
            time.sleep(0.5)
        report = _cli_status(simgpu_env)
        (seen,) = [p for p in report["processes"] if p["pid"] == pid]
        assert seen["idle_source"] == "beacon" and seen["idle_s"] >= 10, seen
        assert "idle" in format_status(report)

        out, error = execute(client, "%unload_ext jax_nbmem")
        assert error is None, out
        wait_for("beacon removed at unload", lambda: not path.exists(), 5)
        execute(client, "%load_ext jax_nbmem")
        wait_for("beacon back after reload", path.exists, 10)
        manager.shutdown_kernel(now=False)  # the kernel exits as it would from the menu
        wait_for("beacon removed at exit", lambda: not path.exists(), 10)
    assert beacons_module.read_beacons([runtime]).get(pid) is None


def test_a_beacon_goes_to_both_directories_and_one_unwritable_costs_only_that_one(tmp_path):
    shared, blocked = tmp_path / "shared", tmp_path / "file"
    blocked.write_text("")
    writer = BeaconWriter(_facts, [str(tmp_path / "runtime"), str(shared), str(blocked / "x")])
    assert writer.write_now()
    assert (tmp_path / "runtime" / Path(writer.path).name).exists()
    assert (shared / Path(writer.path).name).exists()
    assert "cannot write" in writer.last_error and str(blocked) in writer.last_error
    writer.close()
    assert list(shared.iterdir()) == [] and list((tmp_path / "runtime").iterdir()) == []


_WAIT_FOR_BEACON = (
    "import glob, os, time\n"
    "for _ in range(50):\n"
    "    found = sorted(glob.glob(os.path.join({folder!r}, 'jax_nbmem-beacon-*.json')))\n"
    "    if found: break\n"
    "    time.sleep(0.1)\n"
    "print(found == [os.path.join({folder!r}, f'jax_nbmem-beacon-{{os.getpid()}}.json')])"
)


def test_the_shared_directory_from_config_or_environment_and_beacons_off(tmp_path):
    from tests.ipython_session import run_cells

    shared = tmp_path / "shared"
    out = run_cells(
        [
            f"get_ipython().config.JaxNbMem.share_dir = {str(shared)!r}",
            "%load_ext jax_nbmem",
            _WAIT_FOR_BEACON.format(folder=str(shared)),
        ],
        env={"JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")},
    )
    assert out[2].stdout.strip() == "True", out
    out = run_cells(
        ["%load_ext jax_nbmem", _WAIT_FOR_BEACON.format(folder=str(shared / "env"))],
        env={"JAX_NBMEM_SHARE_DIR": str(shared / "env")},
    )
    assert out[1].stdout.strip() == "True", out
    off = run_cells(
        [
            "get_ipython().config.JaxNbMem.beacon = False",
            "%load_ext jax_nbmem",
            "import time; time.sleep(1.5)",
        ],
        env={"JAX_NBMEM_SHARE_DIR": str(shared / "off")},
    )
    assert all(cell.error is None for cell in off), off
    assert not (shared / "off").exists()


def test_a_kernel_its_server_names_keeps_the_servers_name_over_its_beacons(tmp_path, monkeypatch):
    from jax_nbmem.tenants import attribution

    pid = os.getpid()
    # JupyterLab starts a kernel with the notebook's full path ($JPY_SESSION_NAME), which its
    # beacon repeats; the server shows it relative to its root, as everything else does.
    full = "/srv/course/work/a.ipynb"
    _write_file(
        tmp_path / f"jax_nbmem-beacon-{pid}.json",
        {**_facts(notebook=full), "written_at": time.time()},
    )
    served = ProcessInfo(
        pid, "kernel", user="root", kernel_id="k1", notebook=full, notebook_shown="work/a.ipynb",
        server_url="http://127.0.0.1:8888/",
    )  # fmt: skip
    monkeypatch.setattr(attribution, "inspect_process", lambda p, **_: served)
    beacons = read_beacons([str(tmp_path)])
    process = GpuProcess(pid, 0, 2 * GIB)
    (tenant,) = attribute([process], [_gpu(TOTAL - 2 * GIB)], own_pid=-1, beacons=beacons)
    assert tenant.source == "beacon" and tenant.mode == "off"
    assert (tenant.notebook, tenant.notebook_shown) == (full, "work/a.ipynb")
    # Without a server (VS Code, a kernel started by hand) the beacon's name is all there is.
    alone = ProcessInfo(pid, "kernel", user="root")
    monkeypatch.setattr(attribution, "inspect_process", lambda p, **_: alone)
    (tenant,) = attribute([process], [_gpu(TOTAL - 2 * GIB)], own_pid=-1, beacons=beacons)
    assert tenant.notebook == full and tenant.notebook_shown == full
