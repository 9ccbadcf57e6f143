"""What another user's junk in the shared beacon directory costs everyone's status.

    python benchmarks/share_dir.py [--junk 5000] [--processes 8] [--rounds 15] [--json PATH]

One process times ``jax_nbmem.tenants.status.collect`` (what ``%jaxmem status``,
``jax-nbmem status`` and the server extension's refresh each run) with the shared directory
empty, and with ``--junk`` files written there by someone else: beacon names of live processes
that are not on the GPU, of dead and impossible PIDs, 64 KiB files, arrays nested 5,000 deep,
FIFOs and names that are no beacon's at all. The GPU is the simulated one (a C compiler is
needed), with ``--processes`` real processes on it, each with a beacon of its own. The two
set-ups alternate, round by round, and the ratio junk / empty is taken between medians of the
same run, so the machine's speed cancels out. Also timed: the server's refresh (the same
collect with the server's sessions handed in), and a listing of the directory
(``read_beacons(dirs)`` without PIDs, which tools may use and a status never does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jax_nbmem import simgpu  # noqa: E402

GIB = simgpu.GIB


def write_junk(folder: Path, count: int) -> None:
    """``count`` files of junk, of every kind a status must not read."""
    live = [os.getpid(), os.getppid(), 1]
    deep = "[" * 5000 + "]" * 5000
    big = " " * (64 * 1024 - 2) + "{}"
    for i in range(count):
        kind = i % 8
        if kind == 0:
            path = folder / f"jax_nbmem-beacon-{live[i % 3]}-{i}.json"
        elif kind == 1:
            path = folder / f"jax_nbmem-beacon-{4_000_000 + i}.json"
        elif kind == 2:
            path = folder / f"jax_nbmem-beacon-{i}x.json"
        elif kind == 3:
            path = folder / f"jax_nbmem-beacon-0{i}.json"
        elif kind == 4 and i % 80 == 4:
            os.mkfifo(folder / f"jax_nbmem-beacon-fifo-{i}.json")
            continue
        else:
            path = folder / f"junk-{i}.json"
        path.write_text(big if kind == 5 else deep)
    for pid in live:  # beacons of live processes not on the GPU, under their true names
        (folder / f"jax_nbmem-beacon-{pid}.json").write_text(deep)


def beacon(pid: int) -> dict:
    import psutil

    from jax_nbmem.node.beacons import SCHEMA

    return {
        "schema": SCHEMA,
        "pid": pid,
        "started_at": psutil.Process(pid).create_time(),
        "notebook": f"/home/ada/{pid}.ipynb",
        "mode_requested": "off",
        "mode_in_effect": "off",
        "pool_fraction": 0.0,
        "gpus": {},
        "cell_running": False,
        "last_cell_finished_at": time.time() - 60,
        "written_at": time.time(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--junk", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="jax_nbmem-share-bench-"))
    try:
        lib = simgpu.build(folder / "lib")
    except Exception as exc:  # no compiler: nothing to measure against
        print(f"cannot build the simulated GPU ({exc}): nothing measured")
        return 1
    simgpu.preload(lib)
    state = simgpu.SimState(folder / "gpu.state").gpu(0, total=80 * GIB)
    os.environ[simgpu.STATE_ENV_VAR] = str(state.path)
    os.environ["JUPYTER_RUNTIME_DIR"] = str(folder / "runtime")  # nobody else's beacons

    from jax_nbmem.gpu import nvml
    from jax_nbmem.node.beacons import read_beacons
    from jax_nbmem.node.servers import SessionIndex
    from jax_nbmem.tenants.status import collect

    nvml._reset_for_tests(retry_first_s=0.0)
    empty, junk = folder / "empty", folder / "junk"
    empty.mkdir(), junk.mkdir()
    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        for _ in range(args.processes)
    ]
    try:
        for process in sleepers:
            state.process(0, process.pid, 2 * GIB)
            for share in (empty, junk):
                path = share / f"jax_nbmem-beacon-{process.pid}.json"
                path.write_text(json.dumps(beacon(process.pid)))
        state.write()
        write_junk(junk, args.junk)

        def status(share: Path) -> float:
            began = time.perf_counter()
            report = collect(share_dir=str(share))
            took = time.perf_counter() - began
            sources = {p["source"] for p in report["processes"]}
            assert sources == {"beacon"}, sources  # every process judged by its own beacon
            return took

        def refresh(share: Path) -> float:  # as the server extension's monitor calls it
            began = time.perf_counter()
            collect(share_dir=str(share), sessions=SessionIndex({}))
            return time.perf_counter() - began

        def listing(share: Path) -> float:
            began = time.perf_counter()
            read_beacons([str(share)])
            return time.perf_counter() - began

        rows: dict[str, dict[str, list[float]]] = {
            name: {"empty": [], "junk": []} for name in ("status", "server refresh", "listing")
        }
        for measure in (status, refresh, listing):  # warm the caches and NVML once
            measure(empty), measure(junk)
        for number in range(args.rounds):
            order = [(empty, "empty"), (junk, "junk")]
            for share, side in order if number % 2 == 0 else order[::-1]:
                rows["status"][side].append(status(share))
                rows["server refresh"][side].append(refresh(share))
                rows["listing"][side].append(listing(share))
    finally:
        for process in sleepers:
            process.kill()
            process.wait()
        subprocess.run(["rm", "-rf", str(folder)], check=False)

    result = {
        "junk_files": args.junk,
        "gpu_processes": args.processes,
        "rounds": args.rounds,
        "median_ms": {
            name: {side: statistics.median(values) * 1000 for side, values in sides.items()}
            for name, sides in rows.items()
        },
        "python": sys.version.split()[0],
    }
    result["junk_over_empty"] = {
        name: medians["junk"] / medians["empty"] for name, medians in result["median_ms"].items()
    }
    print(f"{args.junk} junk files; {args.processes} processes on the GPU; {args.rounds} rounds")
    print(f"{'':<16}{'empty':>10}{'junk':>10}{'junk/empty':>12}")
    for name, medians in result["median_ms"].items():
        ratio = result["junk_over_empty"][name]
        print(f"{name:<16}{medians['empty']:>7.2f} ms{medians['junk']:>7.2f} ms{ratio:>12.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(result, stream, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
