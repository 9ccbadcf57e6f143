"""The share directory: where every face finds it, and what anyone leaves in it harms nobody.

One order in every face: ``--share-dir``, ``$JAX_NBMEM_SHARE_DIR``, the face's setting, the
face's default (none for kernels and servers; for root's commands ``/var/tmp/jax_nbmem`` where
it is a real directory: docs/containers.md; deploy/jax-nbmem-exporter.tmpfiles). The
commands run in a mount namespace of their own whose ``/var/tmp`` is a fresh tmpfs (root, as
CI runs), so the documented folder is there or not whatever this machine has.

Issue 24: what anyone leaves in the shared beacon directory crashes, slows and misleads nobody.
Any user can write any file into a shared, world-writable directory, named like a beacon or
not. A reader skips every malformed beacon whatever its shape (a fuzz over many shapes, each
through the whole status: reading, attribution, warnings, the text, the JSON, the metrics), and
opens only the beacons of the processes it looks at (counted with Python's audit hooks: which
files of the directory are opened, and whether it is listed at all).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from jax_nbmem.gpu.nvml import GpuMemory, GpuProcess
from jax_nbmem.metrics.metrics import Snapshot, metric_families
from jax_nbmem.node.beacons import SCHEMA, read_beacons
from jax_nbmem.node.sharedir import DEFAULT_SHARE_DIR, ShareDir, agent_not_consulted, find_share_dir
from jax_nbmem.simgpu import GIB
from jax_nbmem.tenants.advice import oom_diagnosis, warnings_for
from jax_nbmem.tenants.attribution import attribute
from jax_nbmem.tenants.status import collect, format_status
from tests.jupyterlab import REPO_ROOT

TOTAL = 80 * GIB
UUID = "GPU-24242424-2424-2424-2424-242424242424"
PREALLOCATED = int(0.75 * TOTAL) + (300 << 20)
DEEP = 5000


def _facts(pid: int, **changes) -> dict:
    process = psutil.Process(pid)
    facts = {
        "schema": SCHEMA,
        "pid": pid,
        "started_at": process.create_time(),
        "user": process.username(),
        "kernel_id": "k-24",
        "notebook": "/home/ada/mine.ipynb",
        "mode_requested": "off",
        "mode_in_effect": "off",
        "mode_reason": None,
        "pool_fraction": 0.0,
        "gpus": {UUID: {"bytes_in_use": 5 * GIB, "pool_bytes": 0, "bytes_limit": TOTAL}},
        "cell_running": False,
        "last_cell_finished_at": time.time() - 30,
        "written_at": time.time(),
        "jax": "0.10.2",
        "jaxlib": "0.10.2",
        "jax_nbmem": "0.1",
        "variables": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    }
    facts.update(changes)
    return facts


# Values no beacon writer writes, as JSON text: nesting deeper than the parser recurses,
# numbers beyond a float or a 64-bit count, non-finite numbers, lone surrogates, controls,
# every wrong type, and text longer than any field.
HOSTILE_VALUES = [
    "[" * DEEP + "]" * DEEP,
    '{"a": ' * DEEP + "1" + "}" * DEEP,
    "[" * 100 + '{"x": 1}' + "]" * 100,
    "1" + "0" * 400,
    "-1" + "0" * 400,
    str(2**63),
    str(2**64 + 1),
    "-1",
    "1e308",
    "-1e308",
    "1e999",
    "NaN",
    "Infinity",
    "-Infinity",
    "0.5",
    "true",
    "false",
    "null",
    '""',
    '"\\ud800"',
    '"abc\\udfff"',
    '"\\u202e\\u001b[31mred"',
    json.dumps("x" * 5000),
    "[]",
    "{}",
    "[1, 2, 3]",
    '{"a": "b"}',
    '{"x": {"y": [1, {"z": null}]}}',
    '"0.75"',
    '"1; rm -rf /"',
]
FIELDS = [
    *_facts(os.getpid()).keys(),
    "hub_user",  # a field this reader does not know yet: tolerated, ignored
]
COUNTER_FIELDS = ["bytes_in_use", "pool_bytes", "bytes_limit", "peak_bytes_in_use", "odd"]
_MARK = '"@@hostile@@"'


def _with(template: dict, path: list[str], raw: str) -> bytes:
    """``template`` as JSON with the value at ``path`` replaced by the raw JSON text ``raw``."""
    content = json.loads(json.dumps(template))
    inner = content
    for key in path[:-1]:
        inner = inner.setdefault(key, {})
    inner[path[-1]] = "@@hostile@@"
    return json.dumps(content).replace(_MARK, raw, 1).encode("utf-8", "surrogatepass")


def hostile_contents(pid: int) -> list[tuple[str, bytes]]:
    """(label, bytes) of many shapes of a file named as ``pid``'s beacon."""
    valid = _facts(pid)
    shapes: list[tuple[str, bytes]] = []
    for field, raw in itertools.product(FIELDS, HOSTILE_VALUES):
        shapes.append((f"{field}={raw[:20]}", _with(valid, [field], raw)))
    for counter, raw in itertools.product(COUNTER_FIELDS, HOSTILE_VALUES):
        shapes.append((f"gpus.{counter}={raw[:20]}", _with(valid, ["gpus", UUID, counter], raw)))
    for raw in HOSTILE_VALUES:
        shapes.append((f"variables.X={raw[:20]}", _with(valid, ["variables", "X"], raw)))
        shapes.append((f"gpus.<uuid>={raw[:20]}", _with(valid, ["gpus", UUID], raw)))
        shapes.append((f"whole file {raw[:20]}", raw.encode("utf-8", "surrogatepass")))
    text = json.dumps(valid)
    shapes += [
        ("empty", b""),
        ("NULs", b"\x00" * 100),
        ("not UTF-8", b"\xff\xfe\xfd" + text.encode()),
        (
            "not UTF-8 inside a string",
            text.replace("mine", "m\udcffne").encode("utf-8", "surrogateescape"),
        ),
        ("latin-1", text.replace("mine", "mïne").encode("latin-1")),
        ("UTF-16", text.encode("utf-16")),
        ("BOM", b"\xef\xbb\xbf" + text.encode()),
        ("truncated", text[: len(text) // 2].encode()),
        ("trailing garbage", (text + "}}}").encode()),
        ("two objects", (text + text).encode()),
        ("4,301 digits", b"1" * 4301),
        ("just too big", text.encode() + b" " * (64 * 1024)),
        ("deep inside a big file", ("[" * 30000 + "]" * 30000).encode()),
        ("another PID's content", json.dumps(_facts(os.getppid())).encode()),
        ("schema 2", json.dumps({**valid, "schema": 2}).encode()),
        ("schema '1'", json.dumps({**valid, "schema": "1"}).encode()),
        ("schema true", json.dumps({**valid, "schema": True}).encode()),
        ("recycled PID", json.dumps({**valid, "started_at": valid["started_at"] - 3600}).encode()),
        (
            "finished before it started",
            json.dumps({**valid, "last_cell_finished_at": 5.0}).encode(),
        ),
        ("finished in the future", json.dumps({**valid, "last_cell_finished_at": 1e12}).encode()),
        ("pool of the whole world", json.dumps({**valid, "pool_fraction": 1e300}).encode()),
        (
            "many GPUs",
            json.dumps({**valid, "gpus": {f"GPU-{i}": {} for i in range(3000)}}).encode(),
        ),
    ]
    return shapes


def _gpu(free: int) -> GpuMemory:
    return GpuMemory(0, UUID, "Simulated H200", TOTAL, TOTAL - free, free)


def _check_sane(beacon) -> None:
    """A beacon that was believed holds nothing a reader cannot show, sum or export."""
    json.dumps(asdict(beacon), allow_nan=False)
    for value in asdict(beacon).values():
        if isinstance(value, str):
            value.encode("utf-8")
        if isinstance(value, float):
            assert math.isfinite(value)
    assert beacon.pool_fraction is None or 0 <= beacon.pool_fraction <= 1
    for counters in beacon.gpus.values():
        for count in counters.values():
            assert count is None or (isinstance(count, int) and 0 <= count < 2**63)
    idle = beacon.idle_s()
    assert idle is None or (math.isfinite(idle) and idle >= 0)


def _whole_status(beacons: dict, pid: int) -> str:
    """Everything a status does with the beacons, as the CLI and the server do it."""
    process = GpuProcess(pid, 0, PREALLOCATED)
    gpu = _gpu(TOTAL - PREALLOCATED - GIB)
    tenants = attribute(
        [process], [gpu], own_pid=-1, environ={}, beacons=beacons, sessions={},
        check_device_files=False,
    )  # fmt: skip
    warnings = warnings_for(tenants, [gpu], own_backend_started=True)
    report = {
        "nvml": {"available": True, "reason": None},
        "gpus": [{"index": 0, "uuid": UUID, "name": "H200", "total_bytes": TOTAL,
                  "used_bytes": gpu.used_bytes, "free_bytes": gpu.free_bytes, "ours": True}],
        "processes": [t.to_dict() for t in tenants],
        "warnings": [w.to_dict() for w in warnings],
        "notes": [],
    }  # fmt: skip
    text = format_status(report) + oom_diagnosis(tenants, [gpu])
    text.encode("utf-8")  # what a terminal is given
    json.dumps(report, allow_nan=False)  # what --json and the server's route send
    for family in metric_families(
        Snapshot(report, taken_at=time.time())
    ):  # what Prometheus scrapes
        for _, value in family.samples:
            float(value)
    return text


def test_every_shape_of_malformed_beacon_is_skipped_and_nothing_believed_is_unshowable(tmp_path):
    pid = os.getpid()
    name = f"jax_nbmem-beacon-{pid}.json"
    shapes = hostile_contents(pid)
    assert len(shapes) > 800
    believed = 0
    for number, (label, content) in enumerate(shapes):
        folder = tmp_path / str(number)
        folder.mkdir()
        (folder / name).write_bytes(content)
        found = read_beacons([str(folder)], pids=[pid])
        assert read_beacons([str(folder)]) == found, label  # listed, or looked up by PID
        assert set(found) <= {pid}, label
        for beacon in found.values():
            _check_sane(beacon)
        _whole_status(found, pid)
        believed += bool(found)
    # The well-formed ones with one odd field are still believed (that field dropped).
    assert 0 < believed < len(shapes)
    # And what each kind of odd value becomes, for a few that matter.
    (tmp_path / "odd").mkdir()
    odd = _facts(
        pid, notebook="\ud800", pool_fraction=1e300, last_cell_finished_at=1e12,
        gpus={UUID: {"bytes_in_use": 2**64, "pool_bytes": -1, "peak_bytes_in_use": 3}},
        variables={"A": "1", "B": 2, "C": ["x"]}, mode_in_effect="[" * 10, hub_user="ada",
    )  # fmt: skip
    (tmp_path / "odd" / name).write_bytes(json.dumps(odd).encode("utf-8", "surrogatepass"))
    (beacon,) = read_beacons([str(tmp_path / "odd")], pids=[pid]).values()
    assert beacon.notebook is None and beacon.pool_fraction is None
    assert beacon.last_cell_finished_at is None and beacon.idle_s() is None
    assert beacon.gpus == {UUID: {"bytes_in_use": None, "pool_bytes": None, "peak_bytes_in_use": 3}}
    assert beacon.variables == {"A": "1"} and beacon.mode == "[[[[[[[[[["


def test_files_that_are_not_regular_files_are_never_opened_for_reading(tmp_path):
    pid = os.getpid()
    name = f"jax_nbmem-beacon-{pid}.json"
    real = tmp_path / "real.json"
    real.write_text(json.dumps(_facts(pid)))
    kinds = {}
    for kind in ("fifo", "symlink", "directory", "socket", "hardlink"):
        (tmp_path / kind).mkdir()
        kinds[kind] = tmp_path / kind / name
    os.mkfifo(kinds["fifo"])  # opening it for reading would wait for a writer forever
    kinds["symlink"].symlink_to(real)
    kinds["directory"].mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(kinds["socket"]))
    os.link(real, kinds["hardlink"])  # one's own file under a second name: still one's own
    finished = threading.Event()
    found = {}

    def read_all():
        for kind, path in kinds.items():
            found[kind] = read_beacons([str(path.parent)], pids=[pid])
        finished.set()

    threading.Thread(target=read_all, daemon=True).start()
    assert finished.wait(30), "a reader hung on one of them"
    server.close()
    assert {kind: list(beacons) for kind, beacons in found.items()} == {
        "fifo": [], "symlink": [], "directory": [], "socket": [], "hardlink": [pid],
    }  # fmt: skip


def _cli_status(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "status", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_a_5000_deep_array_or_an_unprintable_notebook_in_the_shared_dir_breaks_no_status(
    tmp_path, simgpu_env, sim_state, sleeper
):
    share = tmp_path / "share"
    share.mkdir()
    sim_state.gpu(0, total=TOTAL, uuid=UUID).process(0, sleeper, 10 * GIB).write()
    env = {**simgpu_env, "JAX_NBMEM_SHARE_DIR": str(share)}
    beacon = share / f"jax_nbmem-beacon-{sleeper}.json"
    beacon.write_text("[" * DEEP + "]" * DEEP)
    for args in ((), ("--json",)):
        done = _cli_status(env, *args)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr and str(sleeper) in done.stdout
    # The process's own beacon, well formed but for a notebook name no terminal can print.
    notebook = json.dumps(_facts(sleeper, notebook="/home/ada/\ud800.ipynb"))
    beacon.write_bytes(notebook.encode("utf-8", "surrogatepass"))
    done = _cli_status(env)
    assert done.returncode == 0, done.stderr
    assert "[the kernel's own report]" in done.stdout and "(mode: off)" in done.stdout
    report = json.loads(_cli_status(env, "--json").stdout)
    (seen,) = [p for p in report["processes"] if p["pid"] == sleeper]
    assert seen["source"] == "beacon" and seen["notebook"] is None


# --- What a look at the beacons opens ----------------------------------------------------------


class _FileAudit:
    """Which files under ``folder`` are opened, and whether it is listed (Python's audit hooks)."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder)
        self.opened: list[str] = []
        self.listed = 0
        self.on = False
        sys.addaudithook(self._hook)  # a hook stays for the process: it counts only while on

    def _hook(self, event: str, args: tuple) -> None:
        if not self.on or not args:
            return
        path = args[0]
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str) or not path.startswith(self.folder):
            return
        if event == "open":
            self.opened.append(os.path.basename(path))
        elif event in ("os.listdir", "os.scandir"):
            self.listed += 1


def test_5000_junk_files_in_the_shared_dir_are_never_opened_nor_listed_by_a_status(
    tmp_path, simgpu_in_process, sleeper
):
    share = tmp_path / "share"
    share.mkdir()
    own = os.getpid()
    (share / f"jax_nbmem-beacon-{sleeper}.json").write_text(
        json.dumps(_facts(sleeper, notebook="/home/ada/on-the-gpu.ipynb"))
    )
    # 5,000 files of junk: beacon names of live processes not on the GPU (this one, its
    # parent, init), of dead and impossible PIDs, and names that are no beacon's at all.
    live = [own, os.getppid(), 1]
    for i in range(5000):
        pick = i % 5
        if pick == 0:
            name = f"jax_nbmem-beacon-{live[i % 3]}-{i}.json"
        elif pick == 1:
            name = f"jax_nbmem-beacon-{4_000_000 + i}.json"
        elif pick == 2:
            name = f"jax_nbmem-beacon-{i}x.json"
        elif pick == 3:
            name = f"junk-{i}.json"
        else:
            name = f"jax_nbmem-beacon-0{i}.json"
        (share / name).write_text("[" * 100 + "]" * 100)
    for pid in live:
        (share / f"jax_nbmem-beacon-{pid}.json").write_text(json.dumps(_facts(pid)))
    simgpu_in_process.gpu(0, total=TOTAL, uuid=UUID).process(0, sleeper, 10 * GIB).write()
    audit = _FileAudit(share)
    audit.on = True
    try:
        report = collect(share_dir=str(share), sessions={})
    finally:
        audit.on = False
    (seen,) = [p for p in report["processes"] if p["pid"] == sleeper]
    assert seen["source"] == "beacon" and seen["notebook"] == "/home/ada/on-the-gpu.ipynb"
    assert audit.opened == [f"jax_nbmem-beacon-{sleeper}.json"]
    assert audit.listed == 0

    # A listing (for tools, not a status) opens the beacons of live PIDs only.
    audit.opened.clear()
    audit.on = True
    try:
        listed = read_beacons([str(share)])
    finally:
        audit.on = False
    assert audit.listed == 1
    assert sorted(audit.opened) == sorted(
        f"jax_nbmem-beacon-{pid}.json" for pid in [sleeper, *live]
    )
    # A beacon is believed from its process's own user (or root): for another user, PID 1's is not.
    believed = [
        p for p in live if os.geteuid() == 0 or psutil.Process(p).uids().real == os.getuid()
    ]
    assert set(listed) == {sleeper, *believed}


# --- The claims of `%jaxalloc auto`, in the same directory ------------------------------------


def test_junk_and_forged_claims_neither_hang_nor_crash_nor_sway_auto(tmp_path, other_user):
    from jax_nbmem.node.claims import claim_book

    own = os.getpid()
    started = psutil.Process(own).create_time()
    claim = {"pid": own, "started_at": started, "bytes_by_gpu": {UUID: 10 * GIB},
             "expires_at": time.time() + 60}  # fmt: skip
    os.mkfifo(tmp_path / "jax_nbmem-claim-fifo.json")  # opening it to read would wait forever
    (tmp_path / "jax_nbmem-claim-deep.json").write_text("[" * DEEP + "]" * DEEP)
    (tmp_path / "jax_nbmem-claim-huge.json").write_text(json.dumps(claim) + " " * 100_000)
    (tmp_path / "jax_nbmem-claim-dir.json").mkdir()
    (tmp_path / "jax_nbmem-claim-link.json").symlink_to(tmp_path / "jax_nbmem-claim-mine.json")
    forged = tmp_path / "jax_nbmem-claim-forged.json"
    forged.write_text(json.dumps({**claim, "key": "forged"}))
    os.chown(forged, other_user[1], other_user[2])  # another user claims for this process
    (tmp_path / "jax_nbmem-claim-mine.json").write_text(json.dumps({**claim, "key": "mine"}))
    found, finished = [], threading.Event()

    def decide():
        with claim_book(str(tmp_path)) as book:
            found.extend(book.others(own_key="someone else"))
        finished.set()

    threading.Thread(target=decide, daemon=True).start()
    assert finished.wait(30), "reading the claims hung"
    assert [c.key for c in found] == ["mine"]


def test_the_flag_then_the_variable_then_the_documented_folder(tmp_path):
    default = tmp_path / "jax_nbmem"
    env = {"JAX_NBMEM_SHARE_DIR": "/from/env"}
    assert find_share_dir("/given", env, str(default)) == ShareDir("/given", "--share-dir")
    assert find_share_dir(None, env, str(default)).path == "/from/env"
    assert find_share_dir(None, {}, str(default)).path is None  # not there: none
    (tmp_path / "elsewhere").mkdir()
    default.symlink_to(tmp_path / "elsewhere")
    assert find_share_dir(None, {}, str(default)).path is None  # a symlink is not the setup
    default.unlink()
    default.mkdir()
    assert find_share_dir(None, {}, str(default)) == ShareDir(str(default), "the default")


def test_the_setting_comes_after_the_variable_and_before_the_default(tmp_path):
    default = tmp_path / "jax_nbmem"
    default.mkdir()
    env = {"JAX_NBMEM_SHARE_DIR": "/from/env"}
    found = find_share_dir("/given", env, str(default), setting="/setting")
    assert found == ShareDir("/given", "--share-dir")
    found = find_share_dir(None, env, str(default), setting="/setting")
    assert found == ShareDir("/from/env", "$JAX_NBMEM_SHARE_DIR")
    found = find_share_dir(None, {}, str(default), setting="/setting")
    assert found == ShareDir("/setting", "the setting")
    assert find_share_dir(None, {}, str(default), setting="").how == "the default"
    assert find_share_dir(None, {}, None, setting="") == ShareDir(None, "none")


def test_a_kernel_a_server_and_a_reader_take_the_same_order(monkeypatch):
    from jax_nbmem.node.beacons import beacon_dirs
    from jax_nbmem.notebook.beacon import share_dir
    from jax_nbmem.server.extension import JaxNbMemServer, share_dir_of

    kernel = SimpleNamespace(settings=SimpleNamespace(share_dir="/setting"))
    server = JaxNbMemServer(share_dir="/setting")
    monkeypatch.setenv("JAX_NBMEM_SHARE_DIR", "/from/env")
    # The variable wins over the setting in both (the server's setting used to win).
    assert share_dir(kernel) == share_dir_of(server) == "/from/env"
    assert beacon_dirs(None)[-1] == "/from/env"
    assert beacon_dirs("/found")[-1] == "/found"  # what a face found is taken as found
    monkeypatch.delenv("JAX_NBMEM_SHARE_DIR")
    assert share_dir(kernel) == share_dir_of(server) == "/setting"
    # Neither: no default for a kernel or a server, whatever this machine's /var/tmp holds.
    bare = SimpleNamespace(settings=SimpleNamespace(share_dir=""))
    assert share_dir(bare) == ""
    assert share_dir_of(JaxNbMemServer()) is None
    assert "/setting" not in beacon_dirs(None)


def test_the_note_says_what_is_lost_and_how_to_point_to_the_agent():
    at_shell = agent_not_consulted("no share directory: no node agent", at_shell=True)
    for said in ("Node agent not consulted (no share directory", "mode they started with",
                 "no idle time", "--share-dir DIR", "JAX_NBMEM_SHARE_DIR=DIR",
                 DEFAULT_SHARE_DIR):  # fmt: skip
        assert said in at_shell, at_shell
    assert "--share-dir DIR or" not in agent_not_consulted(None, at_shell=False)


def _in_fresh_var_tmp(make_default: bool) -> list[str]:
    script = "mount -t tmpfs tmpfs /var/tmp"
    if make_default:
        script += f" && install -d -m 1777 {DEFAULT_SHARE_DIR}"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            script + ' && exec "$@"', "sh"]  # fmt: skip


@pytest.fixture
def root_env(simgpu_env):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: a mount namespace of its own")
    env = {**os.environ, **simgpu_env, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("JAX_NBMEM_SHARE_DIR", None)  # nothing given: the documented folder or none
    return env


def test_the_exporter_is_the_node_agent_in_the_documented_folder_with_no_flag(root_env):
    exporter = subprocess.Popen(
        [*_in_fresh_var_tmp(True), sys.executable, "-m", "jax_nbmem.cli", "exporter",
         "--listen", "127.0.0.1:0", "--interval", "0.2"],
        env=root_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = exporter.stdout.readline()
        assert line.startswith("jax-nbmem exporter: serving"), line + exporter.stderr.read()
        said = [exporter.stderr.readline() for _ in range(2)]  # the socket, the first count
    finally:
        exporter.send_signal(signal.SIGTERM)
        exporter.wait(15)
    assert f"socket {DEFAULT_SHARE_DIR}/agent/agent.sock" in said[0], said
    assert "acting as the node agent" in said[0] and "the node agent proves 0 kernels" in said[1]


def test_the_culler_takes_the_documented_folder_and_says_it_when_it_is_missing(root_env):
    command = [sys.executable, "-m", "jax_nbmem.cli", "cull", "--dry-run", "--once"]
    done = subprocess.run([*_in_fresh_var_tmp(False), *command], env=root_env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and DEFAULT_SHARE_DIR in done.stderr, done.stderr
    done = subprocess.run([*_in_fresh_var_tmp(True), *command], env=root_env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
