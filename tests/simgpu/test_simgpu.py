"""The simulated GPU: building the stand-in NVML library, state files, and what the library says.

The library's answers are checked through plain ctypes calls (NVML's C contract), so these tests
do not depend on pynvml or on jax_nbmem.gpu.nvml.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from jax_nbmem import simgpu
from jax_nbmem.simgpu import GIB, SimState

MIB = 1024**2
SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, INSUFFICIENT_SIZE = 0, 1, 2, 7
DRIVER_NOT_LOADED, GPU_IS_LOST, VERSION_MISMATCH = 9, 15, 25
NOT_AVAILABLE = 2**64 - 1
MEMORY_V2 = 0x02000028


class Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class MemoryV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class ProcessInfo(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


@pytest.fixture
def nvml_lib(simgpu_lib):
    """The stand-in library loaded in this process; each test inits it and shuts it down."""
    lib = simgpu.preload(simgpu_lib)
    lib.nvmlErrorString.restype = ctypes.c_char_p
    return lib


@pytest.fixture
def session(nvml_lib, sim_state, monkeypatch):
    """An initialized library serving sim_state (written by the test before it calls)."""
    monkeypatch.setenv(simgpu.STATE_ENV_VAR, str(sim_state.path))
    sim_state.gpu(0, total=80 * GIB).write()
    assert nvml_lib.nvmlInit_v2() == SUCCESS
    yield nvml_lib
    nvml_lib.nvmlShutdown()


def handle(lib, index):
    device = ctypes.c_void_p()
    ret = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(device))
    return ret, device


def count(lib):
    value = ctypes.c_uint()
    ret = lib.nvmlDeviceGetCount_v2(ctypes.byref(value))
    return ret, value.value


def processes(lib, device, graphics=False):
    function = (
        lib.nvmlDeviceGetGraphicsRunningProcesses_v3
        if graphics
        else (lib.nvmlDeviceGetComputeRunningProcesses_v3)
    )
    size = ctypes.c_uint(0)
    first = function(device, ctypes.byref(size), None)
    if first == SUCCESS:
        return []
    assert first == INSUFFICIENT_SIZE
    infos = (ProcessInfo * size.value)()
    assert function(device, ctypes.byref(size), infos) == SUCCESS
    return [(info.pid, info.usedGpuMemory) for info in infos[: size.value]]


def test_build_is_reused_and_old_driver_is_a_separate_library(tmp_path):
    first = simgpu.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert first.name == "libnvidia-ml.so.1"
    assert simgpu.build(tmp_path) == first
    assert first.stat().st_mtime_ns == stamp
    old = simgpu.build(tmp_path, old_driver=True)
    assert old.name == "libnvidia-ml.so.1" and old.parent != first.parent
    assert [p.name for p in first.parent.iterdir()] == ["libnvidia-ml.so.1"]


def test_old_driver_library_lacks_the_newer_functions(simgpu_lib, simgpu_old_driver_lib):
    # Checked in a child process: two libraries with one soname must not meet in pytest itself.
    names = [
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
    ]
    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]);"
        "print([hasattr(lib, name) for name in sys.argv[2:]])"
    )
    found = {}
    for lib in (simgpu_lib, simgpu_old_driver_lib):
        out = subprocess.run(
            [sys.executable, "-c", code, str(lib), *names],
            capture_output=True,
            text=True,
            check=True,
        )
        found[lib] = out.stdout.strip()
    assert found[simgpu_lib] == "[True, True, True, True, True]"
    assert found[simgpu_old_driver_lib] == "[True, False, True, False, False]"


def test_no_state_means_no_driver(nvml_lib, sim_state, monkeypatch):
    monkeypatch.delenv(simgpu.STATE_ENV_VAR, raising=False)
    assert nvml_lib.nvmlInit_v2() == DRIVER_NOT_LOADED
    monkeypatch.setenv(simgpu.STATE_ENV_VAR, str(sim_state.path))  # not written yet
    assert nvml_lib.nvmlInit_v2() == DRIVER_NOT_LOADED
    sim_state.gpu(0, total=GIB).no_driver().write()
    assert nvml_lib.nvmlInit_v2() == DRIVER_NOT_LOADED
    assert nvml_lib.nvmlErrorString(DRIVER_NOT_LOADED) == b"Driver Not Loaded"


def test_calls_before_init_are_refused(simgpu_lib, sim_state):
    sim_state.gpu(0, total=GIB).write()
    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); n = ctypes.c_uint();"
        "print(lib.nvmlDeviceGetCount_v2(ctypes.byref(n)), lib.nvmlShutdown(), lib.nvmlInit_v2(),"
        " lib.nvmlDeviceGetCount_v2(ctypes.byref(n)), n.value)"
    )
    env = simgpu.env_for_subprocess(simgpu_lib.parent, sim_state.path)
    out = subprocess.run(
        [sys.executable, "-c", code, str(simgpu_lib)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == [str(UNINITIALIZED), str(UNINITIALIZED), "0", "0", "1"]


def test_memory_follows_processes_and_reserved(session, sim_state):
    sim_state.gpu(0, total=80 * GIB, reserved=GIB).process(0, 4242, 4 * GIB).process(
        0, 4243, None
    ).write()
    _, device = handle(session, 0)
    v2 = MemoryV2(version=MEMORY_V2)
    assert session.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(v2)) == SUCCESS
    assert (v2.total, v2.reserved, v2.used) == (80 * GIB, GIB, 4 * GIB)
    assert v2.free == 80 * GIB - GIB - 4 * GIB
    v1 = Memory()
    assert session.nvmlDeviceGetMemoryInfo(device, ctypes.byref(v1)) == SUCCESS
    assert (v1.total, v1.used, v1.free) == (80 * GIB, 5 * GIB, v2.free)


def test_an_idle_gpu_looks_as_on_an_r510_driver(session, sim_state):
    # nvidia-smi shows ~0 MiB used on an idle GPU: the driver's ~0.5 GiB is reserved, and v1's
    # "used" (older tools) counts it; each process's own figure holds its CUDA context.
    sim_state.write()
    _, device = handle(session, 0)
    v2 = MemoryV2(version=MEMORY_V2)
    assert session.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(v2)) == SUCCESS
    assert (v2.used, v2.reserved, v2.free) == (0, 500 * MIB, 80 * GIB - 500 * MIB)
    v1 = Memory()
    assert session.nvmlDeviceGetMemoryInfo(device, ctypes.byref(v1)) == SUCCESS
    assert (v1.used, v1.free) == (500 * MIB, 80 * GIB - 500 * MIB)
    assert sim_state.free_bytes(0) == v2.free  # the writers' figure is the stand-in's
    assert (
        session.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(MemoryV2(version=1)))
        == VERSION_MISMATCH
    )


def test_pinned_used_overrides_the_process_sum(session, sim_state):
    sim_state.gpu(0, total=10 * GIB, used=9 * GIB).process(0, 1, GIB).write()
    _, device = handle(session, 0)
    v1 = Memory()
    session.nvmlDeviceGetMemoryInfo(device, ctypes.byref(v1))
    assert (v1.used, v1.free) == (9 * GIB + 500 * MIB, GIB - 500 * MIB)  # reserved, as v1 counts


def test_process_lists_use_the_two_call_protocol(session, sim_state):
    sim_state.gpu(0, total=80 * GIB).process(0, 11, 2 * GIB).process(0, 12, None)
    sim_state.process(0, 13, GIB, graphics=True).write()
    _, device = handle(session, 0)
    assert processes(session, device) == [(11, 2 * GIB), (12, NOT_AVAILABLE)]
    assert processes(session, device, graphics=True) == [(13, GIB)]
    sim_state.remove_process(11).remove_process(12).remove_process(13).write()
    assert processes(session, device) == []


def test_every_call_rereads_the_file_and_the_variable(session, sim_state, tmp_path, monkeypatch):
    assert count(session) == (SUCCESS, 1)
    sim_state.gpu(1, total=GIB).write()
    assert count(session) == (SUCCESS, 2)
    other = SimState(tmp_path / "other.state").gpu(0, total=GIB).gpu(1, total=GIB).gpu(2, total=GIB)
    other.write()
    monkeypatch.setenv(simgpu.STATE_ENV_VAR, str(other.path))
    assert count(session) == (SUCCESS, 3)


def test_names_and_uuids_are_honest(session, sim_state):
    sim_state.gpu(1, total=GIB, uuid="GPU-1234", name="NVIDIA A100 (simulated)").write()
    buffer = ctypes.create_string_buffer(96)
    _, first = handle(session, 0)
    _, second = handle(session, 1)
    assert session.nvmlDeviceGetName(first, buffer, 96) == SUCCESS
    assert buffer.value == b"NVIDIA H200 (simulated)"
    assert session.nvmlDeviceGetUUID(second, buffer, 96) == SUCCESS
    assert buffer.value == b"GPU-1234"
    assert session.nvmlDeviceGetUUID(second, buffer, 4) == INSUFFICIENT_SIZE
    index = ctypes.c_uint()
    assert session.nvmlDeviceGetIndex(second, ctypes.byref(index)) == SUCCESS and index.value == 1
    assert handle(session, 2)[0] == INVALID_ARGUMENT


def test_a_lost_gpu_refuses_calls_until_it_recovers(session, sim_state):
    sim_state.gpu(1, total=GIB).write()
    _, device = handle(session, 1)
    sim_state.lose(1).write()
    assert count(session) == (SUCCESS, 2)
    assert handle(session, 1)[0] == GPU_IS_LOST
    assert session.nvmlDeviceGetMemoryInfo(device, ctypes.byref(Memory())) == GPU_IS_LOST
    assert handle(session, 0)[0] == SUCCESS
    sim_state.recover(1).write()
    assert session.nvmlDeviceGetMemoryInfo(device, ctypes.byref(Memory())) == SUCCESS


def test_writes_are_atomic_for_concurrent_readers(session, sim_state):
    one = SimState(sim_state.path).gpu(0, total=GIB)
    two = SimState(sim_state.path).gpu(0, total=GIB).gpu(1, total=GIB)
    seen, done = set(), threading.Event()

    def read():
        while not done.is_set():
            seen.add(count(session))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(200):
            one.write()
            two.write()
    finally:
        done.set()
        reader.join()
    assert seen <= {(SUCCESS, 1), (SUCCESS, 2)}
    assert [p.name for p in sim_state.path.parent.iterdir()] == [sim_state.path.name]


def test_state_rejects_names_that_would_break_the_file(sim_state):
    with pytest.raises(ValueError):
        sim_state.gpu(0, total=GIB, name="two\nlines")
    with pytest.raises(ValueError):
        sim_state.gpu(0, total=GIB, name="A #comment")


def test_env_for_subprocess_prepends_the_library(tmp_path):
    env = simgpu.env_for_subprocess(
        tmp_path / "lib", tmp_path / "s", base={"LD_LIBRARY_PATH": "/x", "HOME": "/h"}
    )
    assert env == {
        "LD_LIBRARY_PATH": f"{tmp_path / 'lib'}:/x",
        "HOME": "/h",
        simgpu.STATE_ENV_VAR: str(tmp_path / "s"),
    }
    assert simgpu.env_for_subprocess("/l", "/s", base={})["LD_LIBRARY_PATH"] == "/l"


def test_command_line_builds_and_writes_a_demo_state(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.simgpu", "build", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        check=True,
    )
    lib_dir = built.stdout.strip()
    assert os.listdir(lib_dir) == ["libnvidia-ml.so.1"]
    state = tmp_path / "demo.state"
    subprocess.run(
        [sys.executable, "-m", "jax_nbmem.simgpu", "demo-state", str(state)],
        check=True,
        capture_output=True,
    )
    code = (
        "import ctypes; lib = ctypes.CDLL('libnvidia-ml.so.1'); d = ctypes.c_void_p();"
        "b = ctypes.create_string_buffer(96); lib.nvmlInit_v2();"
        "lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(d)); lib.nvmlDeviceGetName(d, b, 96);"
        "print(b.value.decode())"
    )
    env = simgpu.env_for_subprocess(lib_dir, state)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "NVIDIA H200 (simulated)"


_AS_OTHER_USER = """
import os, sys
from jax_nbmem.simgpu.simulator import default_dir, demo_state
uid, gid = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([]); os.setgid(gid); os.setuid(uid)
folder = default_dir()
print(demo_state(folder / "gpu.state").write())
"""


def test_two_users_simulated_gpus_live_side_by_side(other_user, tmp_path, monkeypatch):
    from jax_nbmem.simgpu.simulator import default_dir, demo_state

    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)  # like /tmp
    tmp_path.chmod(0o755)
    env = {**os.environ, "TMPDIR": str(shared_tmp)}
    _, uid, gid = other_user
    done = subprocess.run(
        [sys.executable, "-c", _AS_OTHER_USER, str(uid), str(gid)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    theirs = Path(done.stdout.strip())
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    mine = demo_state(default_dir() / "gpu.state").write()
    assert mine.parent != theirs.parent
    assert theirs.parent.name == f"jax_nbmem-simgpu-{uid}"
    assert theirs.stat().st_uid == uid and mine.stat().st_uid == os.getuid()
    assert "NVIDIA H200 (simulated)" in theirs.read_text() and mine.exists()


def test_the_command_line_help_documents_the_state_file_and_the_tenant():
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.simgpu", "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0
    for needle in ("state file", "proc GPU PID used=BYTES", "ends=exit", "tenant", "shell-env"):
        assert needle in done.stdout, needle


# --- A faithful stand-in (issue 25, part 1) ---------------------------------------------------

_IN_PLACE_WRITER = """
import sys, time
path, seconds = sys.argv[1], float(sys.argv[4])
a, b = open(sys.argv[2]).read(), open(sys.argv[3]).read()
deadline, n = time.monotonic() + seconds, 0
while time.monotonic() < deadline:
    text = a if n % 2 else b
    with open(path, "w") as out:  # in place, as an editor or a careless script does
        if n % 4 < 2:
            out.write(text)
        else:  # line by line, flushed: a reader sees every prefix
            for line in text.splitlines(keepends=True):
                out.write(line)
                out.flush()
    n += 1
print(n)
"""


def test_a_file_rewritten_in_place_is_never_read_half_written(session, sim_state, tmp_path):
    # Two states of 55 and 80 KB: 2 GPUs with 1,400 or 2,000 processes between them.
    states = {}
    for procs in (1400, 2000):
        state = SimState(sim_state.path).gpu(0, total=80 * GIB).gpu(1, total=80 * GIB)
        for pid in range(procs):
            state.process(pid % 2, 10_000 + pid, (1 + pid % 5) * MIB)
        (tmp_path / f"{procs}.txt").write_text(state.render())
        states[procs // 2] = sum((1 + pid % 5) * MIB for pid in range(0, procs, 2))
    assert len((tmp_path / "2000.txt").read_text()) > 70_000
    sim_state.path.write_text((tmp_path / "1400.txt").read_text())
    writer = subprocess.Popen(
        [sys.executable, "-c", _IN_PLACE_WRITER, str(sim_state.path),
         str(tmp_path / "1400.txt"), str(tmp_path / "2000.txt"), "60"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen, reads = set(), 0
    try:
        _, device = handle(session, 0)
        v2 = MemoryV2(version=MEMORY_V2)
        infos, function = (ProcessInfo * 4000)(), session.nvmlDeviceGetComputeRunningProcesses_v3
        # The stand-in answers an unchanged file from memory: 3,000 reads may be over before
        # the writer has started, so the reads go on until both states were seen (or 50 s).
        deadline = time.monotonic() + 50
        while reads < 3000 or (len(seen) < 2 and time.monotonic() < deadline):
            assert count(session) == (SUCCESS, 2)
            size = ctypes.c_uint(4000)
            assert function(device, ctypes.byref(size), infos) == SUCCESS
            listed = size.value
            assert session.nvmlDeviceGetMemoryInfo_v2(device, ctypes.byref(v2)) == SUCCESS
            seen.add(listed)
            assert listed in states and v2.used in states.values(), (listed, v2.used)
            reads += 1
    finally:
        writer.kill()
        writer.wait()
    assert seen == set(states)  # both states were seen, and nothing in between


_THREADS = """
import ctypes, sys, threading
lib = ctypes.CDLL(sys.argv[1])
assert lib.nvmlInit_v2() == 0
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
def work():
    n = ctypes.c_uint()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0 and n.value == 8
work()
before = rss()
for _ in range(300):
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
print(rss() - before)
"""


def test_threads_that_come_and_go_leave_nothing_behind(simgpu_lib, sim_state):
    for gpu in range(8):
        sim_state.gpu(gpu, total=80 * GIB)
        for pid in range(1000):
            sim_state.process(gpu, 100_000 + gpu * 10_000 + pid, MIB)
    sim_state.write()
    env = simgpu.env_for_subprocess(simgpu_lib.parent, sim_state.path)
    done = subprocess.run(
        [sys.executable, "-c", _THREADS, str(simgpu_lib)],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert int(done.stdout) < 8 * MIB  # was 120 MiB: a parsed state per thread, never freed


def test_nvml_does_not_start_without_a_gpu(nvml_lib, sim_state, monkeypatch):
    monkeypatch.setenv(simgpu.STATE_ENV_VAR, str(sim_state.path))
    sim_state.path.write_text("")  # an empty file: a writer's first step
    assert nvml_lib.nvmlInit_v2() == DRIVER_NOT_LOADED
    sim_state.write()  # complete, but no GPU: the kernel module would not load
    assert nvml_lib.nvmlInit_v2() == DRIVER_NOT_LOADED
    sim_state.gpu(0, total=GIB).gpu(1, total=GIB).write()
    assert nvml_lib.nvmlInit_v2() == SUCCESS
    try:
        assert count(nvml_lib) == (SUCCESS, 2)
    finally:
        nvml_lib.nvmlShutdown()


def test_jax_nbmem_sees_the_gpus_that_come_after_an_empty_state(simgpu_in_process):
    from jax_nbmem.gpu import nvml

    simgpu_in_process.path.write_text("")
    assert not nvml.status().available and nvml.gpus() == []
    simgpu_in_process.gpu(0, total=GIB).gpu(1, total=GIB).write()
    deadline = time.monotonic() + 10
    while not nvml.status().available and time.monotonic() < deadline:
        time.sleep(0.05)  # jax_nbmem retries a failed NVML after a pause
    assert [gpu.index for gpu in nvml.gpus()] == [0, 1]


_BAD_THEN_GOOD = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
n = ctypes.c_uint()
assert lib.nvmlInit_v2() == 0
open(sys.argv[2], "a").write("")
text = open(sys.argv[2]).read()
with open(sys.argv[2], "w") as out:
    out.write(text.replace("end\\n", "proc 0 abc used=5\\nend\\n"))
for _ in range(100):
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0 and n.value == 2, n.value
print("ok")
"""


def test_a_bad_line_is_said_once_and_the_last_good_state_stays(simgpu_lib, sim_state):
    sim_state.gpu(0, total=GIB).gpu(1, total=GIB).write()
    env = simgpu.env_for_subprocess(simgpu_lib.parent, sim_state.path)
    done = subprocess.run(
        [sys.executable, "-c", _BAD_THEN_GOOD, str(simgpu_lib), str(sim_state.path)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == "ok", done.stderr
    said = f"{sim_state.path}: line 5: proc: bad PID 'abc'; the last good state stays in use"
    assert done.stderr.count(said) == 1, done.stderr


def test_the_v1_functions_are_there_as_real_drivers_export_them(session, sim_state):
    sim_state.gpu(0, total=80 * GIB).process(0, 11, 2 * GIB).process(0, 12, None).write()

    class ProcessInfoV1(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    n = ctypes.c_uint()
    assert session.nvmlDeviceGetCount(ctypes.byref(n)) == SUCCESS and n.value == 1
    device = ctypes.c_void_p()
    assert session.nvmlDeviceGetHandleByIndex(0, ctypes.byref(device)) == SUCCESS
    size = ctypes.c_uint(0)
    assert session.nvmlDeviceGetComputeRunningProcesses(device, ctypes.byref(size), None) == 7
    infos = (ProcessInfoV1 * 3)()
    size = ctypes.c_uint(3)
    assert session.nvmlDeviceGetComputeRunningProcesses(device, ctypes.byref(size), infos) == 0
    assert [(i.pid, i.usedGpuMemory) for i in infos[: size.value]] == [
        (11, 2 * GIB),
        (12, NOT_AVAILABLE),
    ]
    size = ctypes.c_uint(0)
    assert session.nvmlDeviceGetGraphicsRunningProcesses(device, ctypes.byref(size), None) == 0


def test_every_error_code_has_the_drivers_text(nvml_lib):
    texts = {code: nvml_lib.nvmlErrorString(code).decode() for code in simgpu.NVML_ERRORS.values()}
    assert texts[15] == "GPU is lost" and texts[9] == "Driver Not Loaded"
    assert texts[6] == "Not Found" and texts[18] == "Driver/library version mismatch"
    # Quoted from real drivers in users' reports (see nvmlErrorString in nvml_stub.c).
    assert texts[16] == "GPU requires reset"
    assert texts[17] == "GPU access blocked by the operating system"
    assert texts[25] == "Argument version mismatch"
    assert texts[27] == "System is not in ready state"
    assert [code for code, text in texts.items() if text == "Unknown Error"] == [999]
    assert nvml_lib.nvmlErrorString(12345) == b"Unknown Error"


def test_the_library_is_readable_by_every_user_whatever_the_umask(tmp_path):
    code = (
        "import os, sys; os.umask(0o077); from jax_nbmem import simgpu;"
        "print(simgpu.build(sys.argv[1]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    lib = Path(done.stdout.strip())
    assert lib.stat().st_mode & 0o777 == 0o755
    assert lib.parent.stat().st_mode & 0o777 == 0o755


_UPDATER = """
import sys
from jax_nbmem.simgpu import SimState
for n in range(int(sys.argv[3])):
    with SimState.update(sys.argv[1]) as state:
        state.process(0, int(sys.argv[2]) + n, 1)
"""


def test_writers_that_change_one_thing_never_lose_each_others_lines(sim_state):
    sim_state.gpu(0, total=80 * GIB).write()
    writers = [
        subprocess.Popen([sys.executable, "-c", _UPDATER, str(sim_state.path), str(base), "60"])
        for base in (1000, 2000, 3000)
    ]
    for writer in writers:
        assert writer.wait(120) == 0
    pids = {proc.pid for proc in SimState.read(sim_state.path)._processes}
    assert pids == {base + n for base in (1000, 2000, 3000) for n in range(60)}
