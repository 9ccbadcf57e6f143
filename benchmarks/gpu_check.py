"""On a real NVIDIA GPU: each allocator mode's footprint, the monitor against nvidia-smi, speed.

    python benchmarks/gpu_check.py [--gpu 0] [--timeout 60] [--quick] [--json PATH]

For each mode (on, off, platform, cuda_async, fraction 0.3; those the installed jaxlib rejects
are skipped), a fresh Python process starts JAX on one GPU in that mode and records:

- footprint: this process's GPU memory per NVML (jax_nbmem.gpu.nvml) and JAX's
  ``memory_stats()`` (``pool_bytes`` among them) after its first array, after allocating
  1 GiB, and after deleting it;
- monitor: jax_nbmem.gpu.nvml's used/total and this pid's bytes against
  ``nvidia-smi --query-gpu=memory.used,memory.total`` and ``--query-compute-apps``;
- allocation throughput: bursts of 64 arrays allocated then deleted, at 4 KiB, 1 MiB, 64 MiB;
- fragmentation: 64 MiB and 192 MiB arrays interleaved up to 80% of the room left (at most
  48 GiB), the 192 MiB ones deleted, then the largest allocation that still succeeds (a search
  of at most 10 probes within a time budget: a failed allocation can take seconds) next to the
  free room inside the pool and ``largest_free_block_bytes``.

Then the cases of ``gpu_check_cases.py`` (vmm, address, off + cuda_async, cuda_async past its
limit, ``bytes_reserved``, a variable changed after start, PyTorch + JAX, CuPy + JAX), each
skipped with its reason where it cannot run.

``--quick`` (under 90 s) measures the footprint and the monitor of on, off and cuda_async only.
The GPU is the one CUDA_VISIBLE_DEVICES names when it is set (UUIDs and MIG instances
included; it is passed on as it is), else ``--gpu`` (by its UUID; a GPU in MIG mode by its
first MIG instance's UUID).

On a MIG instance it checks what it can: that jax_nbmem reads the instance as a GPU of its own
(its memory, below the whole GPU's; this process listed on it), and that each mode holds its
share of the *instance's* memory. nvidia-smi gives no per-instance memory, so the comparisons
with it are "unknown" there. Tables come last, then the
preallocation window calibrated from what was measured; ``--json`` writes every raw figure.

Exit status: 0 when every check passed, or when there is no NVIDIA GPU (it prints "no NVIDIA
GPU: nothing to check" and returns at once); 1 when a check failed or a mode crashed; 2 when a
GPU is there but the installed JAX cannot use it (no CUDA backend); 3 when the figures cannot
be verified ("cannot verify: ...", e.g. NVML does not list this process: a container without
the host's PID namespace, or MIG without the rights to list processes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check_cases  # noqa: E402  (beside this file: the source's cases, docs/magics.md)

from jax_nbmem.allocator import jaxlib, modes  # noqa: E402
from jax_nbmem.gpu import jaxstats, nvml, own_process, visible  # noqa: E402
from jax_nbmem.tenants.verdicts import (  # noqa: E402
    PREALLOCATION_ABOVE_BYTES,
    PREALLOCATION_BELOW_BYTES,
)
from jax_nbmem.units import format_bytes  # noqa: E402

MODES = ("on", "off", "platform", "cuda_async", "fraction 0.3")
QUICK_MODES = ("on", "off", "cuda_async")
MIB, GIB = 1 << 20, 1 << 30
SIZES = (4 << 10, 1 << 20, 64 << 20)
BURST = 64
SMALL, LARGE = 64 * MIB, 192 * MIB
# Readings are taken a few milliseconds apart from two tools; the driver counts in MiB.
TOLERANCE = 16 * MIB
# The share of the GPU each mode should hold right after its first array (NVML's view).
EXPECTED_SHARE = {
    "on": (0.70, 0.80),
    "fraction 0.3": (0.27, 0.33),
    "cuda_async": (0.70, 0.80),  # takes its pool when the backend starts
    "off": (0.0, 0.10),
    "platform": (0.0, 0.10),
}
# Modes that take memory as arrays need it: a 1 GiB array makes the process grow.
GROW_ON_DEMAND = ("off", "platform")
PROBES = 10
SEARCH_BUDGET_S = 20.0


def smi(gpu: int, *query: str) -> list[list[str]] | None:
    """Rows of ``nvidia-smi --query-...`` for one GPU, or None when it cannot answer."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "-i", str(gpu), *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line]


def _mib(cell: str | None) -> int | None:
    """nvidia-smi's figure in MiB as bytes; None for "[N/A]" (MIG) and the like."""
    return int(cell) * MIB if cell and cell.isdigit() else None


def readings(device, gpu: int) -> dict:
    """JAX's stats, jax_nbmem.gpu.nvml's figures and nvidia-smi's, taken together.

    On a MIG instance nvidia-smi is not asked: it has no figures of the instance's own.
    """
    stats = _stats(device)
    memory = (nvml.memory([gpu]) or [None])[0]
    mig = getattr(memory, "mig", None)
    own_pid = own_process.nvml_pid()  # NVML's and nvidia-smi's PID for us: the host's
    mine = [p.used_bytes for p in own_process.own_entries(nvml.processes([gpu])) or ()]
    asked = mig is None
    gpu_row = ((asked and smi(gpu, "--query-gpu=memory.used,memory.total")) or [[None, None]])[0]
    apps = (asked and smi(gpu, "--query-compute-apps=pid,used_memory")) or []
    smi_self = [_mib(row[1]) for row in apps if own_pid is not None and row[0] == str(own_pid)]
    parent = None
    if mig is not None:
        parent = (nvml.memory([mig.parent_index]) or [None])[0]
    keys = (
        "bytes_in_use",
        "peak_bytes_in_use",
        "bytes_reserved",
        "bytes_limit",
        "pool_bytes",
        "peak_pool_bytes",
        "largest_free_block_bytes",
    )
    return {
        **{f"jax_{key}": stats.get(key) for key in keys},
        "nvml_used": getattr(memory, "used_bytes", None),
        "nvml_reserved": getattr(memory, "reserved_bytes", None),
        "nvml_total": getattr(memory, "total_bytes", None),
        "nvml_free": getattr(memory, "free_bytes", None),
        "nvml_self": sum(mine) if mine and None not in mine else None,
        "nvml_pids": [p.pid for p in nvml.processes([gpu])],
        "smi_used": _mib(gpu_row[0]),
        "smi_total": _mib(gpu_row[1]),
        "smi_self": smi_self[0] if smi_self else None,
        "smi_pids": [row[0] for row in apps],
        "pid": os.getpid(),
        "mig": None if mig is None else {
            "label": memory.label, "profile": mig.profile, "gpu_instance_id": mig.gpu_instance_id,
            "parent_index": mig.parent_index, "uuid": memory.uuid,
            "parent_total": getattr(parent, "total_bytes", None),
            "parent_problem": getattr(parent, "problem", None),
        },
    }  # fmt: skip


def child(mode: str, gpu: int, quick: bool) -> dict:
    """Run in a fresh process whose environment already selects *mode*."""
    import jax
    import jax.numpy as jnp

    started = time.perf_counter()
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError as exc:
        return {"mode": mode, "no_gpu_backend": str(exc)[:300]}
    jnp.ones((1,), device=device).block_until_ready()  # the first allocation takes the pool
    result: dict = {"mode": mode, "start_s": time.perf_counter() - started}
    makers: dict[int, object] = {}

    def make(nbytes: int):
        if nbytes not in makers:
            # The default device: CUDA_VISIBLE_DEVICES leaves JAX this one GPU.
            makers[nbytes] = jax.jit(lambda: jnp.zeros((nbytes,), jnp.uint8))
        return makers[nbytes]().block_until_ready()

    result["start"] = readings(device, gpu)
    one_gib = make(GIB)
    result["after_1gib"] = readings(device, gpu)
    one_gib.delete()
    time.sleep(0.2)  # the platform and async allocators return memory on their own stream
    result["after_free"] = readings(device, gpu)
    if not quick:
        result["us_per_alloc"] = {str(size): _burst_time(make, size) for size in SIZES}
        result["fragmentation"] = _fragmentation(make, device, gpu)
    result["total_s"] = time.perf_counter() - started
    return result


def _burst_time(make, size: int) -> float:
    """Microseconds per array when allocating BURST arrays, then deleting them all."""
    make(size).delete()  # compile outside the timing
    count, begin = 0, time.perf_counter()
    while time.perf_counter() - begin < 0.5:
        arrays = [make(size) for _ in range(BURST)]
        for array in arrays:
            array.delete()
        count += BURST
    return (time.perf_counter() - begin) / count * 1e6


def _stats(device) -> dict:
    try:
        stats = device.memory_stats() or {}
    except Exception:  # an allocator without statistics
        return {}
    return {key: (value if value is None or value >= 0 else None) for key, value in stats.items()}


def _room(device, gpu: int) -> int:
    """What the allocator may still hand out: its limit (BFC) or the GPU's free memory."""
    stats = _stats(device)
    memory = (nvml.memory([gpu]) or [None])[0]
    free = int(getattr(memory, "free_bytes", None) or 0)
    if stats.get("bytes_limit") is not None and stats.get("bytes_in_use") is not None:
        pool_free = int(stats["bytes_limit"]) - int(stats["bytes_in_use"])
        return min(pool_free, free + int(stats.get("pool_bytes") or 0) - int(stats["bytes_in_use"]))
    return free


def _fits(make, nbytes: int, keep: list | None = None) -> bool:
    """Whether an array of *nbytes* can be allocated; kept in *keep*, else deleted at once."""
    try:
        array = make(nbytes)
    except Exception as exc:
        if jaxstats.is_resource_exhausted(exc):
            return False
        raise
    if keep is None:
        array.delete()
    else:
        keep.append(array)
    return True


def _fragmentation(make, device, gpu: int) -> dict:
    budget = min(int(_room(device, gpu) * 0.8), 48 * GIB)
    kept, holes = [], []
    while (len(kept) + 1) * (SMALL + LARGE) <= budget:
        if not (_fits(make, SMALL, keep=kept) and _fits(make, LARGE, keep=holes)):
            break  # the room was smaller than the allocator said
    for array in holes:
        array.delete()
    room = _room(device, gpu)
    low, high = 0, room // SMALL + 1  # in SMALL units: low fits, high is not yet known to
    probes, deadline, complete = 0, time.monotonic() + SEARCH_BUDGET_S, True
    while high - low > 1:
        if probes >= PROBES or time.monotonic() > deadline:
            complete = False  # a lower bound: each failed allocation may have waited
            break
        middle = (low + high) // 2
        probes += 1
        if _fits(make, middle * SMALL):
            low = middle
        else:
            high = middle
    stats = _stats(device)
    pool, in_use = stats.get("pool_bytes"), stats.get("bytes_in_use")
    return {
        "holes": len(holes),
        "held": len(kept) * SMALL,
        "room": room,
        "pool_free": None if pool is None or in_use is None else pool - in_use,
        "largest_ok": low * SMALL,
        "search_complete": complete,
        "probes": probes,
        "largest_free_block": stats.get("largest_free_block_bytes"),
    }


def target_gpu(requested: int, environ: dict[str, str]) -> tuple[int | None, dict[str, str], str]:
    """(NVML index, the CUDA_VISIBLE_DEVICES to run with, how it was chosen).

    A CUDA_VISIBLE_DEVICES the user set is kept exactly (UUIDs, MIG): the GPU is the first it
    names. Otherwise the requested NVML index, handed to CUDA by its UUID, which no ordering
    of devices can mistake.
    """
    gpus = nvml.gpus()
    if environ.get("CUDA_VISIBLE_DEVICES") is not None:
        seen = visible.visible_gpus(gpus, environ)
        if not seen.indices:
            return None, {}, f"CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']!r}: no GPU"
        return seen.indices[0], {}, "the first GPU CUDA_VISIBLE_DEVICES names"
    chosen = next((g for g in gpus if g.index == requested and g.mig is None), None)
    if chosen is not None and chosen.mig_mode:
        instances = [g for g in gpus if g.mig is not None and g.mig.parent_index == requested]
        if not instances or not instances[0].uuid:
            return None, {}, f"--gpu {requested} is in MIG mode and NVML lists no instance of it"
        first = instances[0]
        how = f"--gpu {requested} is in MIG mode: its {first.label} ({first.uuid})"
        return first.index, {"CUDA_VISIBLE_DEVICES": first.uuid}, how
    if chosen is None or not chosen.uuid:
        # JAX may still run (and tell whether it has a CUDA backend); nothing NVML says about
        # it can be checked then, which the verdict reports.
        return requested, {}, f"--gpu {requested}, which NVML does not know (CUDA's first GPU)"
    return requested, {"CUDA_VISIBLE_DEVICES": chosen.uuid}, f"--gpu {requested} ({chosen.uuid})"


def env_for(mode: modes.AllocatorMode, visible_devices: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in jaxlib.MANAGED_VARIABLES}
    for name, value in modes.mode_variables(mode).items():
        if value is not None:
            env[name] = value
    env.update(visible_devices)
    env.pop("JAX_PLATFORMS", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"  # XLA's out-of-memory warnings during the search
    return env


def run_mode(text: str, gpu: int, devices: dict, timeout: float, quick: bool) -> dict:
    try:
        mode = modes.parse_mode(text)
    except modes.ModeError as exc:
        return {"mode": text, "skipped": str(exc).split(";")[0]}
    command = [sys.executable, __file__, "--child", text, "--gpu", str(gpu)]
    if quick:
        command.append("--quick")
    began = time.perf_counter()
    try:
        done = subprocess.run(
            command, env=env_for(mode, devices), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"mode": text, "error": f"timed out after {timeout:g} s", "wall_s": timeout}
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("@@")), None)
    if line is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"mode": text, "error": f"exit {done.returncode}: {tail[:200]}"}
    result = json.loads(line[2:])
    result["wall_s"] = time.perf_counter() - began
    return result


def near(a: int | None, b: int | None, tolerance: int = TOLERANCE) -> bool | None:
    return None if a is None or b is None else abs(a - b) <= tolerance


def checks(result: dict) -> list[tuple[str, bool | None, str]]:
    """(check, passed or None when it cannot be judged, detail) for one mode's result."""
    start, grown, freed = result["start"], result["after_1gib"], result["after_free"]
    total = start["nvml_total"] or 0
    found = []
    for label, reading in (("start", start), ("1 GiB", grown)):
        # nvidia-smi's memory.used leaves out what the driver reserves; NVML's v2 counts it.
        smi_used = reading["smi_used"]
        ours = reading["nvml_used"]
        if ours is not None and reading["nvml_reserved"] is not None:
            ours -= reading["nvml_reserved"]
        found.append(
            (f"{label}: GPU used = nvidia-smi", near(ours, smi_used), _pair(ours, smi_used))
        )
        found.append(
            (
                f"{label}: our pid = nvidia-smi",
                near(reading["nvml_self"], reading["smi_self"]),
                _pair(reading["nvml_self"], reading["smi_self"]),
            )
        )
    found.append(
        (
            "total = nvidia-smi",
            near(total, start["smi_total"], MIB),
            _pair(total, start["smi_total"]),
        )
    )
    found.extend(_mig_checks(start))
    self_start = start["nvml_self"]
    name = result["mode"]
    if self_start is not None and total and name in EXPECTED_SHARE:
        low, high = EXPECTED_SHARE[name]
        share = self_start / total
        found.append((f"footprint at start in [{low:.0%}, {high:.0%}]", low <= share <= high,
                      f"{share:.1%}"))  # fmt: skip
    if name in GROW_ON_DEMAND and grown["nvml_self"] is not None and self_start:
        growth = grown["nvml_self"] - self_start
        found.append(("1 GiB array grows the process by >= 1 GiB", growth >= GIB - TOLERANCE,
                      format_bytes(growth)))  # fmt: skip
    if name == "platform" and freed["nvml_self"] is not None and self_start is not None:
        back = freed["nvml_self"] - self_start
        found.append(("platform returns the 1 GiB on delete", back < GIB // 2, format_bytes(back)))
    if name == "platform":
        found.append(("platform has no pool", start["jax_pool_bytes"] in (None, 0),
                      format_bytes(start["jax_pool_bytes"])))  # fmt: skip
    if name in ("on", "fraction 0.3") and start["jax_pool_bytes"] and self_start:
        fraction = 0.3 if name == "fraction 0.3" else jaxlib.DEFAULT_FRACTION
        inside = _window(fraction, total, self_start)
        found.append(("jax_nbmem's preallocation window holds this process", inside,
                      format_bytes(self_start)))  # fmt: skip
    if "fragmentation" in result:
        frag = result["fragmentation"]
        pool_free, block = frag.get("pool_free"), frag.get("largest_free_block")
        if pool_free is not None and block is not None:
            found.append(("largest free block <= free in the pool", block <= pool_free + TOLERANCE,
                          _pair(block, pool_free)))  # fmt: skip
    return found


def _mig_checks(start: dict) -> list[tuple[str, bool | None, str]]:
    """What can be judged on a MIG instance: that jax_nbmem reads the instance's own memory."""
    mig = start.get("mig")
    if not mig:
        return []
    total, parent_total = start["nvml_total"], mig.get("parent_total")
    below = None if total is None or parent_total is None else total < parent_total
    why = mig.get("parent_problem") or _pair(total, parent_total)
    return [
        ("MIG: jax_nbmem names the instance", bool(mig.get("profile")), mig.get("label") or ""),
        ("MIG: the instance's total is below the GPU's", below, why),
        ("MIG: NVML lists this process on the instance", start["nvml_self"] is not None,
         format_bytes(start["nvml_self"])),
    ]  # fmt: skip


def _window(fraction: float, total: int, held: int) -> bool:
    expected = fraction * total
    return expected - PREALLOCATION_BELOW_BYTES <= held <= expected + PREALLOCATION_ABOVE_BYTES


def calibration(results: list[dict]) -> list[dict]:
    """What the preallocation window should be, from the preallocating modes' readings.

    The pool is fraction x CUDA's total; NVML counts against its own total (which includes
    what the driver keeps) and adds the process's CUDA context: ``below`` is how far the pool
    falls short of fraction x NVML's total, ``context`` what the process holds beyond it.
    """
    rows = []
    for result in results:
        name = result.get("mode")
        start = result.get("start")
        if not start or name not in ("on", "fraction 0.3", "cuda_async"):
            continue
        pool, held, total = start["jax_pool_bytes"], start["nvml_self"], start["nvml_total"]
        if pool is None and name == "cuda_async":
            pool = start["jax_bytes_limit"]
        if pool is None or held is None or not total:
            rows.append({"mode": name, "pool": pool, "held": held, "below": None, "context": None})
            continue
        fraction = 0.3 if name == "fraction 0.3" else jaxlib.DEFAULT_FRACTION
        rows.append({
            "mode": name, "pool": pool, "held": held,
            "below": int(fraction * total - pool),
            "context": int(held - pool),
        })  # fmt: skip
    return rows


def verdict(results: list[dict], verdicts: list) -> tuple[int, str | None]:
    """The exit status and, when not 0, one line saying why."""
    measured = [r for r in results if "start" in r]
    backendless = [r for r in results if "no_gpu_backend" in r]
    if not measured and backendless:
        return (
            2,
            "A GPU is there but the installed JAX has no CUDA backend (pip install jax[cuda12]).",
        )
    if measured and all(r["start"]["nvml_self"] is None for r in measured):
        pids = sorted({str(p) for r in measured for p in r["start"].get("nvml_pids") or []})
        return 3, (
            "cannot verify: NVML does not list this process "
            f"(PID {measured[0]['start'].get('pid')}; NVML lists {', '.join(pids) or 'none'}): "
            "a container without the host's PID namespace, or MIG without the rights to list "
            "processes. Run with the host's PID namespace (docker run --pid=host)."
        )
    failed = [v for v in verdicts if v[2] is False]
    crashed = [r for r in results if "error" in r]
    if failed or crashed:
        names = [f"{v[0]}: {v[1]}" for v in failed] + [
            f"{r['mode']}: {r['error']}" for r in crashed
        ]
        return 1, "FAILED: " + "; ".join(names)
    return 0, None


def _pair(ours: int | None, theirs: int | None) -> str:
    return f"{format_bytes(ours)} vs {format_bytes(theirs)}"


def print_tables(results: list[dict]) -> list[tuple[str, str, bool | None, str]]:
    verdicts = []
    print("\n## Footprint (this process per NVML after its first array; JAX memory_stats)\n")
    print("| mode | start | JAX in use / pool / limit | after 1 GiB | after delete | start | run |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for result in results:
        if "start" not in result:
            why = result.get("skipped") or result.get("error") or result.get("no_gpu_backend")
            print(f"| {result['mode']} | {why} | | | | | |")
            continue
        s, g, f = result["start"], result["after_1gib"], result["after_free"]
        jax_figures = " / ".join(
            format_bytes(s[k]) for k in ("jax_bytes_in_use", "jax_pool_bytes", "jax_bytes_limit")
        )
        print(
            f"| {result['mode']} | {format_bytes(s['nvml_self'])} | {jax_figures} | "
            f"{format_bytes(g['nvml_self'])} | {format_bytes(f['nvml_self'])} | "
            f"{result['start_s']:.1f} s | {result.get('wall_s', 0):.0f} s |"
        )
        verdicts.extend((result["mode"], *check) for check in checks(result))
    frag_rows = [r for r in results if "fragmentation" in r]
    if frag_rows:
        print("\n## Allocation and fragmentation\n")
        sizes = " | ".join(f"µs/alloc {format_bytes(size)}" for size in SIZES)
        print(f"| mode | {sizes} | holes | free in pool | largest that fits | largest_free_block |")
        print("|---|" + "---:|" * (len(SIZES) + 4))
        for result in frag_rows:
            speed = " | ".join(f"{result['us_per_alloc'][str(size)]:.1f}" for size in SIZES)
            frag = result["fragmentation"]
            bound = "" if frag["search_complete"] else "≥"
            print(
                f"| {result['mode']} | {speed} | {frag['holes']} x {format_bytes(LARGE)} | "
                f"{format_bytes(frag['pool_free'])} | {bound}{format_bytes(frag['largest_ok'])} | "
                f"{format_bytes(frag['largest_free_block'])} |"
            )
    print("\n## Preallocation window (calibration)\n")
    print("| mode | pool | NVML self | pool short of fraction x NVML total | context |")
    print("|---|---:|---:|---:|---:|")
    for row in calibration(results):
        print(
            f"| {row['mode']} | {format_bytes(row['pool'])} | {format_bytes(row['held'])} | "
            f"{format_bytes(row['below'])} | {format_bytes(row['context'])} |"
        )
    print(
        f"jax_nbmem's window: -{format_bytes(PREALLOCATION_BELOW_BYTES)} / "
        f"+{format_bytes(PREALLOCATION_ABOVE_BYTES)} around fraction x NVML total."
    )
    print("\n## Checks\n")
    print("| mode | check | result | figures |")
    print("|---|---|---|---|")
    for mode, check, passed, detail in verdicts:
        shown = "unknown" if passed is None else ("ok" if passed else "FAILED")
        print(f"| {mode} | {check} | {shown} | {detail} |")
    return verdicts


def gpu_present(gpu: int) -> str | None:
    """None when nvidia-smi lists GPU *gpu*; else why there is nothing to check."""
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    rows = smi(gpu, "--query-gpu=name")
    if not rows:
        return f"nvidia-smi lists no GPU {gpu}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML/nvidia-smi index of the GPU")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per mode")
    parser.add_argument("--quick", action="store_true", help="footprints of on, off, cuda_async")
    parser.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("@@" + json.dumps(child(args.child, args.gpu, args.quick)))
        return 0
    if args.case:
        print("@@" + json.dumps(gpu_check_cases.case_child(args.case, args.gpu), default=str))
        return 0
    why = gpu_present(args.gpu)
    if why is not None:
        print(f"no NVIDIA GPU: nothing to check ({why})")
        return 0
    gpu, devices, chosen = target_gpu(args.gpu, dict(os.environ))
    if gpu is None:
        print(f"cannot verify: {chosen}")
        return 3
    chosen_modes = QUICK_MODES if args.quick else MODES
    print(f"checking GPU {gpu}, {chosen}: {', '.join(chosen_modes)}")
    print(jaxlib.installed_jaxlib().describe())
    results, began = [], time.perf_counter()
    for mode in chosen_modes:
        results.append(run_mode(mode, gpu, devices, args.timeout, args.quick))
        print(f"  {mode}: {results[-1].get('wall_s', 0):.0f} s", flush=True)
    verdicts = print_tables(results)
    if not args.quick and any("start" in r for r in results):  # the source's cases, then
        verdicts += gpu_check_cases.check_all(__file__, gpu, devices, args.timeout, results)
    status, reason = verdict(results, verdicts)
    print(f"\n{len(chosen_modes)} modes in {time.perf_counter() - began:.0f} s")
    if reason:
        print(reason)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "gpu": gpu, "chosen": chosen, "jaxlib": jaxlib.installed_jaxlib().describe(),
            "status": status, "reason": reason, "results": results,
            "checks": [list(v) for v in verdicts], "calibration": calibration(results),
        }, indent=1))  # fmt: skip
    return status


if __name__ == "__main__":
    sys.exit(main())
