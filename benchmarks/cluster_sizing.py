"""Cluster scale: what one node of 8 GPUs x 200 pods' kernels costs Prometheus, measured.

    python benchmarks/cluster_sizing.py [--nodes 4] [--gpus 8] [--per-gpu 200]
                                        [--scrapes 8] [--interval 15] [--json PATH]

Each node is a real ``jax-nbmem exporter`` process (its HTTP server, its snapshot thread, its
scrape cache) serving the simulated node of benchmarks/scrape.py (tests/metrics/
test_exposition.py's ``node_report``: every figure its own, hub kernel ids, nested notebook
paths) with each process in a z2jh pod of its own (container ``notebook``, pod
``jupyter-<hub user>-<pid>``, namespace ``jhub``: 1,600 pods), taken again at every refresh.
Only the look at the GPUs is replaced: no machine here has 1,600 kernels on 8 GPUs.

1. One node, scraped over HTTP as Prometheus asks (``Accept-Encoding: gzip``, which the exporter
   does not apply): bytes per scrape (and gzip'd, for a proxy that compresses), series per
   family, label names and how many values each takes (cardinality), time to first byte.
2. A real Prometheus (Debian's, on loopback) scraping ``--nodes`` such exporters (each its own
   UUIDs, host name and pods) every ``--interval`` seconds for ``--scrapes`` rounds: head
   series, and its heap and resident memory before the first scrape and after the last. The
   memory per series is the difference over the series.

From those: the sizing for 100 nodes in docs/metrics.md ("Cluster scale"), on paper.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def kubernetes_report(gpus: int, per_gpu: int, seed: int) -> dict:
    """node_report's node (GPUs and kernel ids by ``seed``) with every process in a pod."""
    from tests.metrics.test_exposition import node_report

    report = node_report(gpus, per_gpu, seed=seed)
    for process in report["processes"]:
        user = process.get("hub_user") or process["user"]
        process["container"] = {"name": "notebook", "id": f"{process['pid']:064x}",
                                "pod": f"jupyter-{user.replace('@', '-')}-{process['pid']}",
                                "namespace": "jhub"}  # fmt: skip
    return report


def serve_node(seed: int, gpus: int, per_gpu: int) -> None:
    """Run a real exporter whose every look is the simulated node (a subprocess's main)."""
    from jax_nbmem.cli.exporter import Exporter, ExporterSettings
    from jax_nbmem.metrics.metrics import Snapshot

    report = kubernetes_report(gpus, per_gpu, seed)
    socket.gethostname = lambda: f"node-{seed}"  # each node its Hostname, as on a cluster

    class Replayed(Exporter):
        def take_snapshot(self) -> Snapshot:
            began = time.monotonic()
            fresh = json.loads(json.dumps(report))  # a new report each look, as collect() makes
            return Snapshot(fresh, time.time(), round(time.monotonic() - began, 4))

    exporter = Replayed(ExporterSettings("127.0.0.1:0", 5.0, agent=False))
    exporter.serve(ready=lambda url: print(url, flush=True))


def start_nodes(count: int, gpus: int, per_gpu: int) -> list[tuple[subprocess.Popen, str]]:
    nodes = []
    for seed in range(count):
        process = subprocess.Popen(
            [sys.executable, __file__, "--serve-node", str(seed), "--gpus", str(gpus),
             "--per-gpu", str(per_gpu)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        nodes.append((process, process.stdout.readline().strip()))
    return nodes


def fetch(url: str) -> tuple[bytes, float]:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as reply:
        body = reply.read()
        if reply.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return body, time.perf_counter() - began


def one_node(url: str) -> dict:
    """Bytes, series per family, label cardinality of one scrape of one node."""
    from prometheus_client.parser import text_string_to_metric_families

    time.sleep(1.0)  # a first snapshot
    body, took = fetch(url)
    body, took_again = fetch(url)
    per_family, values = Counter(), defaultdict(set)
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            per_family[sample.name] += 1
            for name, value in sample.labels.items():
                values[name].add(value)
    ours = {k: v for k, v in per_family.items() if k.startswith("jax_nbmem_")}
    return {
        "bytes": len(body), "gzip_bytes": len(gzip.compress(body, 6)),
        "series": sum(per_family.values()), "jax_nbmem_series": sum(ours.values()),
        "per_family": dict(per_family.most_common()),
        "label_values": {k: len(v) for k, v in sorted(values.items(), key=lambda kv: -len(kv[1]))},
        "first_scrape_s": round(took, 4), "cached_scrape_s": round(took_again, 4),
    }  # fmt: skip


def prometheus_query(base: str, expr: str) -> float:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=30) as reply:
        result = json.loads(reply.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def _config(targets: list[str], interval: float, own: str) -> str:
    return json.dumps({
        "global": {"scrape_interval": f"{interval:g}s",
                   "scrape_timeout": f"{min(interval, 10):g}s"},
        "scrape_configs": [
            {"job_name": "jax_nbmem", "honor_labels": True,
             "static_configs": [{"targets": targets}]},
            {"job_name": "prometheus", "static_configs": [{"targets": [own]}]},
        ],
    })  # fmt: skip


def _own(base: str, expr: str, wait: float) -> float:
    """An instant query about Prometheus itself, once its own scrape has it (NaN: never)."""
    deadline = time.monotonic() + wait
    while True:
        value = prometheus_query(base, expr)
        if value == value or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def prometheus_run(urls: list[str], scrapes: int, interval: float) -> dict:
    """Head series and memory of a real Prometheus before and after it scrapes ``urls``."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    work = Path(tempfile.mkdtemp(prefix="jax_nbmem-sizing-"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    own = f"127.0.0.1:{port}"
    config = work / "prometheus.yml"
    config.write_text(_config([], interval, own))  # itself only, for the baseline
    log = (work / "log").open("wb")
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address={own}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://{own}"
    memory = {
        "heap_inuse_bytes": 'go_memstats_heap_inuse_bytes{job="prometheus"}',
        "resident_bytes": 'process_resident_memory_bytes{job="prometheus"}',
        "head_series": 'prometheus_tsdb_head_series{job="prometheus"}',
    }
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=2)
                break
            except OSError:
                if process.poll() is not None:
                    raise RuntimeError((work / "log").read_text()[-3000:]) from None
                time.sleep(0.2)
        time.sleep(3 * interval)  # a few looks at itself
        before = {k: _own(base, q, 3 * interval) for k, q in memory.items()}
        config.write_text(_config([u.split("/")[2] for u in urls], interval, own))
        process.send_signal(signal.SIGHUP)  # now the nodes too
        time.sleep(scrapes * interval + interval + 2)
        after = {k: _own(base, q, 3 * interval) for k, q in memory.items()}
        after["scrape_duration_s"] = prometheus_query(
            base, 'max(scrape_duration_seconds{job="jax_nbmem"})'
        )
        after["samples_scraped"] = prometheus_query(
            base, 'sum(scrape_samples_scraped{job="jax_nbmem"})'
        )
    finally:
        process.terminate()
        process.wait(30)
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    added = after["head_series"] - before["head_series"]
    heap = after["heap_inuse_bytes"] - before["heap_inuse_bytes"]
    resident = after["resident_bytes"] - before["resident_bytes"]
    return {
        "before": before, "after": after, "series_added": added,
        "heap_per_series_bytes": round(heap / added),
        "resident_per_series_bytes": round(resident / added),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--per-gpu", type=int, default=200)
    parser.add_argument("--scrapes", type=int, default=8)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--serve-node", type=int, metavar="SEED", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_node is not None:
        serve_node(args.serve_node, args.gpus, args.per_gpu)
        return 0
    nodes = start_nodes(args.nodes, args.gpus, args.per_gpu)
    try:
        node = one_node(nodes[0][1])
        exporter_rss = node["per_family"] and fetch(nodes[0][1])[0].decode()
        rss = [line for line in exporter_rss.splitlines()
               if line.startswith("process_resident_memory_bytes ")]  # fmt: skip
        node["exporter_resident_bytes"] = float(rss[0].split()[1]) if rss else None
        prometheus = prometheus_run([url for _, url in nodes], args.scrapes, args.interval)
    finally:
        for process, _ in nodes:
            process.terminate()
            process.wait(30)
    result = {"node": node, "prometheus": prometheus, "nodes": args.nodes,
              "gpus": args.gpus, "per_gpu": args.per_gpu}  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
