"""On a real NVIDIA GPU: each allocator mode's footprint, the monitor against nvidia-smi, speed.

    python benchmarks/gpu_check.py [--gpu 0] [--timeout 100]

For each mode (on, off, platform, cuda_async, fraction 0.3; those the installed jaxlib rejects
are skipped), a fresh Python process starts JAX on one GPU in that mode and records:

- footprint: this process's GPU memory per NVML (jax_nbmem.gpu.nvml) and JAX's ``memory_stats()``
  after start, after allocating 1 GiB, and after deleting it;
- monitor: jax_nbmem.gpu.nvml's used/total and this pid's bytes against
  ``nvidia-smi --query-gpu=memory.used,memory.total`` and ``--query-compute-apps=pid,used_memory``;
- allocation throughput: bursts of 64 arrays allocated then deleted, at 4 KiB, 1 MiB, 64 MiB;
- fragmentation: 64 MiB and 192 MiB arrays interleaved up to 80% of the room left (at most
  48 GiB), the 192 MiB ones deleted, then the largest allocation that still succeeds (binary
  search, 64 MiB steps) next to the free room and ``largest_free_block_bytes``.

Tables come last. Exit status: 0 when every check passed, or when there is no NVIDIA GPU (it
prints "no NVIDIA GPU: nothing to check" and returns at once); 1 when a check failed; 2 when a
GPU is there but the installed JAX cannot use it (no CUDA backend).
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

from jax_nbmem.allocator import jaxlib, modes  # noqa: E402
from jax_nbmem.gpu import jaxstats, nvml
from jax_nbmem.units import format_bytes  # noqa: E402

MODES = ("on", "off", "platform", "cuda_async", "fraction 0.3")
MIB, GIB = 1 << 20, 1 << 30
SIZES = (4 << 10, 1 << 20, 64 << 20)
BURST = 64
SMALL, LARGE = 64 * MIB, 192 * MIB
# Readings are taken a few milliseconds apart from two tools; the driver counts in MiB.
TOLERANCE = 16 * MIB


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


def readings(device, gpu: int) -> dict:
    """JAX's stats, jax_nbmem.gpu.nvml's figures and nvidia-smi's, taken together."""
    stats = _stats(device)
    memory = (nvml.memory([gpu]) or [None])[0]
    mine = [p.used_bytes for p in nvml.processes([gpu]) if p.pid == os.getpid()]
    gpu_row = (smi(gpu, "--query-gpu=memory.used,memory.total") or [[None, None]])[0]
    apps = smi(gpu, "--query-compute-apps=pid,used_memory") or []
    smi_self = [int(row[1]) * MIB for row in apps if row[0] == str(os.getpid())]
    keys = ("bytes_in_use", "peak_bytes_in_use", "bytes_reserved", "bytes_limit")
    return {
        **{f"jax_{key}": stats.get(key) for key in (*keys, "largest_free_block_bytes")},
        "nvml_used": getattr(memory, "used_bytes", None),
        "nvml_reserved": getattr(memory, "reserved_bytes", None),
        "nvml_total": getattr(memory, "total_bytes", None),
        "nvml_free": getattr(memory, "free_bytes", None),
        "nvml_self": sum(mine) if mine and None not in mine else None,
        "smi_used": int(gpu_row[0]) * MIB if gpu_row[0] else None,
        "smi_total": int(gpu_row[1]) * MIB if gpu_row[1] else None,
        "smi_self": smi_self[0] if smi_self else None,
        "smi_pids": [row[0] for row in apps],
    }


def child(mode: str, gpu: int) -> dict:
    """Run in a fresh process whose environment already selects *mode*."""
    import jax
    import jax.numpy as jnp

    started = time.perf_counter()
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError as exc:
        return {"mode": mode, "no_gpu_backend": str(exc)[:300]}
    jnp.ones((1,), device=device).block_until_ready()
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
    result["us_per_alloc"] = {str(size): _burst_time(make, size) for size in SIZES}
    result["fragmentation"] = _fragmentation(make, device, gpu)
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
        return device.memory_stats() or {}
    except Exception:  # an allocator without statistics
        return {}


def _room(device, gpu: int) -> int:
    stats = _stats(device)
    if stats.get("bytes_limit") is not None and stats.get("bytes_in_use") is not None:
        return int(stats["bytes_limit"]) - int(stats["bytes_in_use"])
    memory = (nvml.memory([gpu]) or [None])[0]
    return int(getattr(memory, "free_bytes", None) or 0)


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
    while high - low > 1:
        middle = (low + high) // 2
        if _fits(make, middle * SMALL):
            low = middle
        else:
            high = middle
    stats = _stats(device)
    return {
        "holes": len(holes),
        "held": len(kept) * SMALL,
        "room": room,
        "largest_ok": low * SMALL,
        "largest_free_block": stats.get("largest_free_block_bytes"),
    }


def env_for(mode: modes.AllocatorMode, gpu: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in jaxlib.MANAGED_VARIABLES}
    for name, value in modes.mode_variables(mode).items():
        if value is not None:
            env[name] = value
    # One GPU, numbered as NVML and nvidia-smi number it.
    env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(gpu))
    env.pop("JAX_PLATFORMS", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"  # XLA's out-of-memory warnings during the search
    return env


def run_mode(text: str, gpu: int, timeout: float) -> dict:
    try:
        mode = modes.parse_mode(text)
    except modes.ModeError as exc:
        return {"mode": text, "skipped": str(exc).split(";")[0]}
    command = [sys.executable, __file__, "--child", text, "--gpu", str(gpu)]
    try:
        done = subprocess.run(
            command, env=env_for(mode, gpu), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"mode": text, "error": f"timed out after {timeout:g} s"}
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("@@")), None)
    if line is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"mode": text, "error": f"exit {done.returncode}: {tail[:200]}"}
    return json.loads(line[2:])


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
    self_start = start["nvml_self"]
    name = result["mode"]
    if self_start is not None and total:
        share = self_start / total
        expected = {"on": (0.70, 0.80), "fraction 0.3": (0.27, 0.33)}.get(name, (0.0, 0.10))
        found.append(
            (
                f"footprint at start in {expected}",
                expected[0] <= share <= expected[1],
                f"{share:.1%}",
            )
        )
    if name in ("off", "platform", "cuda_async") and grown["nvml_self"] is not None and self_start:
        growth = grown["nvml_self"] - self_start
        found.append(
            (
                "1 GiB array grows the process by >= 1 GiB",
                growth >= GIB - TOLERANCE,
                format_bytes(growth),
            )
        )
    if name == "platform" and freed["nvml_self"] is not None and self_start is not None:
        back = freed["nvml_self"] - self_start
        found.append(("platform returns the 1 GiB on delete", back < GIB // 2, format_bytes(back)))
    return found


def _pair(ours: int | None, theirs: int | None) -> str:
    return f"{format_bytes(ours)} vs {format_bytes(theirs)}"


def print_tables(results: list[dict]) -> list[tuple[str, str, bool | None, str]]:
    verdicts = []
    print("\n## Footprint (this process per NVML; JAX memory_stats)\n")
    print(
        "| mode | start | JAX in use / reserved / limit | after 1 GiB | after delete | start time |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for result in results:
        if "start" not in result:
            why = result.get("skipped") or result.get("error") or result.get("no_gpu_backend")
            print(f"| {result['mode']} | {why} | | | | |")
            continue
        s, g, f = result["start"], result["after_1gib"], result["after_free"]
        jax_figures = " / ".join(
            format_bytes(s[k])
            for k in ("jax_bytes_in_use", "jax_bytes_reserved", "jax_bytes_limit")
        )
        print(
            f"| {result['mode']} | {format_bytes(s['nvml_self'])} | {jax_figures} | "
            f"{format_bytes(g['nvml_self'])} | {format_bytes(f['nvml_self'])} | "
            f"{result['start_s']:.1f} s |"
        )
        verdicts.extend((result["mode"], *check) for check in checks(result))
    print("\n## Allocation and fragmentation\n")
    sizes = " | ".join(f"µs/alloc {format_bytes(size)}" for size in SIZES)
    print(f"| mode | {sizes} | holes | room | largest that fits | largest_free_block |")
    print("|---|" + "---:|" * (len(SIZES) + 4))
    for result in results:
        if "start" not in result:
            continue
        speed = " | ".join(f"{result['us_per_alloc'][str(size)]:.1f}" for size in SIZES)
        frag = result["fragmentation"]
        print(
            f"| {result['mode']} | {speed} | {frag['holes']} x {format_bytes(LARGE)} | "
            f"{format_bytes(frag['room'])} | {format_bytes(frag['largest_ok'])} | "
            f"{format_bytes(frag['largest_free_block'])} |"
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
    parser.add_argument("--timeout", type=float, default=100, help="seconds per mode")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("@@" + json.dumps(child(args.child, args.gpu)))
        return 0
    why = gpu_present(args.gpu)
    if why is not None:
        print(f"no NVIDIA GPU: nothing to check ({why})")
        return 0
    print(f"checking GPU {args.gpu}: {', '.join(MODES)}; {jaxlib.installed_jaxlib().describe()}")
    results = []
    for mode in MODES:
        begin = time.perf_counter()
        results.append(run_mode(mode, args.gpu, args.timeout))
        print(f"  {mode}: {time.perf_counter() - begin:.0f} s", flush=True)
    verdicts = print_tables(results)
    if all("no_gpu_backend" in r or "skipped" in r for r in results) and any(
        "no_gpu_backend" in r for r in results
    ):
        print(
            "\nA GPU is there but the installed JAX has no CUDA backend (pip install jax[cuda12])."
        )
        return 2
    failed = [v for v in verdicts if v[2] is False] + [r for r in results if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
