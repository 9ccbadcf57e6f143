"""Each of this server's kernels as JupyterLab's status-bar item shows it: a state and why.

The item colours a notebook by its kernel's ``state``:

- ``blocking`` (red): a warning names this kernel's process as one that keeps others off a
  GPU (``blocking-preallocation``), or says that its mode will not fit (``prealloc-will-fail``).
- ``will-not-fit`` (red): its JAX has not started, its beacon says the pool its mode will take
  (``pool_fraction``), and a GPU it will use (``pool_gpus``, where the beacon says them) has
  less free than that.
- ``shared-preallocation`` (amber): its JAX preallocated a pool on a GPU that other processes
  use too, without blocking anyone yet.
- ``normal``: neither; also a kernel not on any GPU, or one whose memory NVML cannot tell.

The rules read the status report (its ``processes``, ``warnings`` and ``gpus``), so every kernel
of the server gets a state, whether or not it loaded the IPython extension; ``will-not-fit``
needs the beacon of a kernel that did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jax_nbmem.gpu.mig import report_label

__all__ = ["RED_WARNINGS", "with_states"]

# The warnings that turn a kernel's item red when they name its process.
RED_WARNINGS = frozenset({"blocking-preallocation", "prealloc-will-fail"})


def with_states(
    kernels: Iterable[Mapping[str, Any]],
    report: Mapping[str, Any],
    pending: Mapping[int, tuple] | None = None,
) -> list[dict[str, Any]]:
    """Return *kernels* (the report's ``kernels``), each with its state and warnings added.

    Added keys: ``state``, ``state_reason`` (a sentence; None when ``normal``), ``warnings``
    (the report's warnings naming its process) and ``mode_shown`` (its allocator mode as the
    board shows it; None when no source tells it, e.g. JAX not started and no beacon).
    ``pending``: by PID, the mode and pool fraction that the beacons of kernels whose JAX has
    not started say they will take, and the UUIDs of the GPUs they will take it on (a third
    item; None or left out: every GPU of this server).
    """
    processes = list(report.get("processes") or [])
    warnings = list(report.get("warnings") or [])
    every = list(report.get("gpus") or [])
    labels = {g.get("index"): report_label(g) for g in every}
    # A GPU split into MIG instances holds no pool itself: its instances are the GPUs JAX uses.
    gpus = [g for g in every if g.get("ours", True) and not g.get("mig_mode")]
    return [
        _with_state(dict(kernel), processes, warnings, gpus, labels, pending or {})
        for kernel in kernels
    ]


def _with_state(
    kernel: dict[str, Any],
    processes: list,
    warnings: list,
    gpus: list,
    labels: Mapping[Any, str],
    pending: Mapping,
) -> dict[str, Any]:
    pid = kernel.get("pid")
    rows = [p for p in processes if pid is not None and p.get("pid") == pid]
    named = [w for w in warnings if pid is not None and w.get("pid") == pid]
    kernel["warnings"] = named
    kernel["mode_shown"] = next(filter(None, (_mode(row) for row in rows)), None)
    mode, fraction, *said = pending.get(pid, (None, None)) if not rows else (None, None)
    if mode:
        kernel["mode_shown"] = f"{mode} (JAX not started)"
    # Only a GPU its JAX will use (its CUDA_VISIBLE_DEVICES and jax_cuda_visible_devices, as
    # its beacon says them); every GPU of this server where the beacon does not say.
    pool_gpus = said[0] if said and said[0] is not None else None
    short = [g for g in gpus if fraction and _short_of(g, fraction)
             and (pool_gpus is None or g.get("uuid") in pool_gpus)]  # fmt: skip
    if short:
        gpu = short[0]
        kernel["state"] = "will-not-fit"
        kernel["state_reason"] = (
            f"its mode will take {fraction:.0%} of {labels[gpu['index']]} when JAX starts, but "
            f"only {gpu['free_bytes'] / 2**30:.1f} GiB of {gpu['total_bytes'] / 2**30:.1f} "
            "GiB is free"
        )
        return kernel
    red = [w for w in named if w.get("kind") in RED_WARNINGS]
    if red:
        kernel["state"] = "blocking"
        gpus = sorted({w.get("gpu") for w in red if w.get("gpu") is not None})
        where = ", ".join(labels.get(index, f"GPU {index}") for index in gpus) or "a GPU"
        kernel["state_reason"] = f"{red[0]['kind']}: this kernel keeps others off {where}"
        return kernel
    shared = [row for row in rows if row.get("preallocated") and _others_on(row, processes)]
    if shared:
        kernel["state"] = "shared-preallocation"
        index = shared[0].get("gpu")
        kernel["state_reason"] = (
            f"its JAX preallocated a pool on {labels.get(index, f'GPU {index}')}, which other "
            "processes use too"
        )
        return kernel
    kernel["state"] = "normal"
    kernel["state_reason"] = None
    return kernel


def _short_of(gpu: Mapping[str, Any], fraction: float) -> bool:
    free, total = gpu.get("free_bytes"), gpu.get("total_bytes")
    return free is not None and total is not None and free < fraction * total


def _others_on(row: Mapping[str, Any], processes: list) -> bool:
    return any(p.get("gpu") == row.get("gpu") and p.get("pid") != row.get("pid") for p in processes)


def _mode(row: Mapping[str, Any]) -> str | None:
    """The board's rule: its mode, else the mode it started with, else "preallocated"."""
    return (
        row.get("mode")
        or row.get("mode_at_start")
        or ("preallocated" if row.get("preallocated") else None)
    )
