"""What the node agent adds to the exporter's refresh, with 8 GPUs x 200 processes in containers.

    python benchmarks/agent_resolve.py [--gpus 8] [--per-gpu 200] [--per-container 4]
                                       [--kernels 1.0] [--rounds 15] [--proc DIR] [--pods]
                                       [--json PATH]

The processes are a synthetic /proc tree (on /dev/shm, a tmpfs like /proc: one directory per
process with ``stat``, ``status`` with its NSpid, ``cgroup`` naming a Docker container, and
``ns/pid``), and Docker's container configs beside it (names), since a shared 2-core machine
cannot run 1,600 processes in 400 PID namespaces; ``--proc /proc`` times the real /proc of
whatever runs instead (its own PIDs). A fraction ``--kernels`` of them are proven kernels, each
with a beacon of ~1 KiB, as the agent's registry holds them.

What is timed is what the agent adds to one refresh beyond the status the exporter already
took: the registry's check that its kernels still run, the host's proof (beacons of namespaced
PIDs, each process entry's container and in-container PID), the resolution built and written
(atomically, JSON), and the sweep of the share directory for dead kernels' files. Steady
state: the views cached by (PID, start ticks), as from the second refresh on; uncached: a
fresh viewer each round (1,600 new processes, container names read from Docker's configs).
Medians of ``--rounds``. ``reader_text_ms``: making the text a reader of one namespace may
see (what a pod's kernel reads over TCP; made once a pass and namespace, then reused).

``--pods``: Kubernetes instead of Docker, as the DaemonSet's agent sees it (deploy/kubernetes/):
each process a z2jh user's pod of its own (``--per-container`` is then 1), its cgroup a
containerd scope under the systemd driver read from the agent's private cgroup namespace
(``0::/../../kubepods.slice/...``), and names from the kubelet's log directories
(``/var/log/pods/<namespace>_<pod>_<uid>``, ``/var/log/containers/<pod>_<namespace>_<container>
-<id>.log``), as many entries as pods.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jax_nbmem.agent.cgroups import ContainerNames  # noqa: E402
from jax_nbmem.agent.hostproof import HostProof  # noqa: E402
from jax_nbmem.agent.hostview import HostViewer  # noqa: E402
from jax_nbmem.agent.publish import (  # noqa: E402
    ResolutionWriter,
    clean_dead,
    write_resolution,
)
from jax_nbmem.agent.server import Registration, Registry, beacon_from_content  # noqa: E402


def fake_pods(root: Path, pids: list[int]) -> None:
    """As :func:`fake_proc`, each PID in a z2jh pod of its own (see the module's ``--pods``)."""
    fake_proc(root, pids, 1)
    (root / "pods").mkdir()
    (root / "containers").mkdir()
    for n, pid in enumerate(pids):
        container = f"{n:064x}"
        uid = f"{n:08x}-1111-2222-3333-{pid:012x}"
        pod = f"jupyter-user{n}"
        slice_ = f"kubepods-burstable-pod{uid.replace('-', '_')}"
        path = f"kubepods.slice/kubepods-burstable.slice/{slice_}"
        (root / "proc" / str(pid) / "cgroup").write_text(
            f"0::/../../{path}.slice/cri-containerd-{container}.scope\n"
        )
        (root / "pods" / f"jhub_{pod}_{uid}" / "notebook").mkdir(parents=True)
        (root / "containers" / f"{pod}_jhub_notebook-{container}.log").write_text("")


def fake_proc(root: Path, pids: list[int], per_container: int) -> None:
    """One /proc/PID directory per PID, in containers of ``per_container`` processes each."""
    for n, pid in enumerate(pids):
        container = f"{n // per_container:064x}"
        base = root / "proc" / str(pid)
        (base / "ns").mkdir(parents=True)
        fields = ["S", "1"] + ["0"] * 17 + [str(100000 + pid)] + ["0"] * 30
        (base / "stat").write_text(f"{pid} (python3 -m ipykernel_launcher) {' '.join(fields)}\n")
        (base / "status").write_text(
            f"Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t{pid}\t{7 + n % 50}\n"
        )
        (base / "cgroup").write_text(f"0::/system.slice/docker-{container}.scope\n")
        (base / "ns" / "pid").write_text("")
        config = root / "docker" / "containers" / container
        if not config.exists():
            config.mkdir(parents=True)
            (config / "config.v2.json").write_text(json.dumps({"Name": f"/jupyter-user{n}"}))


def beacon(pid_in_ns: int, n: int) -> dict:
    """A kernel's beacon of the usual size (~1 KiB)."""
    return {
        "schema": 1, "pid": pid_in_ns, "started_at": time.time() - 3600, "user": "jovyan",
        "kernel_id": f"{n:08x}-1111-2222-3333-444455556666", "notebook": f"work/nb{n}.ipynb",
        "mode_requested": "on", "mode_in_effect": "on", "pool_fraction": 0.75,
        "gpus": {f"GPU-{n % 8:08x}-0000-0000-0000-000000000000": {
            "bytes_in_use": 1 << 30, "pool_bytes": 60 << 30, "bytes_limit": 60 << 30,
            "peak_bytes_in_use": 2 << 30}},
        "cell_running": False, "last_cell_finished_at": time.time() - 60, "written_at": 0,
        "jax": "0.6.0", "jaxlib": "0.6.0", "jax_nbmem": "0.1", "hub_user": f"user{n}",
        "variables": {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"},
        "identity": {"pid_ns": [4, 4026532000 + n], "pid_in_ns": pid_in_ns,
                     "start_ticks": 100000, "boot_id": "b", "hostname": f"{n:012x}"},
    }  # fmt: skip


def one_pass(report, registry, viewer, writer, share: Path, agent: Path, interval: float):
    """The agent's share of one refresh (see the module): (wall, CPU) seconds."""
    began, cpu = time.perf_counter(), time.process_time()
    views: dict = {}
    registrations = registry.proven(views)
    proof = HostProof.from_registry(registrations, viewer, views)
    pids = [p["pid"] for p in report["processes"]]
    proof.beacons({}, pids)
    processes = [dict(p) for p in report["processes"]]
    proof.annotate(processes)
    text = writer.text(report, registrations, proof.view, interval_s=interval)
    full = writer.full_text()  # as the exporter: every name in root's file, where some are hidden
    write_resolution(str(agent), text, None if full == text else full)
    clean_dead(str(share), [r.key for r in registrations.values()])
    return time.perf_counter() - began, time.process_time() - cpu


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--per-gpu", type=int, default=200)
    parser.add_argument("--per-container", type=int, default=4)
    parser.add_argument("--kernels", type=float, default=1.0, help="share of proven kernels")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--proc", help="time this /proc instead of a synthetic tree")
    parser.add_argument("--pods", action="store_true", help="Kubernetes pods, not Docker")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    count = args.gpus * args.per_gpu
    root = Path(tempfile.mkdtemp(prefix="agent-bench-", dir="/dev/shm"))
    try:
        if args.proc:
            proc = args.proc
            pids = sorted(int(n) for n in os.listdir(proc) if n.isdigit())[:count]
        else:
            pids = list(range(10000, 10000 + count))
            if args.pods:
                fake_pods(root, pids)
            else:
                fake_proc(root, pids, args.per_container)
            proc = str(root / "proc")
        names = lambda: ContainerNames(  # noqa: E731
            docker_root=str(root / "docker"), pod_logs=str(root / "pods"),
            container_logs=str(root / "containers"),
        )  # fmt: skip
        share, agent = root / "share", root / "share" / "agent"
        agent.mkdir(parents=True)
        for pid in pids[: count // 10]:  # live kernels' files in the share directory
            (share / f"jax_nbmem-beacon-4026532000-{pid}.json").write_text("{}")
        report = {
            "gpus": [{"index": g, "uuid": f"GPU-{g:08x}"} for g in range(args.gpus)],
            "processes": [{"pid": pid, "gpu": n % args.gpus, "source": "beacon"}
                          for n, pid in enumerate(pids)],
        }  # fmt: skip
        viewer = HostViewer(proc, names())
        registry = Registry(viewer, host_boot_id="b")
        for n, pid in enumerate(pids[: int(count * args.kernels)]):
            view = viewer.view(pid)
            if view is None:
                continue
            content = beacon(view.pid_in_ns, n)
            registry._by_pid[pid] = Registration(
                pid, 1000, view, content, beacon_from_content(content, pid), time.time(), n
            )
        writer = ResolutionWriter()
        one_pass(report, registry, viewer, writer, share, agent, 5.0)  # warm: caches filled
        steady, reader = [], []
        for _ in range(args.rounds):
            steady.append(one_pass(report, registry, viewer, writer, share, agent, 5.0))
            began = time.perf_counter()  # a pod's kernel's text over TCP: once a pass and namespace
            writer.for_namespace("jhub")
            reader.append(time.perf_counter() - began)
        cold = []
        for _ in range(args.rounds):
            fresh = HostViewer(proc, names())
            registry.viewer = fresh
            cold.append(one_pass(report, registry, fresh, ResolutionWriter(), share, agent, 5.0))
        size = (agent / "resolution.json").stat().st_size
        written = json.loads((agent / "resolution.json").read_text())["processes"]
        named = sum(1 for p in written if (p.get("container") or {}).get("name"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = {
        "processes": len(pids),
        "proven_kernels": len(registry._by_pid),
        "proc": args.proc or "synthetic (/dev/shm)",
        "containers": "kubernetes pods" if args.pods else "docker",
        "steady_ms": _ms(statistics.median(w for w, _ in steady)),
        "steady_cpu_ms": _ms(statistics.median(c for _, c in steady)),
        "steady_max_ms": _ms(max(w for w, _ in steady)),
        "uncached_ms": _ms(statistics.median(w for w, _ in cold)),
        "uncached_cpu_ms": _ms(statistics.median(c for _, c in cold)),
        "reader_text_ms": _ms(statistics.median(reader)),
        "load_average": round(os.getloadavg()[0], 1),
        "resolution_bytes": size,
        "containers_named": named,
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
