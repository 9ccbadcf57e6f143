"""Bytes per live-panel update and update rate after simulated 1 h and 24 h sessions.

Feeds a SampleHistory with 10 Hz samples whose values change at every sample (the worst case
for the panel: nothing repeats, so nothing is dropped), one cell a minute, then measures what
the panel's plot widget sends over its comm for each update and how long an update takes: wall
time, and CPU time of the updating thread (Python holding the GIL, which a user's CPU-bound
cell on the main thread loses). "CPU share at 4 updates/s" is the median CPU time times the
panel's highest update rate: the slowdown such a cell sees while the panel is shown.

Then what a cell's end costs the kernel's main thread: the widget's push after a cell
(``LivePanel.push_after_cell``: the session re-read, the figure rebuilt, what changed sent,
what the thread set resent; it runs after the cell's reply, not inside the cell) with the
bytes it sends, and the static panel's redraw (``fallback_bundle(..., "static")``: the figure,
its SVG and the text, sent in the cell's own ``update_display``).

    python benchmarks/panel_payload.py [--hours 1 24] [--updates 60]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from types import SimpleNamespace

from jax_nbmem.notebook import panel_live
from jax_nbmem.notebook.panel_text import fallback_bundle
from jax_nbmem.record.ledger import CellRecord
from jax_nbmem.record.sampler import GpuSample, HostSample, Sample, SampleHistory

GIB = 1024**3
MIB = 1024**2
RATE_HZ = 10


def noisy_sample(t: float, i: int) -> Sample:
    wobble = (i * 7919) % 4096 * MIB
    gpu = GpuSample(0, "GPU-0", "NVIDIA H200 (simulated)", 141 * GIB, 30 * GIB + wobble,
                    111 * GIB - wobble, 10 * GIB + wobble, 20 * GIB + wobble // 3,
                    4 * GIB + wobble, 8 * GIB, 6 * GIB + wobble, 100 * GIB)  # fmt: skip
    return Sample(t=t, gpus=(gpu,), host=HostSample(2 * GIB + wobble, 4 * GIB))


def record(n: int, t: float) -> CellRecord:
    return CellRecord(n, f"step({n})", t, 2.0, n % 17 != 0, None, n % 53 == 0, 1,
                      10 * GIB, 14 * GIB, 11 * GIB, 4 * GIB, 9 * GIB, 5 * GIB, False, None,
                      None, None, None, None, None, None)  # fmt: skip


class FakeSampler:
    """What the panel reads from a Sampler: history, latest, subscribe, interval."""

    interval = 1 / RATE_HZ
    last_error = None

    def __init__(self, history: SampleHistory):
        self._history = history
        self._latest = None

    def add(self, sample: Sample) -> None:
        self._history.add(sample)
        self._latest = sample

    def latest(self):
        return self._latest

    def history(self, since=None):
        return self._history.samples(since)

    def subscribe(self, callback):
        return lambda: None


def simulate(hours: float, updates: int) -> dict:
    start = time.time() - hours * 3600
    sampler = FakeSampler(SampleHistory())
    count = int(hours * 3600 * RATE_HZ)
    for i in range(count):
        sampler.add(noisy_sample(start + i / RATE_HZ, i))
    records = [record(n, start + 60 * n) for n in range(1, int(hours * 60))]
    session = SimpleNamespace(
        settings=SimpleNamespace(panel="widget"), sampler=sampler,
        ledger=SimpleNamespace(recent=lambda n: records[-n:]), control=None,
        banner_messages=lambda: ["NVML: ok"],
    )  # fmt: skip
    began = time.perf_counter()
    live = panel_live.LivePanel(session)
    live.widget._repr_mimebundle_()
    first_render_s = time.perf_counter() - began
    sent: list[int] = []
    messages: list[int] = []

    def record_send(data=None, buffers=None, **_):
        size = len(json.dumps(data, default=str)) + sum(len(b) for b in buffers or ())
        sent.append(size)
        messages.append(size)

    live.plot.comm.send = record_send
    # The simulation allocated in seconds what a session allocates over hours: let Python's
    # full collection (its cost grows with every object alive) run now, not in a measured update.
    gc.collect()
    sizes, durations, cpu_times = [], [], []
    t = start + count / RATE_HZ
    for u in range(updates):
        for _ in range(3):  # what 0.25 s brings at 10 Hz (rounded up)
            sampler.add(noisy_sample(t, count))
            t, count = t + 1 / RATE_HZ, count + 1
        if u % 5 == 4:
            records.append(record(len(records) + 1, t))
        sent.clear()
        began, began_cpu = time.perf_counter(), time.thread_time()
        live.update()
        durations.append(time.perf_counter() - began)
        cpu_times.append(time.thread_time() - began_cpu)
        sizes.append(sum(sent))
    began = time.perf_counter()
    snapshot = live.snapshot_html()
    snapshot_s = time.perf_counter() - began
    push_s, push_bytes, static_s = [], [], []
    timeline = panel_live.LiveFigure()
    for _ in range(max(5, updates // 6)):
        for _ in range(10):  # a cell of a second ends, the thread having updated meanwhile
            sampler.add(noisy_sample(t, count))
            t, count = t + 1 / RATE_HZ, count + 1
        records.append(record(len(records) + 1, t))
        live.update()
        sent.clear()
        began = time.perf_counter()
        live.push_after_cell()
        push_s.append(time.perf_counter() - began)
        push_bytes.append(sum(sent))
        began = time.perf_counter()
        fallback_bundle(session, "static", timeline)
        static_s.append(time.perf_counter() - began)
    return {
        "session": f"{hours:g} h",
        "history points": len(sampler.history()),
        "bytes/update mean": int(statistics.mean(sizes)),
        "bytes/update max": max(sizes),
        "bytes/message max (cap 32 KiB)": max(messages),
        "update ms (median)": round(1000 * statistics.median(durations), 1),
        "update ms (max)": round(1000 * max(durations), 1),
        "update CPU ms (median)": round(1000 * statistics.median(cpu_times), 1),
        "update CPU ms (max)": round(1000 * max(cpu_times), 1),
        "CPU share at 4 updates/s": f"{100 * 4 * statistics.median(cpu_times):.1f}%",
        "updates/s possible": round(1 / statistics.median(durations), 1),
        "updates/s sent (cap 4)": min(4.0, round(1 / statistics.median(durations), 1)),
        "first render ms": round(1000 * first_render_s, 1),
        "snapshot ms": round(1000 * snapshot_s, 1),
        "snapshot KiB": round(len(snapshot) / 1024, 1),
        "push after a cell ms (median)": round(1000 * statistics.median(push_s), 1),
        "push after a cell bytes (median)": int(statistics.median(push_bytes)),
        "static redraw after a cell ms": round(1000 * statistics.median(static_s), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, nargs="+", default=[1, 24])
    parser.add_argument("--updates", type=int, default=60)
    args = parser.parse_args()
    rows = [simulate(hours, args.updates) for hours in args.hours]
    keys = list(rows[0])
    width = max(map(len, keys))
    for key in keys:
        print(key.ljust(width), *(str(row[key]).rjust(12) for row in rows))


if __name__ == "__main__":
    main()
