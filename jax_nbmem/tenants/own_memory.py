"""This kernel's own GPU memory split by who holds it: JAX's pool, each framework, the rest.

NVML says what the process holds on each GPU; JAX's counters say its pool (and its collective
allocator's size, from its settings); PyTorch's, CuPy's and TensorFlow's counters say theirs
(:mod:`jax_nbmem.gpu.frameworks`, read only once they started on the GPU by themselves). What is
left is CUDA's contexts and what no counter reports. On the simulated GPU, where the kernel's
JAX runs on the CPU, the mirror's counters stand for JAX's (looked up, never imported).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from jax_nbmem.gpu import jaxstats
from jax_nbmem.gpu.frameworks import read_frameworks, split_own_memory
from jax_nbmem.text import printable_lines
from jax_nbmem.units import format_bytes

__all__ = ["framework_oom_text", "own_split"]


def _jax_held_by_ordinal(order: Sequence[int], gpus: Iterable[Any]) -> dict[int, int | None]:
    """JAX's pool by CUDA ordinal: its counters, else the simulated GPU's mirror's."""
    stats = jaxstats.device_stats(gpus_only=True) if jaxstats.backend_initialized() else []
    held = {s.id: s.held_bytes for s in stats if s.id is not None}
    if held:
        return held
    mirror = sys.modules.get("jax_nbmem.simgpu.mirror")
    try:
        counters = mirror.gpu_counters() if mirror is not None else {}
    except Exception:  # a demo aid: never a reason for the status to fail
        counters = {}
    index_of = {gpu.uuid: gpu.index for gpu in gpus if gpu.uuid}
    for uuid, values in counters.items():
        index = index_of.get(uuid)
        if index in order:
            held[order.index(index)] = values.get("pool_bytes")
    return held


def own_split(
    tenants: Iterable[Any],
    own_pid: int,
    order: Sequence[int],
    gpus: Iterable[Any],
    collective_bytes: int | None,
) -> dict[str, Any]:
    """``own_split`` (one row per GPU) and ``frameworks`` (each imported one), for the status.

    *tenants*: the attributed processes; *order*: the NVML indices of the GPUs CUDA sees, in
    its order; *collective_bytes*: what JAX's collective allocator takes per GPU (None: none).
    """
    gpus = list(gpus)
    # This process's rows: by its PID on the host; in a container NVML lists its host PID,
    # and the attribution marks the row it proved (or inferred) as this process's.
    mine = {t.gpu: t.used_bytes for t in tenants if t.pid == own_pid or t.kind == "self"}
    frameworks = read_frameworks(cuda_running=bool(mine) and any(mine.values()))
    held = _jax_held_by_ordinal(order, gpus)
    rows = split_own_memory(mine, list(order), held, frameworks, collective_bytes)
    return {"own_split": rows, "frameworks": [f.to_dict() for f in frameworks]}


_SHOWN = {"torch": "PyTorch", "cupy": "CuPy", "tensorflow": "TensorFlow"}


def framework_oom_text(
    framework: str, report: Any, own_name: str, jax_mode: str | None, jax_started: bool
) -> str:
    """Plain text for under another framework's out-of-memory traceback, with the numbers.

    *report*: the status (its ``own_split`` and ``gpus``); *jax_mode*: the mode JAX started
    with (or will start with); *jax_started*: whether JAX's backend has started.
    """
    shown = _SHOWN.get(framework, framework)
    lines = [f"{shown} ran out of GPU memory in {own_name}."]
    rows = report.get("own_split") or []
    gpus = {g["index"]: g for g in report.get("gpus", [])}
    for row in rows:
        gpu = gpus.get(row["gpu"], {})
        pool = row["parts"].get("jax_pool")
        said = [f"{_SHOWN.get(k, k)} {format_bytes(v)}" for k, v in row["parts"].items()
                if k not in ("jax_pool", "jax_collective")]  # fmt: skip
        line = f"GPU {row['gpu']}: {format_bytes(gpu.get('free_bytes'))} free; {own_name} holds "
        line += format_bytes(row["nvml_bytes"])
        if pool is not None:
            line += f", of which JAX's pool in this same kernel holds {format_bytes(pool)}"
        if said:
            line += f" ({', '.join(said)})"
        lines.append(line + ".")
    if not jax_started:
        lines.append(
            f"JAX has not started in {own_name}: it holds nothing yet, but at its start it "
            f"will take what '{jax_mode}' says."
        )
    if jax_mode is None or not jax_mode.startswith(("off", "platform")):
        when = (
            f"JAX reads its settings once, so restart {own_name} and run it in the first cell"
            if jax_started
            else "run it now, before JAX first uses the GPU"
        )
        lines.append(
            "Before JAX starts, `%jaxalloc off` makes JAX take only what it uses (it keeps "
            "its peak) and `%jaxalloc platform` gives memory back after each use (slower); "
            f"`%jaxalloc auto` weighs the frameworks imported: {when}."
        )
    else:
        lines.append(
            f"JAX runs '{jax_mode}' already: free arrays of either framework you no longer "
            "need, or use smaller batches."
        )
    return printable_lines("\n".join(lines))
