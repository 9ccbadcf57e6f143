"""The server extension's snapshot on a Kubernetes node: kernels in pods, and one on the host.

:func:`pod_snapshot` runs the extension's own :class:`~jax_nbmem.server.monitor.ServerMonitor`
over the simulated GPU, with the host's view of the processes (a synthetic /proc, in pods of the
stand-in Kubernetes API, as tests/agent/test_podnames.py builds them): what the board and the
JupyterLab sidebar are given for processes in containers.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from jax_nbmem.agent.cgroups import ContainerNames
from jax_nbmem.agent.hostproof import HostProof
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.server.monitor import ServerMonitor
from jax_nbmem.simgpu import GIB
from jax_nbmem.tenants.status import collect
from tests.agent.test_hostview import fake_process
from tests.agent.test_podnames import ALICE_CID, ALICE_UID, ML_CID, ML_UID, two_pods

__all__ = ["ALICE_CID", "KERNEL_ID", "Pids", "pod_snapshot"]
KERNEL_ID = "5f1c0d2e-0000-4000-8000-000000000001"


@dataclass(frozen=True)
class Pids:
    """The three processes on the GPU: alice's kernel in her pod, a training job's in its pod
    (CRI-O's cgroupfs shape), and a plain one on the host."""

    alice: int
    train: int
    plain: int


class _Kernels:
    """This server's one kernel: alice's, in her pod."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def list_kernels(self):
        return [{"id": KERNEL_ID, "name": "python3", "execution_state": "idle"}]

    def get_kernel(self, kernel_id):
        provisioner = type("Provisioner", (), {"pid": self.pid})()
        return type("Manager", (), {"provisioner": provisioner})()


class _Sessions:
    async def list_sessions(self):
        return [{"path": "alice/train.ipynb", "kernel": {"id": KERNEL_ID}}]


def _synthetic_proc(root: Path, pids: Pids) -> None:
    """The host's view of their cgroups and namespaces (the real /proc tells who runs them)."""
    slice_ = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    alice = f"{slice_}{ALICE_UID.replace('-', '_')}.slice/cri-containerd-{ALICE_CID}.scope\n"
    fake_process(root, pids.alice, nspids=(pids.alice, 7), ticks=11, cgroup=alice)
    train = f"0::/kubepods/burstable/pod{ML_UID}/{ML_CID}\n"  # the cgroupfs driver
    fake_process(root, pids.train, nspids=(pids.train, 1), ticks=12, cgroup=train)
    fake_process(root, pids.plain, ticks=13)  # on the host itself: no container


def _sleeper(stack: ExitStack) -> int:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    stack.callback(process.wait)
    stack.callback(process.kill)
    return process.pid


def pod_snapshot(sim_state, tmp_path: Path) -> tuple[dict, Pids]:
    """One snapshot of a ServerMonitor whose GPU holds the three processes (see the module).

    Needs ``simgpu_in_process`` (this process's NVML is the simulated GPU of ``sim_state``).
    The processes are real (sleepers, ended on return): only their cgroups are synthetic.
    """
    with ExitStack() as stack:
        pids = Pids(_sleeper(stack), _sleeper(stack), _sleeper(stack))
        return _snapshot(sim_state, tmp_path, pids), pids


def _snapshot(sim_state, tmp_path: Path, pids: Pids) -> dict:
    state = sim_state.gpu(0, total=80 * GIB).process(0, pids.alice, 20 * GIB)
    state.process(0, pids.train, 8 * GIB).process(0, pids.plain, 2 * GIB).write()
    _synthetic_proc(tmp_path / "proc", pids)
    with two_pods(tmp_path) as directory:
        pass  # listed once: the names are in the directory's cache
    names = ContainerNames(pod_logs="/nonexistent", container_logs="/nonexistent", pods=directory)
    viewer = HostViewer(str(tmp_path / "proc"), names=names)
    report = functools.partial(collect, host=HostProof(viewer, {}))
    monitor = ServerMonitor(_Kernels(pids.alice), _Sessions(), share_dir=str(tmp_path / "share"),
                            report=report)  # fmt: skip

    async def one_refresh():
        await monitor.tick()
        deadline = time.monotonic() + 30
        while monitor.refreshes == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await monitor.stop()

    # On a thread of its own: a caller may run in an event loop (Playwright's sync API does).
    with ThreadPoolExecutor(1) as worker:
        worker.submit(lambda: asyncio.run(one_refresh())).result()
    snapshot = monitor.snapshot()
    if snapshot is None:
        raise RuntimeError("the monitor took no snapshot in 30 s")
    return snapshot
