"""The metrics' text: prometheus_client's byte for byte, fast, kept per snapshot."""

import json
import math
import random
import time

import pytest

from jax_nbmem.metrics.exposition import ScrapeCache, exposition, go_float
from jax_nbmem.metrics.metrics import Snapshot, metric_families, prometheus_collector
from tests.metrics.test_metrics import NOW, report

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from prometheus_client.utils import floatToGoString  # noqa: E402

GIB = 1024**3
MIB = 1024**2


def node_report(gpus: int = 8, per_gpu: int = 200, seed: int = 0) -> dict:
    """A busy node's status report: every process's figures its own, as on a real node.

    Values are spread (bytes in MiB steps, idle times with decimals, 80 GiB totals written
    with a two-digit exponent), names are a hub's (UUID kernel ids, nested notebook paths),
    and a few labels need escaping or are not ASCII.
    """
    rng = random.Random(seed)
    processes = []
    for g in range(gpus):
        for i in range(per_gpu):
            pid = 10_000 + g * per_gpu + i
            user = f"user{rng.randrange(60):02d}"
            processes.append({
                "pid": pid, "gpu": g, "used_bytes": rng.randrange(1, 80_000) * MIB,
                "kind": "kernel" if i % 10 else "process",
                "kernel_id": f"{rng.getrandbits(128):032x}" if i % 10 else None,
                "notebook_shown": f"projects/{user}/exp-{i % 7}/run_{pid}.ipynb",
                "user": user, "hub_user": f"{user}@hub" if i % 3 else None,
                "preallocated": (None, True, False)[i % 3], "mode": ("on", "off")[i % 2],
                "idle_s": round(rng.uniform(0, 86_400), 3) if i % 5 else None,
                "jax": {"bytes_in_use": rng.randrange(0, 60_000) * MIB,
                        "pool_bytes": rng.randrange(0, 70_000) * MIB,
                        "bytes_limit": 75 * GIB} if i % 4 else None,
            })  # fmt: skip
    processes[1]["notebook_shown"] = 'odd "quoted"\\name\nwith a newline.ipynb'
    processes[2]["notebook_shown"] = "Über/ノート.ipynb"
    return {
        "nvml": {"available": True, "reason": None},
        "gpus": [{"index": g, "uuid": f"GPU-{rng.getrandbits(64):016x}",
                  "used_bytes": rng.randrange(80 * 1024) * MIB, "total_bytes": 80 * GIB,
                  "reserved_bytes": 500 * MIB} for g in range(gpus)],
        "processes": processes,
        "warnings": [{"kind": "blocking-preallocation", "gpu": g, "pid": 10_000 + g * per_gpu}
                     for g in range(gpus)],
    }  # fmt: skip


def generic_text(snapshot, now) -> bytes:
    """What prometheus_client's own writer makes of the same families."""
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(prometheus_collector(lambda: snapshot, stale_after_s=60))
    real_time = time.time
    try:  # the collector judges freshness at "now"
        time.time = lambda: now
        return prometheus_client.generate_latest(registry)
    finally:
        time.time = real_time


def test_a_full_node_s_text_is_prometheus_client_s_byte_for_byte():
    snapshot = Snapshot(node_report(), NOW - 1.25, 0.0317)
    ours = exposition(metric_families(snapshot, now=NOW, stale_after_s=60))
    assert ours.count(b"\njax_nbmem_kernel_gpu_memory_bytes{") == 1600
    assert b"8.589934592e+10" in ours  # 80 GiB, as Go writes it
    parsed = {f.name: f.samples for f in text_string_to_metric_families(ours.decode())}
    theirs_text = generic_text(snapshot, NOW)
    theirs = {f.name: f.samples for f in text_string_to_metric_families(theirs_text.decode())}
    assert parsed == theirs  # the same samples, labels and values, whatever the writer's version
    if floatToGoString(1e10) != "1e+10":  # prometheus_client < 0.20 wrote "1e+010"
        pytest.skip("this prometheus_client writes exponents from 10 as e+010, unlike Go")
    assert ours == theirs_text


def test_values_are_written_as_prometheus_client_writes_them():
    rng = random.Random(1)
    values = [0, 0.0, -0.0, 1, -1, 1.5, 999_999, 1_000_000, 123_456_789, 80 * GIB, 2**70,
              1e-7, 0.1 + 0.2, -1e12, math.inf, -math.inf, math.nan, True, False]  # fmt: skip
    values += [rng.uniform(-1e9, 1e9) for _ in range(2000)]
    values += [rng.randrange(2**48) for _ in range(2000)]
    for value in values:
        expected = floatToGoString(value).replace("e+0", "e+") if abs(value) >= 1e10 else None
        assert go_float(value) == (expected or floatToGoString(value)), value


def test_zero_and_minus_zero_are_two_texts_though_one_dict_key():
    found = metric_families(Snapshot(report(), NOW - 1), now=NOW, stale_after_s=15)
    (warnings,) = [f for f in found if f.name == "jax_nbmem_warnings"]
    warnings.samples[:2] = [(warnings.samples[0][0], 0.0), (warnings.samples[1][0], -0.0)]
    lines = exposition([warnings]).decode().splitlines()[2:4]
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["0.0", "-0.0"]


def test_a_name_filter_writes_only_those_families():
    snapshot = Snapshot(report(), NOW - 1)
    families = metric_families(snapshot, now=NOW, stale_after_s=15)
    only = exposition(families, {"jax_nbmem_up", "jax_nbmem_warnings"}).decode()
    assert [line.split()[2] for line in only.splitlines() if line.startswith("# TYPE")] == [
        "jax_nbmem_up", "jax_nbmem_warnings"]  # fmt: skip


def test_a_scrape_again_before_the_next_snapshot_writes_nothing_anew():
    cache = ScrapeCache(stale_after_s=15)
    first = Snapshot(report(), NOW - 1, 0.02)
    text = cache.text(first, now=NOW)
    assert text == exposition(metric_families(first, now=NOW, stale_after_s=15))
    assert cache.text(first, now=NOW + 2) is text and cache.writes == 1
    # A filtered scrape of the same snapshot: those families only, still not built anew.
    only = cache.text(first, {"jax_nbmem_up"}, now=NOW + 3)
    assert only.startswith(b"# HELP jax_nbmem_up ") and only.count(b"# TYPE") == 1
    assert cache.writes == 1
    # The next snapshot is written anew.
    second = Snapshot({**report(), "gpus": report()["gpus"][:1]}, NOW + 4, 0.02)
    assert cache.text(second, now=NOW + 5).count(b"\njax_nbmem_gpu_memory_total_bytes{") == 1
    assert cache.writes == 2


def test_what_is_kept_between_snapshots_stays_bounded():
    cache = ScrapeCache(stale_after_s=15)
    for i in range(600):  # every snapshot's idle times and bytes new, a new process in each
        moved = report()
        for process in moved["processes"]:
            process["idle_s"] = process["idle_s"] and process["idle_s"] + i
            process["used_bytes"] = process["used_bytes"] and process["used_bytes"] + i
        moved["processes"][2] = {**moved["processes"][2], "pid": 1000 + i}
        snapshot = Snapshot(moved, NOW + i)
        text = cache.text(snapshot, now=NOW + i)
        assert text == exposition(metric_families(snapshot, now=NOW + i, stale_after_s=15))
    samples = sum(len(f.samples) for f in metric_families(snapshot, now=NOW + 599))
    assert cache.writes == 600 and cache._writer.kept() <= 6 * samples + 1024


def test_a_kept_text_goes_stale_with_its_snapshot():
    cache = ScrapeCache(stale_after_s=15)
    snapshot = Snapshot(report(), NOW - 1)
    assert b"\njax_nbmem_up 1.0\n" in cache.text(snapshot, now=NOW)
    stale = cache.text(snapshot, now=NOW + 30)  # no new snapshot since: NVML hung
    assert b"\njax_nbmem_up 0.0\n" in stale and b'reason="stale"' in stale
    assert b"jax_nbmem_kernel_gpu_memory_bytes" not in stale
    assert b"jax_nbmem_up 0.0" in ScrapeCache().text(None)  # before the first snapshot


def test_a_scrape_of_8_gpus_with_200_processes_each_is_fast():
    """What the exporter serves for a full node, timed in CPU seconds (median of 15).

    The issue's target is 50 ms; ``benchmarks/scrape.py`` measures it against the writers
    before. The bound here is loose, for a shared and busy CI machine; the figures are printed.
    """
    snapshot = Snapshot(node_report(), time.time())
    cpu = []
    for _ in range(15):
        began = time.process_time()
        text = exposition(metric_families(snapshot, stale_after_s=60))
        cpu.append(time.process_time() - began)
    cpu.sort()
    print(json.dumps({"scrape_cpu_ms_median": round(cpu[7] * 1000, 1), "bytes": len(text)}))
    assert cpu[7] < 0.2
