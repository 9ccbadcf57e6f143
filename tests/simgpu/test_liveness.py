"""Ended processes never count as held: one rule, the C stand-in's and SimState's alike.

The same lines go to both sides: the stand-in's ``jaxNbmemSimLive`` (its parser, then the lines
its NVML calls would still list) and ``SimState.forget_ended()``; they must keep the same lines.
Then what each side builds on the rule: the free memory NVML reports and the one
``SimState.free_bytes`` computes (what the mirror and the neighbour fill against), and a new
demo run (``shell-env``) that meets only live processes.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from jax_nbmem import simgpu
from jax_nbmem.simgpu import GIB, SimState
from jax_nbmem.simgpu.liveness import line_ended, own_pid_namespace, process_start
from jax_nbmem.simgpu.state import DEFAULT_RESERVED_BYTES
from tests.waiting import wait_for

UUID = "GPU-00000000-0000-0000-0000-000000000000"
TOTAL = 100 * GIB


@pytest.fixture
def c_live(simgpu_lib):
    lib = simgpu.preload(simgpu_lib)
    live = lib.jaxNbmemSimLive
    live.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]

    def read(text: str) -> str:
        out = ctypes.create_string_buffer(1 << 20)
        code = live(text.encode(), out, len(out))
        assert code == 0, out.value.decode()
        return out.value.decode()

    return read


@pytest.fixture
def ended_pid():
    """The PID of a process that ran and was reaped."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def zombie():
    """The PID of a child that exited but is not reaped yet (its GPU memory is freed)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])

    def is_zombie() -> bool:
        stat = open(f"/proc/{process.pid}/stat").read()
        return stat[stat.rindex(")") + 2] == "Z"

    wait_for("the child exits", is_zombie, timeout=30)
    yield process.pid
    process.wait()


def _lines(sleeper: int, ended_pid: int, zombie: int) -> tuple[str, list[int]]:
    """A state whose lines cover every case of the rule; and the PIDs that must stay listed."""
    own, start = os.getpid(), process_start()
    sleeper_start = process_start(sleeper)
    assert start is not None and sleeper_start is not None
    other_namespace = own_pid_namespace() + 1
    text = (
        f"gpu 0 {UUID} total={TOTAL}\n"
        f"proc 0 {own} used={GIB} ends=exit start={start}\n"  # this process: runs
        f"proc 0 {sleeper} used={GIB} ends=exit\n"  # runs; no start said: by its PID alone
        f"proc 0 {ended_pid} used={40 * GIB} ends=exit\n"  # ended
        f"proc 0 {zombie} used={GIB} ends=exit start={process_start(zombie) or 1}\n"  # a zombie
        f"proc 0 4000001 used={GIB}\n"  # no ends=exit: listed whatever runs
        # a PID reused: the process with that PID now started at another time than this line's
        f"proc 0 {sleeper} used={GIB} ends=exit start={sleeper_start + 1} kind=graphics\n"
        # another namespace's line: not judged here (its registrar removes it)
        f"proc 0 3999999 used={GIB} ends=exit pidns={other_namespace}\n"
        "end\n"
    )
    return text, [own, sleeper, 4000001, 3999999]


def test_both_sides_keep_the_same_lines_of_live_processes(c_live, sleeper, ended_pid, zombie):
    text, staying = _lines(sleeper, ended_pid, zombie)
    python = SimState.parse(text).forget_ended().render()
    assert c_live(text) == python
    kept = [proc for proc in SimState.parse(python).processes()]
    assert [proc.pid for proc in kept] == staying
    # the reused PID's line went, the live process's own line (no start said) stayed
    assert [proc.graphics for proc in kept if proc.pid == sleeper] == [False]
    assert [proc.pidns is not None for proc in kept if proc.pid == 3999999] == [True]


def test_a_reused_pid_is_not_the_process_its_line_named(sleeper):
    start = process_start(sleeper)
    state = SimState("unused").gpu(0, TOTAL)
    state.process(0, sleeper, GIB, ends_with_process=True, start=start + 7)
    assert line_ended(state.processes()[0])
    assert state.process_bytes(sleeper) is None  # it holds nothing
    state.remove_process(sleeper).process(0, sleeper, GIB, ends_with_process=True, start=start)
    assert not line_ended(state.processes()[0])
    assert state.process_bytes(sleeper) == GIB


def test_the_free_memory_nvml_reports_is_the_one_the_simulator_fills_against(
    simgpu_env, sim_state, sleeper, ended_pid
):
    """What the mirror and the neighbour see free is what every NVML client sees free."""
    sim_state.gpu(0, TOTAL)
    sim_state.process(0, ended_pid, 60 * GIB, ends_with_process=True)  # a neighbour that ended
    sim_state.process(0, sleeper, 10 * GIB, ends_with_process=True, start=process_start(sleeper))
    sim_state.process(0, sleeper + 100_000, 5 * GIB)  # only a number: held
    sim_state.write()
    reported = subprocess.run(
        [sys.executable, "-c", "import pynvml as n; n.nvmlInit(); "
         "print(n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0)).free)"],
        env=simgpu_env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    free = SimState.read(sim_state.path).free_bytes(0)
    assert int(reported.stdout) == free == TOTAL - DEFAULT_RESERVED_BYTES - 15 * GIB
    assert SimState.read(sim_state.path).process_bytes(ended_pid) is None


def test_a_new_demo_run_meets_only_live_processes(tmp_path, sleeper, ended_pid):
    folder = tmp_path / "simgpu"
    folder.mkdir()
    state = simgpu.demo_state(folder / "gpu.state")
    state.process(0, ended_pid, 100 * GIB, ends_with_process=True)  # the last run's neighbour
    state.process(0, sleeper, 2 * GIB, ends_with_process=True)  # someone's running kernel
    state.process(0, 4_000_000, GIB)  # a neighbour that is only a number
    state.write()
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.simgpu", "shell-env", str(folder)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    left = SimState.read(folder / "gpu.state").processes()
    assert [proc.pid for proc in left] == [sleeper, 4_000_000]
