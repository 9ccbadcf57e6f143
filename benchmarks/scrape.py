"""What a scrape of a full node costs the exporter: 8 GPUs x 200 processes, in CPU time.

    python benchmarks/scrape.py [--gpus 8] [--per-gpu 200] [--rounds 30] [--against REV]
                                [--generic] [--json PATH]

Times, in CPU seconds of this process (``time.process_time``, the garbage collector on, as in
the exporter), what ``/metrics`` does for our families: build them from the snapshot
(``metric_families``) and write them (``exposition``); a scrape that comes again before the
next snapshot (``ScrapeCache``, kept text); a ``name[]=jax_nbmem_up`` scrape of a new
snapshot, and the exporter's steady state: each scrape a new snapshot (a refresh later: idle
times grown, one process in ten with more memory) whose label sets and values mostly were
written for the snapshot before. ``--against REV`` also times the writer of a git revision (its
``jax_nbmem/metrics/metrics.py``, loaded beside this one), and ``--generic`` prometheus_client's
own ``generate_latest`` over the same families (slow: a few rounds). The set-ups alternate round
by round and medians are compared within the run, so a busy machine slows each alike. The
snapshot is ``tests/metrics/test_exposition.py``'s ``node_report``: every figure its own, hub
kernel ids, nested notebook paths, a few labels to escape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jax_nbmem.metrics import metrics  # noqa: E402
from jax_nbmem.metrics.exposition import ScrapeCache, exposition  # noqa: E402
from tests.metrics.test_exposition import generic_text, node_report  # noqa: E402


def module_at(rev: str) -> types.ModuleType:
    """``jax_nbmem/metrics/metrics.py`` as it was at git revision ``rev``."""
    source = subprocess.run(
        ["git", "show", f"{rev}:jax_nbmem/metrics/metrics.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    module = types.ModuleType(f"metrics_at_{rev}")
    module.__dict__["__name__"] = module.__name__
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:metrics.py", "exec"), module.__dict__)
    return module


def next_report(report: dict) -> dict:
    """The same node a refresh later: every idle kernel 5 s idler, one process in 10 grown."""
    processes = []
    for i, process in enumerate(report["processes"]):
        process = dict(process)
        if process.get("idle_s") is not None:
            process["idle_s"] = process["idle_s"] + 5
        if i % 10 == 3:
            process["used_bytes"] += 2 * 1024**2
        processes.append(process)
    return {**report, "processes": processes}


def cpu_ms(work) -> float:
    began = time.process_time()
    work()
    return (time.process_time() - began) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--per-gpu", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--against", metavar="REV", help="also time this git revision's writer")
    parser.add_argument("--generic", action="store_true", help="also prometheus_client's writer")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()

    report = node_report(args.gpus, args.per_gpu)
    taken = time.time()
    snapshot = metrics.Snapshot(report, taken, 0.03)
    now = taken + 1
    ours = exposition(metrics.metric_families(snapshot, now=now, stale_after_s=60))
    setups = {
        "families": lambda: metrics.metric_families(snapshot, now=now, stale_after_s=60),
        "families + text (a new snapshot)": lambda: exposition(
            metrics.metric_families(snapshot, now=now, stale_after_s=60)
        ),
        "name[]=jax_nbmem_up (a new snapshot)": lambda: ScrapeCache(60).text(
            snapshot, {"jax_nbmem_up"}, now=now
        ),
    }
    # The exporter's steady state: each scrape a new snapshot, the last one's texts reused.
    snapshots = [snapshot, metrics.Snapshot(next_report(report), taken + 5, 0.03)]
    steady = ScrapeCache(60)
    turn = iter(range(10**9))
    setups["a new snapshot, the last one's texts reused"] = lambda: steady.text(
        snapshots[next(turn) % 2], now=now
    )
    kept = ScrapeCache(60)
    kept.text(snapshot, now=now)
    setups["the same snapshot again (kept)"] = lambda: kept.text(snapshot, now=now)
    if args.against:
        old = module_at(args.against)
        old_snapshot = old.Snapshot(report, taken, 0.03)
        setups[f"families + text at {args.against}"] = lambda: old.exposition(
            old.metric_families(old_snapshot, now=now, stale_after_s=60)
        )
    generic_every = max(1, args.rounds // 5)
    if args.generic:
        setups["prometheus_client's generate_latest"] = lambda: generic_text(snapshot, now)
        assert generic_text(snapshot, now) == ours, "the two writers differ"

    times: dict[str, list[float]] = {name: [] for name in setups}
    for round_ in range(args.rounds):
        names = list(setups)
        names = names[round_ % len(names) :] + names[: round_ % len(names)]  # rotate the order
        for name in names:
            if name.startswith("prometheus_client") and round_ % generic_every:
                continue
            times[name].append(cpu_ms(setups[name]))

    result = {
        "processes": args.gpus * args.per_gpu,
        "bytes": len(ours),
        "cpu_ms_median": {name: round(statistics.median(t), 2) for name, t in times.items()},
        "cpu_ms_min": {name: round(min(t), 2) for name, t in times.items()},
        "rounds": {name: len(t) for name, t in times.items()},
    }
    width = max(map(len, times))
    print(f"{args.gpus} GPUs x {args.per_gpu} processes, {len(ours):,} bytes of text")
    print(f"{'':{width}}  median ms  min ms  rounds")
    for name, t in times.items():
        print(f"{name:{width}}  {statistics.median(t):9.1f}  {min(t):6.1f}  {len(t):6d}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
