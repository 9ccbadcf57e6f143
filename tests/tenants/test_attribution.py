"""Who else is on my GPU: real kernels and processes, attributed from NVML-shaped lists.

There is no GPU here, so the NVML side is a list of ``GpuProcess`` records naming the real PIDs
of kernels and processes these tests start; everything else (command lines, environments,
memory maps, notebooks) is read from those live processes.
"""

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jax  # noqa: F401  (a user who imported jax: jaxlib is loaded, its backend is not started)
import psutil
import pytest

from jax_nbmem.gpu.mig import MigInstance
from jax_nbmem.gpu.nvml import GpuMemory, GpuProcess
from jax_nbmem.node.servers import SessionIndex
from jax_nbmem.tenants.advice import oom_diagnosis, warnings_for
from jax_nbmem.tenants.attribution import PID_NAMESPACE_REASON, attribute, inspect_process
from jax_nbmem.units import format_bytes, format_gib
from tests.kernels import execute, running_kernel

pytestmark = pytest.mark.kernel

GiB = 1 << 30
MiB = 1 << 20
NO_SERVERS = SessionIndex({})


def gpu(total_gib=16, used=None, free=None, index=0):
    total = total_gib * GiB
    if free is None:
        free = total - used
    return GpuMemory(index, f"GPU-{index}", "Simulated GPU", total, total - free, free)


def preallocation(total_gib=16, fraction=0.75):
    """What NVML shows for a JAX process that preallocated: its share plus a CUDA context."""
    return int(fraction * total_gib * GiB) + 300 * MiB


def sleeper():
    """A plain process, returned once it runs its command (a fresh child's cmdline is empty)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if "time.sleep(120)" in " ".join(psutil.Process(process.pid).cmdline()):
                break
        except psutil.Error:
            pass
        time.sleep(0.01)
    return process


def stop(process):
    process.kill()
    process.wait(10)


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory):
    """Two notebooks' kernels that ran JAX (one preallocating, one `off`) and a plain process."""
    notebooks = tmp_path_factory.mktemp("notebooks")
    with contextlib.ExitStack() as stack:
        greedy_manager, greedy = stack.enter_context(
            running_kernel(env={"JPY_SESSION_NAME": str(notebooks / "train.ipynb")})
        )
        modest_manager, modest = stack.enter_context(
            running_kernel(
                env={
                    "JPY_SESSION_NAME": str(notebooks / "explore.ipynb"),
                    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                }
            )
        )
        for client in (greedy, modest):
            out, error = execute(client, "import jax.numpy as jnp; print(jnp.ones(1).sum())")
            assert error is None and "1.0" in out, out
        plain = sleeper()
        stack.callback(stop, plain)
        yield SimpleNamespace(
            notebooks=notebooks,
            greedy=greedy_manager.provisioner.process.pid,
            greedy_connection_file=greedy_manager.connection_file,
            modest=modest_manager.provisioner.process.pid,
            plain=plain.pid,
        )


def test_other_kernels_are_named_with_their_notebooks_and_allocator(neighbours):
    gpus = [gpu(used=preallocation() + GiB + 512 * MiB)]
    listed = [
        GpuProcess(neighbours.greedy, 0, preallocation()),
        GpuProcess(neighbours.modest, 0, GiB),
        GpuProcess(neighbours.plain, 0, 512 * MiB),
    ]
    tenants = {t.pid: t for t in attribute(listed, gpus, check_device_files=False)}

    greedy = tenants[neighbours.greedy]
    assert greedy.kind == "kernel"
    assert greedy.notebook == str(neighbours.notebooks / "train.ipynb")
    assert greedy.runs_jax is True and greedy.preallocated is True
    assert greedy.allocator_env == {}
    # Started outside a Jupyter server, its connection file is a temporary name, not the
    # server's kernel-<id>.json: no kernel id to give.
    assert not re.search(r"kernel-.*\.json$", neighbours.greedy_connection_file)
    assert greedy.kernel_id is None
    assert "ipykernel" in greedy.cmdline
    assert abs(greedy.started_at - psutil.Process(neighbours.greedy).create_time()) < 0.01

    modest = tenants[neighbours.modest]
    assert (modest.kind, modest.runs_jax, modest.preallocated) == ("kernel", True, False)
    assert modest.notebook.endswith("explore.ipynb")
    assert modest.allocator_env == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

    # JAX's preallocation stops at its share (plus a context): 15.5 GiB of 16 is something else.
    beyond = attribute(
        [GpuProcess(neighbours.greedy, 0, 15 * GiB + 512 * MiB)], gpus, check_device_files=False
    )
    assert beyond[0].preallocated is False
    # Holding three quarters is not proof: its environment says it does not preallocate.
    grown = attribute(
        [GpuProcess(neighbours.modest, 0, preallocation())], gpus, check_device_files=False
    )
    assert grown[0].preallocated is False

    plain = tenants[neighbours.plain]
    assert (plain.kind, plain.runs_jax, plain.preallocated, plain.notebook) == (
        "process",
        False,
        False,
        None,
    )
    assert plain.cmdline.endswith("time.sleep(120)")

    record = json.loads(json.dumps(greedy.to_dict()))
    for key in ("pid", "gpu", "used_bytes", "kind", "notebook", "preallocated", "idle_s"):
        assert key in record
    assert record["kind"] == "kernel" and record["preallocated"] is True


def test_the_preallocating_kernel_is_blamed_with_a_fix(neighbours):
    gpus = [gpu(used=preallocation() + GiB)]
    listed = [
        GpuProcess(neighbours.greedy, 0, preallocation()),
        GpuProcess(neighbours.modest, 0, GiB),
    ]
    tenants = attribute(listed, gpus, sessions=NO_SERVERS, check_device_files=False)

    warnings = warnings_for(tenants, gpus, own_backend_started=True)

    assert [(w.kind, w.pid, w.gpu) for w in warnings] == [
        ("blocking-preallocation", neighbours.greedy, 0)
    ]
    message = warnings[0].message
    assert str(neighbours.greedy) in message and "train.ipynb" in message
    assert "12.3 GiB" in message and f"{format_gib(gpus[0].free_bytes)} is free" in message
    assert f"`%jaxmem shutdown {neighbours.greedy} --yes`" in message
    assert "`%jaxalloc off`" in message
    assert warnings[0].to_dict()["kind"] == "blocking-preallocation"

    needy = warnings_for(tenants, gpus, own_backend_started=True, own_needs_bytes=4 * GiB)
    assert "less than the 4.00 GiB this kernel needs" in needy[0].message


def test_kernels_that_fit_comfortably_raise_no_warning(neighbours):
    gpus = [gpu(used=3 * GiB)]
    listed = [
        GpuProcess(neighbours.greedy, 0, GiB + 200 * MiB),  # default mode, backend grew only this
        GpuProcess(neighbours.modest, 0, GiB),
        GpuProcess(neighbours.plain, 0, 800 * MiB),
    ]
    tenants = attribute(listed, gpus, sessions=NO_SERVERS, check_device_files=False)

    assert [t.preallocated for t in tenants] == [False, False, False]
    assert warnings_for(tenants, gpus, own_backend_started=True) == []
    assert warnings_for(tenants, gpus, own_backend_started=False) == []
    assert warnings_for(tenants, gpus, own_backend_started=False, own_requested_fraction=0.5) == []


def test_a_kernel_about_to_preallocate_is_told_what_would_fit(neighbours):
    gpus = [gpu(free=4 * GiB)]
    listed = [GpuProcess(neighbours.greedy, 0, preallocation())]
    tenants = attribute(listed, gpus, sessions=NO_SERVERS, check_device_files=False)

    warnings = warnings_for(tenants, gpus, own_backend_started=False, own_requested_fraction=0.75)

    assert sorted(w.kind for w in warnings) == ["blocking-preallocation", "prealloc-will-fail"]
    will_fail = next(w for w in warnings if w.kind == "prealloc-will-fail")
    assert "75% of GPU 0 (12.0 GiB)" in will_fail.message
    assert "only 4.0 GiB is free" in will_fail.message  # as the panel's header says it
    assert f"PID {neighbours.greedy}" in will_fail.message
    assert (
        "`%jaxalloc fraction 0.2`" in will_fail.message and "`%jaxalloc off`" in will_fail.message
    )

    # Once the backend runs, the mode can no longer change: no advice about it.
    started = warnings_for(tenants, gpus, own_backend_started=True, own_requested_fraction=0.75)
    assert [w.kind for w in started] == ["blocking-preallocation"]


def test_this_kernel_is_told_when_its_own_preallocation_crowds_others(neighbours):
    me = os.getpid()
    gpus = [gpu(used=preallocation() + GiB)]
    listed = [GpuProcess(me, 0, preallocation()), GpuProcess(neighbours.modest, 0, GiB)]

    tenants = attribute(listed, gpus, environ={}, sessions=NO_SERVERS, check_device_files=False)
    own = tenants[0]
    assert (own.kind, own.runs_jax, own.preallocated) == ("self", True, True)
    warnings = warnings_for(tenants, gpus, own_backend_started=True)
    assert [(w.kind, w.pid) for w in warnings] == [("self-preallocation", me)]
    assert "1 other process shares it" in warnings[0].message

    alone = attribute(listed[:1], gpus, environ={}, sessions=NO_SERVERS, check_device_files=False)
    mostly_idle = warnings_for(
        alone, gpus, own_backend_started=True, own_jax_in_use=100 * MiB, own_reserved=12 * GiB
    )
    assert [w.kind for w in mostly_idle] == ["self-preallocation"]
    assert "its arrays use only 100 MiB" in mostly_idle[0].message
    busy = warnings_for(alone, gpus, own_backend_started=True, own_jax_in_use=10 * GiB)
    assert busy == []

    # `%jaxalloc off` ran before JAX started: our environment now, not at launch, is what counts.
    switched_off = attribute(
        listed,
        gpus,
        environ={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
        sessions=NO_SERVERS,
        check_device_files=False,
    )
    assert switched_off[0].preallocated is False
    assert warnings_for(switched_off, gpus, own_backend_started=True) == []


def test_a_process_that_exits_before_inspection_is_unknown(neighbours):
    gone = sleeper()
    stop(gone)
    unreaped = sleeper()
    unreaped.kill()
    deadline = time.monotonic() + 10
    while psutil.Process(unreaped.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        listed = [
            GpuProcess(gone.pid, 0, GiB),
            GpuProcess(unreaped.pid, 0, GiB),
            GpuProcess(neighbours.plain, 0, GiB),
        ]
        tenants = attribute(listed, [gpu(used=3 * GiB)], check_device_files=False)
    finally:
        unreaped.wait(10)

    assert [t.kind for t in tenants] == ["unknown", "unknown", "process"]
    assert "exited" in tenants[0].reason
    assert "zombie" in tenants[1].reason
    assert tenants[0].preallocated is None and tenants[1].runs_jax is None
    assert inspect_process(gone.pid, own_pid=os.getpid()).kind == "unknown"


def _unused_pid():
    with open("/proc/sys/kernel/pid_max") as f:
        pid = int(f.read()) - 1
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


def test_host_pids_from_another_namespace_are_not_attributed(neighbours):
    gpus = [gpu(used=preallocation())]
    host_pid = _unused_pid()
    tenants = attribute([GpuProcess(host_pid, 0, preallocation())], gpus)

    assert tenants[0].kind == "unknown" and tenants[0].preallocated is None
    assert tenants[0].reason.startswith(PID_NAMESPACE_REASON)
    warnings = warnings_for(tenants, gpus, own_backend_started=True)
    assert [w.kind for w in warnings] == ["pid-namespace"]
    # The advice is the node agent, never the host's PID namespace for users' containers.
    assert "`jax-nbmem exporter --share-dir DIR`" in warnings[0].message
    assert "--pid=host" not in warnings[0].message and "hostPID" not in warnings[0].message
    assert str(host_pid) in warnings[0].message
    assert "jax-nbmem exporter" in oom_diagnosis(tenants, gpus)


def test_pids_naming_unrelated_processes_are_not_attributed(neighbours):
    gpus = [gpu(used=preallocation() + GiB)]
    listed = [
        GpuProcess(neighbours.greedy, 0, preallocation()),
        GpuProcess(neighbours.plain, 0, GiB),
    ]
    # We hold GPU memory, yet NVML does not list us: its PIDs are someone else's.
    missing_me = attribute(listed, gpus, sessions=NO_SERVERS, own_on_gpu=True)
    assert {t.kind for t in missing_me} == {"unknown"}
    assert f"does not list its PID {os.getpid()}" in missing_me[0].reason

    # Every CUDA process maps an NVIDIA device file; these real processes map none.
    no_device = attribute(listed, gpus, sessions=NO_SERVERS, check_device_files=True)
    assert all(t.reason.startswith(PID_NAMESPACE_REASON) for t in no_device)
    assert [w.kind for w in warnings_for(no_device, gpus, own_backend_started=True)] == [
        "pid-namespace"
    ]


def test_out_of_memory_diagnosis_names_who_holds_the_gpu(neighbours):
    gpus = [gpu(used=preallocation() + 2 * GiB)]
    listed = [
        GpuProcess(neighbours.greedy, 0, preallocation()),
        GpuProcess(neighbours.plain, 0, GiB),
        GpuProcess(os.getpid(), 0, GiB),
    ]
    tenants = attribute(listed, gpus, sessions=NO_SERVERS, check_device_files=False)

    text = oom_diagnosis(tenants, gpus)

    lines = text.splitlines()
    assert lines[0] == "JAX ran out of GPU memory. Who holds it:"
    free = format_bytes(gpus[0].free_bytes)
    assert f"GPU 0 (Simulated GPU): 14.3 GiB used of 16.0 GiB, {free} free" in text
    held = [line for line in lines if line.startswith("  - ") and "PID" in line]
    assert str(neighbours.greedy) in held[0] and "12.3 GiB, preallocated" in held[0]
    assert "time.sleep(120)" in text
    assert f"`%jaxmem shutdown {neighbours.greedy} --yes`" in text


def test_a_process_on_two_gpus_is_inspected_once_and_listed_twice(neighbours):
    gpus = [gpu(used=preallocation(), index=0), gpu(used=preallocation(), index=1)]
    listed = [
        GpuProcess(neighbours.greedy, 0, preallocation()),
        GpuProcess(neighbours.greedy, 1, None),
    ]
    tenants = attribute(listed, gpus, sessions=NO_SERVERS, check_device_files=False)

    assert [(t.gpu, t.kind, t.preallocated) for t in tenants] == [
        (0, "kernel", True),
        (1, "kernel", None),  # NVML did not give its bytes there: cannot tell
    ]
    assert Path(tenants[1].notebook).name == "train.ipynb"


def test_notebook_paths_are_shown_as_people_read_them(tmp_path):
    import os

    from jax_nbmem.tenants.attribution import shown_notebook

    home = os.path.expanduser("~")
    assert shown_notebook(f"{home}/work/train.ipynb", None) == "~/work/train.ipynb"
    assert shown_notebook("/srv/shared/x.ipynb", None) == "/srv/shared/x.ipynb"
    assert shown_notebook("work/train.ipynb", None) == "work/train.ipynb"  # a server's own
    assert shown_notebook(None, None) is None
    assert shown_notebook(f"{home}/a.ipynb", "no-such-user-here") == f"{home}/a.ipynb"


def test_warnings_and_the_oom_diagnosis_name_a_mig_instance():
    me = os.getpid()
    place = MigInstance(0, "GPU-0", 1, 0, "3g.71gb")
    held = preallocation(71)  # 75% of the instance's memory, not of the GPU's 141 GiB
    instance = GpuMemory(2, "MIG-x", "NVIDIA H200 MIG 3g.71gb", 71 * GiB, held, 71 * GiB - held,
                         mig=place)  # fmt: skip
    listed = [GpuProcess(me, 2, held)]
    tenants = attribute(listed, [instance], environ={}, sessions=NO_SERVERS,
                        check_device_files=False)  # fmt: skip
    assert (tenants[0].kind, tenants[0].preallocated) == ("self", True)
    [warning] = warnings_for(
        tenants, [instance], own_backend_started=True, own_jax_in_use=100 * MiB,
        own_reserved=int(0.75 * 71 * GiB),
    )  # fmt: skip
    assert warning.gpu == 2
    assert f"preallocated {format_bytes(held)} of MIG 3g.71gb instance 1 of GPU 0 " in (
        warning.message
    )
    text = oom_diagnosis(tenants, [instance])
    assert "MIG 3g.71gb instance 1 of GPU 0 (NVIDIA H200 MIG 3g.71gb): " in text


def test_a_collective_allocator_beside_the_pool_still_reads_as_preallocated():
    """The collective allocator's MiB sit beside the 75% pool, and NVML counts both."""
    from jax_nbmem.tenants.verdicts import ProcessInfo, judge_preallocation

    total = 80 * 1024**3
    held = int(0.75 * total) + (300 << 20) + (8 << 30)  # pool, context, 8 GiB of collectives
    plain = ProcessInfo(pid=7, kind="kernel", runs_jax=True, allocator_env={})
    assert judge_preallocation(plain, held, total) is False  # 8 GiB too many for a pool
    env = {"XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB": "8192"}
    collective = ProcessInfo(pid=7, kind="kernel", runs_jax=True, allocator_env=env)
    assert judge_preallocation(collective, held, total) is True
