"""Issue 46 item 3: this process's own entries in NVML's lists, read raw, are the lists' own.

``nvml.own_process_lists(indices, pid)`` reads the compute and graphics lists through pynvml's
function pointers into a reused buffer and searches it for one PID. Whatever the lists hold
(hundreds of neighbours, a buffer to grow, a PID on both lists, bytes NVML cannot tell or that
cannot be, a PID's bytes hiding inside another entry's figure), it must say exactly what the
whole lists say of that PID, on the simulated GPU through real pynvml.
"""

from __future__ import annotations

import os

from jax_nbmem.gpu import nvml
from jax_nbmem.simgpu import GIB
from tests.gpu.test_nvml import run_nvml

MIB = 1024**2


def mine_in_whole_lists(pid, indices=None):
    return [
        (listing.gpu, tuple(p for p in listing.processes or () if p.pid == pid), listing.problem)
        for listing in nvml.process_lists(indices)
    ]


def own(pid, indices=None):
    return [(x.gpu, x.processes, x.problem) for x in nvml.own_process_lists(indices, pid)]


def test_own_entries_among_hundreds_of_neighbours_are_the_whole_lists_own(simgpu_in_process):
    state, me = simgpu_in_process, os.getpid()
    for gpu in range(4):
        state.gpu(gpu, total=141 * GIB)
        for n in range(300):  # more than the first buffer: it must grow
            pid = 100_000 + gpu * 1_000 + n
            state.process(gpu, pid if pid != me else 200_000 + n, (1 + n % 7) * MIB)
    state.process(1, me, 300 * MIB)
    state.process(2, me, 400 * MIB).process(2, me, 400 * MIB, graphics=True)
    state.process(3, me, None)  # NVML cannot tell its bytes (WDDM's "not available")
    # A neighbour whose figure holds our PID's bytes in its low word: not our entry.
    state.process(0, 99_999, (7 << 32) | me)
    state.write()
    assert own(me) == mine_in_whole_lists(me)
    assert own(me) == [
        (0, (), None),
        (1, (nvml.GpuProcess(me, 1, 300 * MIB),), None),
        (2, (nvml.GpuProcess(me, 2, 400 * MIB),), None),
        (3, (nvml.GpuProcess(me, 3, None),), None),
    ]
    assert own(me, [2]) == mine_in_whole_lists(me, [2])
    assert own(424_242) == [(gpu, (), None) for gpu in range(4)]  # listed nowhere


def test_a_list_that_grows_between_two_readings_is_read_whole_again(simgpu_in_process):
    state, me = simgpu_in_process, os.getpid()
    state.gpu(0, total=80 * GIB).process(0, me, GIB).write()
    assert own(me) == [(0, (nvml.GpuProcess(me, 0, GIB),), None)]
    for pid in [p for p in range(10_000, 12_001) if p != me][:2_000]:  # never this process's
        state.process(0, pid, MIB)
    state.write()
    assert own(me) == mine_in_whole_lists(me) == [(0, (nvml.GpuProcess(me, 0, GIB),), None)]


def test_impossible_bytes_are_left_out_and_said_as_the_whole_list_says(simgpu_in_process):
    state, me = simgpu_in_process, os.getpid()
    state.gpu(0, total=80 * GIB).process(0, me, 1 << 55).write()
    assert own(me) == mine_in_whole_lists(me)
    [(gpu, processes, problem)] = own(me)
    assert processes == (nvml.GpuProcess(me, 0, None),) and "impossible process bytes" in problem


def test_an_unreadable_gpu_is_unknown_not_empty(simgpu_in_process):
    state, me = simgpu_in_process, os.getpid()
    state.gpu(0, total=80 * GIB).gpu(1, total=80 * GIB).process(1, me, GIB)
    state.fail("processes", "NO_PERMISSION", 1).write()
    [first, second] = nvml.own_process_lists(None, me)
    assert first.processes == ()
    assert second.processes is None and second.problem


def test_an_old_driver_is_read_through_its_v2_calls(sim_state, simgpu_old_driver_lib):
    from jax_nbmem import simgpu

    env = simgpu.env_for_subprocess(simgpu_old_driver_lib.parent, sim_state.path)
    sim_state.gpu(0, total=80 * GIB).process(0, 7, 2 * GIB).process(0, 8, GIB).write()
    seen, log = run_nvml("report(own=nvml.own_process_lists(None, 7))", env)
    assert seen["own"] == [
        {"gpu": 0, "processes": [{"pid": 7, "gpu": 0, "used_bytes": 2 * GIB}], "problem": None}
    ]
    assert log.count("compute process list _v3") == 1
