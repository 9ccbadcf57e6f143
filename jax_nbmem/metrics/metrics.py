"""A status snapshot as Prometheus metric families: plain data, for the server and the exporter.

Pure (no prometheus_client here but in :func:`prometheus_collector`): :func:`metric_families`
turns a :class:`Snapshot` (a report of :func:`jax_nbmem.tenants.status.collect`, when it was
taken, and which processes this source speaks for) into :class:`Family` records, each a gauge
with its help text, label names and samples (:mod:`.exposition` writes them as Prometheus's
text). The names and labels are a contract (docs/metrics.md); :data:`FAMILIES` lists every
name, so a registry can describe them unasked.

One source per fact: the node exporter speaks for every process on the node (less those it
leaves to their own Jupyter server, see :mod:`.publishers`); a server extension in ``kernels``
scope only for its own kernels, with no GPU-wide gauge. So a sum over every target counts
each byte once.

Health comes first and is always there: ``jax_nbmem_up`` (a fresh snapshot),
``jax_nbmem_nvml_up{reason}``, when the snapshot was taken and how long it took, and
``jax_nbmem_build_info``. A snapshot older than ``stale_after_s`` is not served as fresh, and
while NVML is down or the snapshot stale every GPU-derived series (warnings included) is
absent, never 0. A value nobody could read is left out, never sent as 0.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from jax_nbmem.gpu.nvml_errors import GLOBAL_ERRORS
from jax_nbmem.gpu.nvml_session import PYNVML_MISSING
from jax_nbmem.metrics.metric_labels import (
    bounded_name,
    container_labels,
    gpu_identity,
    name_sources,
    notebook_label,
)

__all__ = [
    "FAMILIES",
    "GPU_LABELS",
    "HOLDERS",
    "CONTAINER_LABELS",
    "KERNEL_LABELS",
    "SOURCE_LABELS",
    "MIG_LABELS",
    "NVML_REASONS",
    "Family",
    "Snapshot",
    "is_fresh",
    "metric_families",
    "nvml_reason",
    "prometheus_collector",
]

# dcgm-exporter's own names for a GPU (UUID, gpu, Hostname), so that `on (UUID)` joins without
# relabelling; `gpu_uuid` is the older name, kept (deprecated). dcgm's camelCase `modelName`
# is left to dcgm (promtool's lint refuses camelCase): `group_left (modelName)` brings it.
# A MIG instance is labelled as dcgm-exporter labels it: its parent GPU's UUID and gpu, and
# GPU_I_ID and GPU_I_PROFILE (empty, which Prometheus reads as absent, for a whole GPU).
MIG_LABELS = ("GPU_I_ID", "GPU_I_PROFILE")
GPU_LABELS = ("UUID", "gpu", "Hostname", "gpu_uuid", *MIG_LABELS)
# A kernel in a container: dcgm-exporter's names for it (`container`, `pod`, `namespace`), from
# the host's view of its cgroup; empty (absent to Prometheus) on a plain host, so the series of
# a process outside any container are the same series as before these labels came.
CONTAINER_LABELS = ("container", "pod", "namespace")
# Who says the names: `user_source` is empty (the host's account of its uid), `container` (a
# process in a container: its container's passwd, the container's claim), `uid` (the bare
# uid: no name known there) or `host_uid` (the host's uid: its container's map unread);
# `hub_user_source` is `pod` (KubeSpawner's annotation, from the
# Kubernetes API) or `claimed` (the process's own beacon or environment). `kernel_id` and
# `notebook` are always the process's or its server's own word (bounded, never proven).
SOURCE_LABELS = ("user_source", "hub_user_source")
KERNEL_LABELS = (
    "UUID", "gpu", "gpu_uuid", "Hostname", "kernel_id", "notebook", "user", "hub_user", "pid",
    *MIG_LABELS, *CONTAINER_LABELS, *SOURCE_LABELS,
)  # fmt: skip
WARNING_LABELS = ("kind", "UUID", "gpu", "Hostname", "pid", "user", "kernel_id", *MIG_LABELS)
# Exported as 0 (with empty GPU and PID) while NVML answers, so an alert has a series to watch.
_WARNING_KINDS = (
    "blocking-preallocation",
    "self-preallocation",
    "prealloc-will-fail",
    "prealloc-exceeds-cap",
    "pid-namespace",
    "agent-stale",
)
# jax_nbmem_kernel_gpu_memory_holder_bytes' holder: what else a kernel's beacon counts on a GPU.
HOLDERS = ("torch", "cupy", "tensorflow", "jax_collective", "other")
# jax_nbmem_kubernetes_api_up's reason: the pods' directory's state (tenants.kubepods).
KUBERNETES_STATES = ("ok", "starting", "unreachable", "refused", "error")
# jax_nbmem_nvml_up's reason: a fixed set, so that the label's values stay few.
NVML_REASONS = (
    "ok",
    "slow",
    "stale",
    "library_missing",
    "driver_not_loaded",
    "no_permission",
    "driver_mismatch",
    "gpu_lost",
    "error",
)
_GLOBAL_REASONS = {
    "LIBRARY_NOT_FOUND": "library_missing",
    "DRIVER_NOT_LOADED": "driver_not_loaded",
    "NO_PERMISSION": "no_permission",
    "LIB_RM_VERSION_MISMATCH": "driver_mismatch",
}

_H = "(the kernel's beacon)"
# name → help; the order is the order of exposition.
FAMILIES: dict[str, str] = {
    "jax_nbmem_up": "1 when this source's last look at the node is fresh (taken within a few "
    "intervals), else 0.",
    "jax_nbmem_nvml_up": "1 when NVML answered in the fresh snapshot, else 0; reason says why.",
    "jax_nbmem_snapshot_timestamp_seconds": "When the served snapshot was taken, Unix seconds.",
    "jax_nbmem_snapshot_duration_seconds": "How long taking the served snapshot took, seconds.",
    "jax_nbmem_build_info": "jax_nbmem's version, and jax's and jaxlib's installed beside it.",
    "jax_nbmem_kubernetes_api_up": "1 when the node agent's last look at the Kubernetes API "
    "(its pods' list and watch) was answered, else 0; reason says why (absent off Kubernetes).",
    "jax_nbmem_gpu_memory_used_bytes": "GPU memory in use (NVML), bytes.",
    "jax_nbmem_gpu_memory_total_bytes": "GPU memory in all (NVML), bytes.",
    "jax_nbmem_gpu_memory_reserved_bytes": "GPU memory the driver reserves (NVML), bytes.",
    "jax_nbmem_kernel_gpu_memory_bytes": "GPU memory a process holds (NVML), by kernel, "
    "notebook and user, bytes.",
    "jax_nbmem_kernel_jax_in_use_bytes": f"Bytes JAX's arrays use {_H}.",
    "jax_nbmem_kernel_jax_pool_bytes": f"Bytes JAX's allocator pool holds {_H}.",
    "jax_nbmem_kernel_jax_limit_bytes": f"JAX's allocator limit, bytes {_H}.",
    "jax_nbmem_kernel_gpu_memory_holder_bytes": "GPU memory a kernel holds besides JAX's "
    "pool, by holder: torch, cupy, tensorflow (what its tensors use), jax_collective (JAX's "
    f"collective allocator), other (CUDA contexts and what no counter reports), bytes {_H}.",
    "jax_nbmem_kernel_memory_cap_bytes": "The GPU memory MPS or HAMi lets the process take "
    "(its own environment, through its beacon), bytes; absent when uncapped or unknown.",
    "jax_nbmem_kernel_preallocated": "1 when the process's JAX preallocated its pool, 0 when "
    "not (unknown: absent).",
    "jax_nbmem_kernel_idle_seconds": "Seconds since the kernel's last cell or activity.",
    "jax_nbmem_kernel_last_activity_timestamp_seconds": "When the kernel's last cell finished "
    "or its last activity was, Unix seconds.",
    "jax_nbmem_warnings": "Warnings now, by kind, GPU and PID (0 with empty GPU and PID for a "
    "kind with none).",
}


@dataclass(frozen=True)
class Snapshot:
    """A status report as one source serves it.

    ``taken_at`` is when it was taken (Unix seconds) and ``took_s`` how long it took.
    ``own_pids`` (a server's kernels): only these processes are exported, and no GPU-wide
    gauge; None: the whole node. ``deferred_pids``: processes left to the Jupyter server that
    publishes them (their series and warnings are not exported here).
    """

    report: Mapping[str, Any]
    taken_at: float
    took_s: float | None = None
    own_pids: frozenset[int] | None = None
    deferred_pids: frozenset[int] = frozenset()


@dataclass
class Family:
    """One gauge: its name, help, label names and ``(label values, value)`` samples."""

    name: str
    labels: tuple[str, ...]
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

    @property
    def documentation(self) -> str:
        """The family's help text."""
        return FAMILIES[self.name]

    def add(self, values: Sequence[Any], value: float | None) -> None:
        """Add a sample, unless *value* is unknown (None)."""
        if value is not None:
            self.samples.append((_strings(values), value))

    def add_strings(self, values: tuple[str, ...], value: float | None) -> None:
        """:meth:`add` for values already strings (one tuple shared by a process's samples)."""
        if value is not None:
            self.samples.append((values, value))


def _strings(values: Sequence[Any]) -> tuple[str, ...]:
    return tuple(["" if v is None else str(v) for v in values])  # a list: faster than a genexpr


def nvml_reason(state: Mapping[str, Any]) -> str:
    """The report's ``nvml`` state as one of :data:`NVML_REASONS`."""
    reason = state.get("reason") or ""
    if state.get("available"):
        return "slow" if "NVML is slow" in reason else "ok"
    if PYNVML_MISSING in reason:
        return "library_missing"
    for name, code in _GLOBAL_REASONS.items():
        if GLOBAL_ERRORS[name] in reason:
            return code
    if " lost" in reason or "no longer" in reason or "needs a reset" in reason:
        return "gpu_lost"
    return "error"


@cache
def _build() -> tuple[str, str, str]:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return ""

    return installed("jax_nbmem"), installed("jax"), installed("jaxlib")


def is_fresh(
    snapshot: Snapshot | None, now: float, stale_after_s: float, looking_since: float | None = None
) -> bool:
    """Whether *snapshot* may be served as fresh at *now* (None, before the first: not).

    ``looking_since``: when the look under way began (Unix seconds; None: none under way). Age
    is counted from the later of that and the snapshot's own start, so a look that is merely
    slow (a loaded machine) keeps the last snapshot fresh, and one that takes longer than the
    horizon (NVML hung) does not.
    """
    if snapshot is None:
        return False
    since = snapshot.taken_at if looking_since is None else max(looking_since, snapshot.taken_at)
    return now - since <= stale_after_s


def _health(
    snapshot: Snapshot | None, now: float, stale_after_s: float, looking_since: float | None
) -> tuple[list, bool]:
    up = Family("jax_nbmem_up", ())
    nvml_up = Family("jax_nbmem_nvml_up", ("reason",))
    taken = Family("jax_nbmem_snapshot_timestamp_seconds", ())
    took = Family("jax_nbmem_snapshot_duration_seconds", ())
    build = Family("jax_nbmem_build_info", ("version", "jax", "jaxlib"))
    build.add(_build(), 1.0)
    fresh = is_fresh(snapshot, now, stale_after_s, looking_since)
    up.add((), 1.0 if fresh else 0.0)
    nvml_ok = False
    if snapshot is not None:
        taken.add((), snapshot.taken_at)
        took.add((), snapshot.took_s)
    if fresh:
        state = snapshot.report.get("nvml") or {}
        nvml_ok = bool(state.get("available"))
        nvml_up.add((nvml_reason(state),), 1.0 if nvml_ok else 0.0)
    else:
        nvml_up.add(("stale",), 0.0)
    found = [up, nvml_up, taken, took, build]
    pods = snapshot.report.get("kubernetes") if snapshot is not None else None
    if isinstance(pods, Mapping) and pods.get("state") in KUBERNETES_STATES:
        api = Family("jax_nbmem_kubernetes_api_up", ("reason",))
        api.add((pods["state"],), 1.0 if pods["state"] == "ok" else 0.0)
        found.append(api)
    return found, fresh and nvml_ok


def metric_families(
    snapshot: Snapshot | None,
    *,
    now: float | None = None,
    stale_after_s: float = float("inf"),
    looking_since: float | None = None,
) -> list[Family]:
    """Every family, from a snapshot (None before the first: health only).

    ``looking_since``: when the look that will replace it began, if one is under way (see
    :func:`is_fresh`).
    """
    now = time.time() if now is None else now
    families, gpu_data = _health(snapshot, now, stale_after_s, looking_since)
    if not gpu_data:
        return families
    report, node = snapshot.report, snapshot.own_pids is None

    def wanted(pid: Any) -> bool:
        if node:
            return pid not in snapshot.deferred_pids
        return pid in snapshot.own_pids

    hostname = socket.gethostname()
    gpus = _gpu_families(families, report, hostname, node)
    by_pid = _kernel_families(families, report, gpus, hostname, wanted, snapshot.taken_at)
    _warning_families(families, report, gpus, by_pid, hostname, wanted, node)
    return families


def _family(families: list[Family], name: str, labels: tuple[str, ...]) -> Family:
    found = Family(name, labels)
    families.append(found)
    return found


def _gpu_families(
    families: list[Family], report: Mapping[str, Any], hostname: str, node: bool
) -> dict[int, tuple[str, str, str, str]]:
    """The GPUs' memory (the node's source only); each GPU's identity labels, by index."""
    gpus: dict[int, tuple[str, str, str, str]] = {}
    used = _family(families, "jax_nbmem_gpu_memory_used_bytes", GPU_LABELS)
    total = _family(families, "jax_nbmem_gpu_memory_total_bytes", GPU_LABELS)
    reserved = _family(families, "jax_nbmem_gpu_memory_reserved_bytes", GPU_LABELS)
    for gpu in report.get("gpus", []):
        uuid, index, instance, profile = gpus[gpu["index"]] = gpu_identity(gpu)
        if node:
            labels = (uuid, index, hostname, uuid, instance, profile)
            used.add(labels, gpu.get("used_bytes"))
            total.add(labels, gpu.get("total_bytes"))
            reserved.add(labels, gpu.get("reserved_bytes"))
    return gpus


def _kernel_families(
    families: list[Family],
    report: Mapping[str, Any],
    gpus: dict[int, tuple[str, str, str, str]],
    hostname: str,
    wanted: Callable[[Any], bool],
    taken_at: float,
) -> dict[Any, Mapping[str, Any]]:
    """Each wanted process's series; every process by PID (the warnings' labels need them)."""
    kernel = KERNEL_LABELS
    memory = _family(families, "jax_nbmem_kernel_gpu_memory_bytes", kernel)
    in_use = _family(families, "jax_nbmem_kernel_jax_in_use_bytes", kernel)
    pool = _family(families, "jax_nbmem_kernel_jax_pool_bytes", kernel)
    limit = _family(families, "jax_nbmem_kernel_jax_limit_bytes", kernel)
    holders = _family(families, "jax_nbmem_kernel_gpu_memory_holder_bytes", (*kernel, "holder"))
    memory_cap = _family(families, "jax_nbmem_kernel_memory_cap_bytes", kernel)
    preallocated = _family(families, "jax_nbmem_kernel_preallocated", (*kernel, "mode"))
    idle = _family(families, "jax_nbmem_kernel_idle_seconds", kernel)
    activity = _family(families, "jax_nbmem_kernel_last_activity_timestamp_seconds", kernel)
    by_pid: dict[Any, Mapping[str, Any]] = {}
    for process in report.get("processes", []):
        by_pid.setdefault(process.get("pid"), process)
        if not wanted(process.get("pid")):
            continue
        uuid, index, instance, profile = gpus.get(process.get("gpu"), ("", "", "", ""))
        labels = _strings((
            uuid,
            index,
            uuid,
            hostname,
            bounded_name(process.get("kernel_id")),
            notebook_label(process),
            bounded_name(process.get("user")),
            bounded_name(process.get("hub_user")),
            process.get("pid"),
            instance,
            profile,
            *container_labels(process.get("container")),
            *name_sources(process),
        ))  # fmt: skip
        memory.add_strings(labels, process.get("used_bytes"))
        jax = process.get("jax") or {}
        in_use.add_strings(labels, jax.get("bytes_in_use"))
        limit.add_strings(labels, jax.get("bytes_limit"))
        pool.add_strings(labels, jax.get("pool_bytes"))
        for holder in HOLDERS:  # a fixed set: the label stays bounded
            holders.add_strings((*labels, holder), jax.get(f"{holder}_bytes"))
        memory_cap.add_strings(labels, process.get("memory_cap_bytes"))
        flag = process.get("preallocated")
        if flag is not None:
            mode = process.get("mode") or process.get("mode_at_start") or ""
            preallocated.add_strings((*labels, bounded_name(mode)), 1.0 if flag else 0.0)
        idle_s = process.get("idle_s")
        idle.add_strings(labels, idle_s)
        if idle_s is not None:
            activity.add_strings(labels, round(taken_at - idle_s, 3))
    return by_pid


def _warning_families(
    families: list[Family],
    report: Mapping[str, Any],
    gpus: dict[int, tuple[str, str, str, str]],
    by_pid: dict[Any, Mapping[str, Any]],
    hostname: str,
    wanted: Callable[[Any], bool],
    node: bool,
) -> None:
    """The warnings, counted by kind and the process they name (every kind, 0 when none)."""
    warnings = _family(families, "jax_nbmem_warnings", WARNING_LABELS)
    counts: Counter = Counter()
    for warning in report.get("warnings", []):
        pid = warning.get("pid")
        if pid is not None and not wanted(pid):
            continue
        if pid is None and not node:
            continue  # a node-wide warning: the node's source says it
        uuid, index, instance, profile = gpus.get(warning.get("gpu"), ("", "", "", ""))
        process = by_pid.get(pid) or {}
        key = (warning.get("kind"), uuid, index, hostname, pid, bounded_name(process.get("user")))
        key += (bounded_name(process.get("kernel_id")), instance, profile)
        counts[tuple("" if v is None else str(v) for v in key)] += 1
    for kind in _WARNING_KINDS:
        counts.setdefault((kind, "", "", hostname, "", "", "", "", ""), 0)
    for labels, count in sorted(counts.items()):
        warnings.add(labels, float(count))


def prometheus_collector(
    latest: Callable[[], Snapshot | None], *, stale_after_s: float = float("inf")
) -> Any:
    """A prometheus_client collector that exports ``latest()``'s families at each scrape.

    ``latest`` returns the latest snapshot (or None before the first): the collector reads
    only that, so a scrape never waits for NVML. ``describe()`` names every family without
    taking a snapshot, so ``/metrics?name[]=…`` works. prometheus_client is imported here, on
    demand: the faces that export (the server extension, ``jax-nbmem exporter``) have it.
    """
    from prometheus_client.core import GaugeMetricFamily

    def gauge(name: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, FAMILIES[name], labels=list(labels))

    class SnapshotCollector:
        def collect(self):
            for family in metric_families(latest(), stale_after_s=stale_after_s):
                metric = gauge(family.name, family.labels)
                for values, value in family.samples:
                    metric.add_metric(list(values), value)
                yield metric

        def describe(self):
            return [gauge(name, ()) for name in FAMILIES]

    return SnapshotCollector()
