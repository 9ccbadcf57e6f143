"""A status report as Prometheus metric families: plain data, for the server and the exporter.

Pure (no prometheus_client here): :func:`metric_families` turns a report of
:func:`jax_nbmem.tenants.status.collect` into :class:`Family` records, each a gauge with its
help text, label names and samples; the faces hand them to prometheus_client. The names and
labels are a contract (README, "Metrics"):

* ``jax_nbmem_gpu_memory_used_bytes{gpu_uuid,gpu}``, ``jax_nbmem_gpu_memory_total_bytes``;
* per process on a GPU, labelled ``{kernel_id,notebook,user,gpu_uuid,pid}``:
  ``jax_nbmem_kernel_gpu_memory_bytes``, ``jax_nbmem_kernel_jax_bytes_in_use``,
  ``jax_nbmem_kernel_jax_pool_bytes``, ``jax_nbmem_kernel_jax_bytes_limit``,
  ``jax_nbmem_kernel_preallocated`` (0/1, with ``mode``), ``jax_nbmem_kernel_idle_seconds``;
* ``jax_nbmem_warnings{kind}``: how many warnings of each kind.

``gpu_uuid`` is NVML's UUID, the ``UUID`` label of dcgm-exporter, for joins in Grafana. Only
processes on a GPU now are exported, so a kernel that ended leaves the metrics with its
process: the label sets stay as many as the GPUs' processes. ``pid`` keeps two processes of
one user that are not kernels apart. A value nobody could read is left out, never sent as 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KERNEL_LABELS", "Family", "metric_families", "prometheus_collector"]

GPU_LABELS = ("gpu_uuid", "gpu")
KERNEL_LABELS = ("kernel_id", "notebook", "user", "gpu_uuid", "pid")
# Exported as 0 when absent, so that an alert on them has a series to watch.
_WARNING_KINDS = (
    "blocking-preallocation",
    "self-preallocation",
    "prealloc-will-fail",
    "pid-namespace",
)


@dataclass
class Family:
    """One gauge: its name, help, label names and ``(label values, value)`` samples."""

    name: str
    documentation: str
    labels: tuple[str, ...]
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

    def add(self, values: Sequence[Any], value: float | None) -> None:
        """Add a sample, unless *value* is unknown (None)."""
        if value is not None:
            self.samples.append((tuple("" if v is None else str(v) for v in values), value))


def _kernel_labels(process: Mapping[str, Any], uuids: Mapping[int, str]) -> tuple:
    notebook = process.get("notebook_shown") or process.get("notebook")
    return (
        process.get("kernel_id"),
        notebook,
        process.get("user"),
        uuids.get(process.get("gpu"), ""),
        process.get("pid"),
    )


def metric_families(report: Mapping[str, Any]) -> list[Family]:
    """Every family, from a status report (a dict as ``jax-nbmem status --json`` prints)."""
    used = Family("jax_nbmem_gpu_memory_used_bytes", "GPU memory in use (NVML), bytes.", GPU_LABELS)
    total = Family(
        "jax_nbmem_gpu_memory_total_bytes", "GPU memory in all (NVML), bytes.", GPU_LABELS
    )
    uuids: dict[int, str] = {}
    for gpu in report.get("gpus", []):
        uuids[gpu["index"]] = gpu.get("uuid") or ""
        labels = (gpu.get("uuid"), gpu["index"])
        used.add(labels, gpu.get("used_bytes"))
        total.add(labels, gpu.get("total_bytes"))

    def kernel_family(name: str, documentation: str, extra: tuple[str, ...] = ()) -> Family:
        return Family(name, documentation, KERNEL_LABELS + extra)

    memory = kernel_family(
        "jax_nbmem_kernel_gpu_memory_bytes",
        "GPU memory a process holds (NVML), by kernel, notebook and user, bytes.",
    )
    in_use = kernel_family(
        "jax_nbmem_kernel_jax_bytes_in_use", "Bytes JAX's arrays use (the kernel's beacon)."
    )
    pool = kernel_family(
        "jax_nbmem_kernel_jax_pool_bytes", "Bytes JAX's allocator pool holds (the kernel's beacon)."
    )
    limit = kernel_family(
        "jax_nbmem_kernel_jax_bytes_limit", "JAX's allocator limit, bytes (the kernel's beacon)."
    )
    preallocated = kernel_family(
        "jax_nbmem_kernel_preallocated",
        "1 when the process's JAX preallocated its pool, 0 when not (unknown: absent).",
        ("mode",),
    )
    idle = kernel_family(
        "jax_nbmem_kernel_idle_seconds", "Seconds since the kernel's last cell or activity."
    )
    for process in report.get("processes", []):
        labels = _kernel_labels(process, uuids)
        memory.add(labels, process.get("used_bytes"))
        jax = process.get("jax") or {}
        in_use.add(labels, jax.get("bytes_in_use"))
        pool.add(labels, jax.get("pool_bytes"))
        limit.add(labels, jax.get("bytes_limit"))
        flag = process.get("preallocated")
        if flag is not None:
            mode = process.get("mode") or process.get("mode_at_start") or ""
            preallocated.add((*labels, mode), 1.0 if flag else 0.0)
        idle.add(labels, process.get("idle_s"))

    warnings = Family("jax_nbmem_warnings", "Warnings now, by kind.", ("kind",))
    counts = Counter(w.get("kind", "") for w in report.get("warnings", []))
    for kind in sorted(set(_WARNING_KINDS) | set(counts)):
        warnings.add((kind,), float(counts.get(kind, 0)))
    return [used, total, memory, in_use, pool, limit, preallocated, idle, warnings]


def prometheus_collector(report: Any) -> Any:
    """A prometheus_client collector that exports ``report()``'s families at each scrape.

    ``report`` returns the latest status report (or None before the first): the collector
    reads only that snapshot, so a scrape never waits for NVML. prometheus_client is imported
    here, on demand: the faces that export (the server extension, ``jax-nbmem exporter``) have
    it; nothing else needs it.
    """
    from prometheus_client.core import GaugeMetricFamily

    class ReportCollector:
        def collect(self):
            latest = report()
            if latest is None:
                return
            for family in metric_families(latest):
                gauge = GaugeMetricFamily(
                    family.name, family.documentation, labels=list(family.labels)
                )
                for values, value in family.samples:
                    gauge.add_metric(list(values), value)
                yield gauge

        def describe(self):
            return []  # registering it must not take a snapshot

    return ReportCollector()
