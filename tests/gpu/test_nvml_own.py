"""Issue 46 item 3: NVML's lists read raw say what pynvml's own list calls say.

``nvml.own_process_lists(indices, pid)`` reads the compute and graphics lists through pynvml's
function pointers into a reused buffer and searches it for one PID; ``nvml.process_lists``
reads them the same way and unpacks every entry, without pynvml's object for each. Whatever the
lists hold (hundreds of neighbours, a buffer to grow, a PID on both lists, bytes NVML cannot
tell or that cannot be, a PID's bytes hiding inside another entry's figure), they must say
exactly what pynvml's calls say, on the simulated GPU through real pynvml.
"""

from __future__ import annotations

import gc
import os

import pytest

from jax_nbmem.gpu import nvml
from jax_nbmem.gpu.nvml_processes import one_process_list
from jax_nbmem.simgpu import GIB
from tests.gpu.test_nvml import run_nvml

MIB = 1024**2


@pytest.fixture
def through_pynvml(monkeypatch):
    """The whole lists as pynvml's own calls give them (one object per entry)."""

    def read(indices=None):
        with monkeypatch.context() as patch:
            patch.setattr(nvml, "whole_process_list", one_process_list)
            return nvml.process_lists(indices)

    return read


def mine_in(lists, pid):
    return [
        (listing.gpu, tuple(p for p in listing.processes or () if p.pid == pid), listing.problem)
        for listing in lists
    ]


def own(pid, indices=None):
    return [(x.gpu, x.processes, x.problem) for x in nvml.own_process_lists(indices, pid)]


def test_own_entries_among_hundreds_of_neighbours_are_the_whole_lists_own(
    simgpu_in_process, through_pynvml
):
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
    assert own(me) == mine_in(through_pynvml(), me)
    assert own(me) == [
        (0, (), None),
        (1, (nvml.GpuProcess(me, 1, 300 * MIB),), None),
        (2, (nvml.GpuProcess(me, 2, 400 * MIB),), None),
        (3, (nvml.GpuProcess(me, 3, None),), None),
    ]
    assert own(me, [2]) == mine_in(through_pynvml([2]), me)
    assert own(424_242) == [(gpu, (), None) for gpu in range(4)]  # listed nowhere
    # the whole lists read raw: every neighbour, each once, as pynvml gives them
    assert nvml.process_lists(None) == through_pynvml(None)
    assert sum(len(listing.processes) for listing in nvml.process_lists(None)) == 4 * 300 + 4
    assert nvml.process_lists([2, 0]) == through_pynvml([2, 0])


def test_own_entries_read_the_graphics_list_only_where_the_compute_list_gave_no_figure(
    simgpu_in_process, through_pynvml, monkeypatch
):
    from jax_nbmem.gpu import nvml_own

    state, me = simgpu_in_process, os.getpid()
    for gpu in range(4):
        state.gpu(gpu, total=80 * GIB).process(gpu, 100_000 + gpu, GIB)
    state.process(0, me, 300 * MIB).process(0, me, 300 * MIB, graphics=True)  # on both
    state.process(1, me, 200 * MIB, graphics=True)  # a graphics context alone
    state.process(2, me, None)  # NVML cannot tell its bytes: the graphics list might
    state.write()
    kinds = []
    real = nvml_own._list_call
    monkeypatch.setattr(
        nvml_own,
        "_list_call",
        lambda nv, s, kind, log: kinds.append(kind) or real(nv, s, kind, log),
    )
    assert own(me) == mine_in(through_pynvml(), me)
    assert own(me) == [
        (0, (nvml.GpuProcess(me, 0, 300 * MIB),), None),
        (1, (nvml.GpuProcess(me, 1, 200 * MIB),), None),
        (2, (nvml.GpuProcess(me, 2, None),), None),
        (3, (), None),
    ]
    # GPU 0: its compute entry's figure is the one kept, so its graphics list is not read.
    assert kinds[:7] == [
        "Compute",
        "Compute",
        "Graphics",
        "Compute",
        "Graphics",
        "Compute",
        "Graphics",
    ]


def test_whole_lists_read_raw_merge_a_pid_on_both_lists_as_pynvml_does(
    simgpu_in_process, through_pynvml
):
    state = simgpu_in_process
    state.gpu(0, total=80 * GIB).gpu(1, total=80 * GIB)
    state.process(0, 11, 3 * MIB).process(0, 11, 3 * MIB, graphics=True)  # on both: once
    state.process(0, 12, None).process(0, 12, None, graphics=True)
    state.process(0, 13, 7 * MIB, graphics=True)  # on the graphics list alone
    state.process(1, 14, 1 << 55).process(1, 15, None)  # impossible, and not available
    state.write()
    whole = nvml.process_lists(None)
    assert whole == through_pynvml(None)
    assert whole[0].processes == (
        nvml.GpuProcess(11, 0, 3 * MIB),
        nvml.GpuProcess(12, 0, None),
        nvml.GpuProcess(13, 0, 7 * MIB),
    )
    assert whole[1].processes == (nvml.GpuProcess(14, 1, None), nvml.GpuProcess(15, 1, None))
    assert "impossible process bytes" in whole[1].problem and "PID 14" in whole[1].problem


def test_a_list_that_grows_between_two_readings_is_read_whole_again(
    simgpu_in_process, through_pynvml
):
    state, me = simgpu_in_process, os.getpid()
    state.gpu(0, total=80 * GIB).process(0, me, GIB).write()
    assert own(me) == [(0, (nvml.GpuProcess(me, 0, GIB),), None)]
    for pid in [p for p in range(10_000, 12_001) if p != me][:2_000]:  # never this process's
        state.process(0, pid, MIB)
    state.write()
    assert own(me) == mine_in(through_pynvml(), me) == [(0, (nvml.GpuProcess(me, 0, GIB),), None)]
    assert nvml.process_lists(None) == through_pynvml(None)


def test_impossible_bytes_are_left_out_and_said_as_the_whole_list_says(
    simgpu_in_process, through_pynvml
):
    state, me = simgpu_in_process, os.getpid()
    state.gpu(0, total=80 * GIB).process(0, me, 1 << 55).write()
    assert own(me) == mine_in(through_pynvml(), me)
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


def test_a_whole_list_is_two_columns_of_ints_and_a_tuple_to_its_readers(simgpu_in_process):
    # An object an entry made the garbage collector walk a kernel's heap at every reading.
    state = simgpu_in_process
    state.gpu(0, total=80 * GIB)
    for n in range(200):
        state.process(0, 5_000 + n, (n + 1) * MIB)
    state.write()
    [listing] = nvml.process_lists(None)
    table = listing.processes
    assert isinstance(table, nvml.ProcessTable)
    assert table.pids == list(range(5_000, 5_200)) and table.used[7] == 8 * MIB
    expected = tuple(nvml.GpuProcess(5_000 + n, 0, (n + 1) * MIB) for n in range(200))
    assert table == expected and expected == table and hash(table) == hash(expected)
    assert len(table) == 200 and table[-1] == expected[-1] and table[3:5] == expected[3:5]
    assert list(table) == list(expected) and "ProcessTable((GpuProcess(pid=5000" in repr(table)
    gc.collect()
    before = len(gc.get_objects())
    kept = [nvml.process_lists(None) for _ in range(5)]
    assert len(gc.get_objects()) - before < 200, "an object an entry"
    assert kept[0] == kept[-1]
    empty = nvml.ProcessTable(1, [], [])  # a GPU without processes: falsy, as () is
    assert not empty and empty == () and list(empty) == []


def test_own_entries_are_read_holding_the_gil_on_the_main_thread_only(simgpu_in_process):
    """A cell's boundary reads on the main thread: released there, the GIL would go to
    IPython's history writer and the cell would wait for it. The sampler's thread releases it.
    """
    import ctypes
    import threading

    from jax_nbmem.gpu import nvml_own

    state, me = simgpu_in_process, os.getpid()
    state.gpu(0, total=80 * GIB).process(0, me, GIB).write()
    assert own(me) == [(0, (nvml.GpuProcess(me, 0, GIB),), None)]
    nv, session = nvml._nvml.session()
    plain = nvml_own._list_call(nv, session, "Compute", nvml._nvml.log_once)
    held = nvml_own._held_on_main_thread(nv, plain)
    assert (
        held._flags_ & ctypes._FUNCFLAG_PYTHONAPI and not plain._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    )
    assert held.__name__ == plain.__name__ and nvml_own._held_on_main_thread(nv, plain) is held
    elsewhere = []
    thread = threading.Thread(
        target=lambda: elsewhere.append((nvml_own._held_on_main_thread(nv, plain), own(me)))
    )
    thread.start()
    thread.join(30)
    assert elsewhere == [(plain, [(0, (nvml.GpuProcess(me, 0, GIB),), None)])]
