"""The registrar: processes in PID namespaces are listed by host PID, and forgotten when they end.

Real PID namespaces (``unshare --pid --fork --mount-proc``, as root, as CI runs); the stand-in
library is asked through plain ctypes calls, from the host and from inside a namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from jax_nbmem import simgpu
from jax_nbmem.simgpu import GIB, SimState
from jax_nbmem.simgpu.registrar import Registrar, RegistrarError, register, socket_path
from tests.jupyterlab import REPO_ROOT
from tests.waiting import wait_for

HOST_NS = os.stat("/proc/self/ns/pid").st_ino

needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare for PID namespaces",
)

# What the stand-in lists on GPU 0, asked through NVML's C calls (run here or in a namespace).
_LIST = textwrap.dedent(
    """
    import ctypes, json, sys

    class Info(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                    ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]

    lib = ctypes.CDLL(sys.argv[1])
    assert lib.nvmlInit_v2() == 0
    device = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device)) == 0
    count, infos = ctypes.c_uint(64), (Info * 64)()
    assert lib.nvmlDeviceGetComputeRunningProcesses_v3(device, ctypes.byref(count), infos) == 0
    print(json.dumps(sorted(infos[i].pid for i in range(count.value))))
    """
)


def listed(lib, state, namespace: bool = False, blank_proc: bool = False) -> list[int]:
    """The PIDs the stand-in lists on GPU 0, asked from here or from a new PID namespace.

    ``blank_proc``: in a namespace whose /proc is an empty folder (none mounted).
    """
    command = [sys.executable, "-c", _LIST, str(lib)]
    if blank_proc:
        blank = 'mount -t tmpfs none /proc && exec "$@"'
        command = ["unshare", "--pid", "--fork", "--mount", "sh", "-c", blank, "sh", *command]
    elif namespace:
        command = ["unshare", "--pid", "--fork", "--mount-proc", *command]
    env = {**os.environ, simgpu.STATE_ENV_VAR: str(state)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def state(tmp_path):
    """An 80 GiB simulated GPU's state file."""
    return SimState(tmp_path / "gpu.state").gpu(0, 80 * GIB).write()


@pytest.fixture
def registrar(state):
    """A registrar serving ``state`` from a thread of this process; stopped afterwards."""
    server = Registrar(state, log=lambda text: None).listen()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server
    server.stop()
    thread.join(10)
    server.close()


def lines_of(state) -> list[tuple[int, int | None]]:
    return [(proc.pid, proc.pidns) for proc in SimState.read(state).processes()]


# A process in a namespace of its own registers, writes its line as the mirror does, says
# what it learnt, and stays until its stdin closes.
_REGISTERED = textwrap.dedent(
    """
    import json, os, sys
    from jax_nbmem.simgpu import SimState
    from jax_nbmem.simgpu.registrar import register
    registration = register(sys.argv[1])
    with SimState.update(sys.argv[1]) as state:
        state.process(0, registration.pid, 2**30, ends_with_process=True, pidns=registration.pidns)
    print(json.dumps({"own": os.getpid(), "host": registration.pid,
                      "inner": registration.pid_in_ns, "pidns": registration.pidns,
                      "lookup": registration.host_pid(os.getpid())}), flush=True)
    sys.stdin.read()
    """
)


def start_registered(state, namespace: bool) -> tuple[subprocess.Popen, dict]:
    command = [sys.executable, "-c", _REGISTERED, str(state)]
    if namespace:
        command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *command]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    said = json.loads(process.stdout.readline() or "null")
    assert said, "the registered process said nothing"
    return process, said


def test_a_process_on_the_host_is_told_its_own_pid(registrar, state):
    with register(state) as registration:
        assert (registration.pid, registration.pid_in_ns) == (os.getpid(), os.getpid())
        assert registration.pidns == HOST_NS
        assert registration.alive()
        assert registration.host_pid(os.getpid()) == os.getpid()
        assert registration.host_pid(2**22 + 1) is None  # no such registered process


def test_without_a_registrar_there_is_no_registration(state):
    assert register(state) is None


@needs_namespaces
def test_a_process_in_a_namespace_is_listed_by_its_host_pid_and_forgotten_when_it_ends(
    registrar, state, simgpu_lib
):
    process, said = start_registered(state, namespace=True)
    try:
        assert said["own"] == said["inner"] == 1  # PID 1 in its namespace...
        assert said["host"] != 1 and said["pidns"] == HOST_NS  # ...known to the host by its own
        assert said["lookup"] == said["host"]
        assert lines_of(state) == [(said["host"], HOST_NS)]
        # A real driver lists the host PID, to the host and inside any container alike.
        assert listed(simgpu_lib, state) == [said["host"]]
        assert listed(simgpu_lib, state, namespace=True) == [said["host"]]
    finally:
        process.kill()  # SIGKILL to unshare: --kill-child kills the namespace
        process.wait()
    wait_for("the registrar forgets the killed process", lambda: lines_of(state) == [], 10)


@needs_namespaces
def test_liveness_is_judged_in_the_namespace_the_pid_belongs_to(state, simgpu_lib, sleeper):
    """A dead host PID is gone for the host; inside a container only the registrar can say."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(dead.stdout)
    with SimState.update(state) as edit:
        edit.process(0, dead_pid, GIB, ends_with_process=True, pidns=HOST_NS)
        edit.process(0, sleeper, GIB, ends_with_process=True, pidns=HOST_NS)
    assert listed(simgpu_lib, state) == [sleeper]
    assert listed(simgpu_lib, state, namespace=True) == sorted([dead_pid, sleeper])
    # Without /proc nobody can tell: the registrar's lines are listed as it left them.
    assert listed(simgpu_lib, state, blank_proc=True) == sorted([dead_pid, sleeper])
    # Without pidns= a container would judge the host PID in its own namespace: gone.
    with SimState.update(state) as edit:
        edit.remove_process(sleeper).process(0, sleeper, GIB, ends_with_process=True)
    assert sleeper not in listed(simgpu_lib, state, namespace=True)


def test_a_connection_that_closes_takes_its_lines_and_only_those(registrar, state, sleeper):
    process, said = start_registered(state, namespace=False)
    with SimState.update(state) as edit:
        edit.process(0, sleeper, GIB, ends_with_process=True)  # someone else's, unregistered
    process.stdin.close()
    process.wait(30)
    wait_for("the line of the ended process removed", lambda: lines_of(state) == [(sleeper, None)])


def test_the_sweep_forgets_lines_of_processes_that_ended_unseen(state):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    with SimState.update(state) as edit:
        edit.process(0, int(dead.stdout), GIB, ends_with_process=True, pidns=HOST_NS)
        edit.process(0, os.getpid(), GIB, ends_with_process=True, pidns=HOST_NS)
        edit.process(0, 2**22 + 7, GIB, ends_with_process=True, pidns=HOST_NS + 1)  # not ours
    server = Registrar(state, log=lambda text: None).listen()
    try:
        server._sweep()
    finally:
        server.close()
    assert lines_of(state) == [(os.getpid(), HOST_NS), (2**22 + 7, HOST_NS + 1)]


def test_one_registrar_per_state_file_and_a_dead_ones_socket_is_replaced(registrar, state):
    with pytest.raises(RegistrarError, match="a registrar already serves"):
        Registrar(state).listen()
    registrar.stop()
    registrar.close()
    stale = socket.socket(socket.AF_UNIX)  # a killed registrar leaves its socket behind
    stale.bind(str(socket_path(state)))
    stale.close()
    with pytest.raises(RegistrarError, match="no registrar answers at .*Connection refused"):
        register(state, timeout=1)
    again = Registrar(state).listen()
    try:
        assert socket_path(state).exists()
    finally:
        again.close()
    assert not socket_path(state).exists()


def test_a_bad_request_is_answered_and_unreadable_lines_hang_up(registrar, state):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(socket_path(state)))
        reader = sock.makefile("rb")
        assert json.loads(reader.readline())["pid"] == os.getpid()
        sock.sendall(b'{"op": "shutdown"}\n')
        assert json.loads(reader.readline()) == {
            "ok": False,
            "reason": "unknown request (op: pid)",
        }
        sock.sendall(b"not json\n")
        assert json.loads(reader.readline())["reason"] == "not a JSON object"
        assert reader.readline() == b""  # hung up


def test_a_registrar_refuses_a_missing_or_bad_state_file(tmp_path):
    with pytest.raises(RegistrarError, match="no such state file"):
        Registrar(tmp_path / "none.state").listen()
    bad = tmp_path / "bad.state"
    bad.write_text("gpu 0 U total=5\nproc 0 x used=1\nend\n")
    with pytest.raises(RegistrarError, match="line 2: proc: bad PID 'x'"):
        Registrar(bad).listen()
    assert not socket_path(bad).exists()


def test_the_command_serves_until_sigterm_and_check_says_so(state):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "jax_nbmem.simgpu"]
    server = subprocess.Popen([*command, "registrar", "--state", str(state)], env=env,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert "serving" in server.stdout.readline()
        done = subprocess.run([*command, "check", str(state)], env=env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0
        assert f"registrar: answers at {socket_path(state)}" in done.stdout
    finally:
        server.terminate()
        assert server.wait(20) == 0
    assert not socket_path(state).exists()
    done = subprocess.run([*command, "check", str(state)], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert "no registrar" in done.stdout
    helped = subprocess.run([*command, "--help"], env=env, capture_output=True, text=True)
    for needle in ("registrar", "pidns=INODE", "host PID"):
        assert needle in helped.stdout, needle


# --- The mirror with a registrar ------------------------------------------------------------


def test_a_mirror_with_a_registrar_writes_its_host_pid_and_namespace(
    registrar, state, mirror_module
):
    mirror = mirror_module.Mirror(state)
    mirror.step()
    assert lines_of(state) == [(os.getpid(), HOST_NS)]
    assert mirror.registration is not None and mirror.registration.alive()
    mirror.stop()
    assert lines_of(state) == [] and mirror.registration is None


def test_a_mirror_takes_its_line_over_when_a_registrar_comes(state, mirror_module):
    mirror = mirror_module.Mirror(state)
    mirror.step()
    assert lines_of(state) == [(os.getpid(), None)]  # no registrar: a plain host's line
    server = Registrar(state, log=lambda text: None).listen()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    try:
        mirror.step()
        assert lines_of(state) == [(os.getpid(), HOST_NS)]  # one line, now the registrar's
        server.stop()
        thread.join(10)
        server.close()  # the registrar stops: the mirror notices, and registers again
        again = Registrar(state, log=lambda text: None).listen()
        thread = threading.Thread(target=again.serve, daemon=True)
        thread.start()
        mirror._next_registration = 0.0
        mirror.step()
        assert mirror.registration is not None and mirror.registration.alive()
        assert lines_of(state) == [(os.getpid(), HOST_NS)]
        again.stop()
        thread.join(10)
        again.close()
    finally:
        mirror.stop()


def test_a_mirror_waits_for_a_registrar_that_does_not_answer(state, mirror_module, capsys):
    stale = socket.socket(socket.AF_UNIX)  # a killed registrar's socket
    stale.bind(str(socket_path(state)))
    stale.close()
    mirror = mirror_module.Mirror(state)
    mirror.step()
    mirror._next_registration = 0.0
    mirror.step()
    assert lines_of(state) == []  # not its own PID: in a container that would be wrong
    said = capsys.readouterr().err
    assert said.count("the mirror waits: no registrar answers at") == 1, said
