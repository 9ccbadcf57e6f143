"""gpu_check.py's cases for what JAX's and XLA's source say, and for JAX beside other frameworks.

Each case runs in a fresh process (``gpu_check.py --case NAME``) on the GPU being checked, and
says what it saw; :func:`case_checks` judges it. The statements checked (docs/magics.md):

- ``vmm``: ``memory_stats()`` is None and the process grows with its arrays (no pool up front);
- ``address``: a passthrough: no pool up front, a 1 GiB array grows the process, and deleting
  it gives the memory back;
- ``off, cuda_async``: nothing taken up front (under 10% of the GPU at start), though XLA may
  still report a ``bytes_limit``;
- ``cuda_async`` grows past ``bytes_limit``: at fraction 0.1, an array of 20% of the GPU fits;
- ``bytes_reserved`` is 0 (or absent) in every BFC mode (from gpu_check's own modes);
- a variable changed after the backend started has no effect: ``on``, then
  ``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` and ``jax.extend.backend.clear_backends()``: the new
  client still reports BFC's counters and its 75% limit;
- PyTorch + JAX and CuPy + JAX (where their CUDA builds are installed; skipped with the reason
  otherwise): jax_nbmem reads nothing from a framework that has not started (PyTorch stays
  uninitialised), then, once each holds 1 GiB, its split of the process's NVML bytes gives the
  framework at least 1 GiB and leaves CUDA's contexts and the rest under 2 GiB.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time

MIB, GIB = 1 << 20, 1 << 30
CASES = {
    # name: (environment, the allocator the installed jaxlib must accept, or None)
    "vmm": ({"XLA_PYTHON_CLIENT_ALLOCATOR": "vmm"}, "vmm"),
    "address": ({"XLA_PYTHON_CLIENT_ALLOCATOR": "address"}, "address"),
    "off, cuda_async": (
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
        "cuda_async",
    ),
    "cuda_async past its limit": (
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async", "XLA_CLIENT_MEM_FRACTION": "0.1"},
        "cuda_async",
    ),
    "changed after start": ({}, None),
    "torch + JAX": ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, None),
    "cupy + JAX": ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, None),
}
_NEEDS = {"torch + JAX": "torch", "cupy + JAX": "cupy"}


def skip_reason(name: str, allocators: tuple[str, ...]) -> str | None:
    """Why *name* cannot run here (None: it can), asked without importing anything."""
    needed = CASES[name][1]
    if needed is not None and needed not in allocators:
        return f"the installed jaxlib does not accept {needed}"
    module = _NEEDS.get(name)
    if module is not None and importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    return None


def _own_bytes(nvml, gpu: int) -> int | None:
    mine = [p.used_bytes for p in nvml.processes([gpu]) if p.pid == os.getpid()]
    return sum(mine) if mine and None not in mine else None


def case_child(name: str, gpu: int) -> dict:
    """Run case *name* in this fresh process (its environment already set)."""
    from jax_nbmem.gpu import nvml

    if name in _NEEDS:
        return _framework_case(name, gpu, nvml)
    import jax
    import jax.numpy as jnp

    try:
        device = jax.devices("gpu")[0]
    except RuntimeError as exc:
        return {"case": name, "no_gpu_backend": str(exc)[:300]}
    jnp.ones((1,), device=device).block_until_ready()
    time.sleep(0.2)
    total = (nvml.memory([gpu]) or [None])[0].total_bytes
    seen: dict = {
        "case": name,
        "total": total,
        "stats_start": device.memory_stats(),
        "self_start": _own_bytes(nvml, gpu),
    }
    if name == "changed after start":
        os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        try:
            from jax.extend.backend import clear_backends
        except ImportError:  # before jax 0.4.36 it was jax.clear_backends
            clear_backends = jax.clear_backends
        clear_backends()
        device = jax.devices("gpu")[0]
        jnp.ones((1,), device=device).block_until_ready()
        seen["stats_after_clear"] = device.memory_stats()
        return seen
    size = int(0.2 * total) if name == "cuda_async past its limit" else GIB
    array = jnp.zeros((size,), jnp.uint8, device=device).block_until_ready()
    seen["stats_grown"] = device.memory_stats()
    seen["self_grown"] = _own_bytes(nvml, gpu)
    array.delete()
    time.sleep(0.3)
    seen["self_freed"] = _own_bytes(nvml, gpu)
    return seen


def _framework_case(name: str, gpu: int, nvml) -> dict:
    module = _NEEDS[name]
    framework = importlib.import_module(module)
    from jax_nbmem.gpu.frameworks import read_frameworks, split_own_memory

    seen: dict = {"case": name}
    if module == "torch":
        if not framework.cuda.is_available():
            return {"case": name, "skipped": "torch has no CUDA here"}
        read_frameworks(cuda_running=False)  # before it started: must start nothing
        seen["untouched"] = not framework.cuda.is_initialized()
        held = framework.ones(GIB // 4, device="cuda:0")  # 1 GiB of float32
        seen["framework_says"] = int(framework.cuda.memory_reserved(0))
    else:
        held = framework.ones(GIB // 4, dtype=framework.float32)
        seen["untouched"] = True  # CuPy's pool is read only where CUDA already runs
        seen["framework_says"] = int(framework.get_default_memory_pool().total_bytes())
    import jax
    import jax.numpy as jnp

    try:
        device = jax.devices("gpu")[0]
    except RuntimeError as exc:
        return {"case": name, "no_gpu_backend": str(exc)[:300]}
    array = jnp.zeros((GIB,), jnp.uint8, device=device).block_until_ready()
    time.sleep(0.2)
    stats = device.memory_stats() or {}
    own = _own_bytes(nvml, gpu)
    rows = split_own_memory(
        {gpu: own}, [gpu], {0: stats.get("pool_bytes")}, read_frameworks(cuda_running=True)
    )
    seen.update(split=rows, nvml_self=own)
    del held, array
    return seen


def case_checks(seen: dict) -> list[tuple[str, bool | None, str]]:
    """(check, passed or None when it cannot be judged, detail) for one case's result."""
    name, total = seen["case"], seen.get("total") or 0
    start, grown, freed = seen.get("self_start"), seen.get("self_grown"), seen.get("self_freed")
    found: list[tuple[str, bool | None, str]] = []

    def grew() -> bool | None:
        return None if grown is None or start is None else grown - start >= GIB - 16 * MIB

    if name == "vmm":
        found.append(
            ("memory_stats() is None", seen["stats_start"] is None, str(seen["stats_start"])[:80])
        )
        found.append(
            ("no pool up front: a 1 GiB array grows the process", grew(), f"{start} -> {grown}")
        )
    elif name == "address":
        found.append(
            ("no pool up front: a 1 GiB array grows the process", grew(), f"{start} -> {grown}")
        )
        back = None if freed is None or grown is None else grown - freed >= GIB // 2
        found.append(("deleting it gives the memory back", back, f"{grown} -> {freed}"))
    elif name == "off, cuda_async":
        share = None if start is None or not total else start / total
        found.append(
            (
                "nothing taken up front (< 10% at start)",
                None if share is None else share < 0.10,
                f"{share}",
            )
        )
    elif name == "cuda_async past its limit":
        stats = seen.get("stats_grown") or {}
        limit, in_use = stats.get("bytes_limit"), stats.get("bytes_in_use")
        past = None if limit is None or in_use is None else in_use > limit
        found.append(("an array past bytes_limit fits", past, f"in use {in_use}, limit {limit}"))
    elif name == "changed after start":
        after = seen.get("stats_after_clear") or {}
        limit = after.get("bytes_limit")
        kept = None if not total or limit is None else 0.70 <= limit / total <= 0.80
        found.append(
            (
                "clear_backends() kept the settings JAX started with (BFC, 75%)",
                kept,
                f"limit {limit} of {total}",
            )
        )
    elif name in _NEEDS:
        found.append(("nothing read starts the framework", seen.get("untouched"), ""))
        [row] = seen.get("split") or [None]
        if row is not None:
            part = row["parts"].get(_NEEDS[name])
            found.append(
                (
                    f"{_NEEDS[name]} holds >= 1 GiB in the split",
                    None if part is None else part >= GIB,
                    f"{part} ({seen.get('framework_says')})",
                )
            )
            rest = row["other_bytes"]
            found.append(
                (
                    "contexts and the rest < 2 GiB",
                    None if rest is None else rest < 2 * GIB,
                    str(rest),
                )
            )
    return found


def reserved_checks(results: list[dict]) -> list[tuple[str, str, bool | None, str]]:
    """``bytes_reserved`` is 0 or absent in every BFC mode gpu_check measured."""
    found = []
    for result in results:
        start = result.get("start")
        if start and result["mode"] in ("on", "off", "fraction 0.3"):
            value = start.get("jax_bytes_reserved")
            found.append((result["mode"], "bytes_reserved is 0", value in (0, None), str(value)))
    return found


def run_cases(script: str, gpu: int, devices: dict, timeout: float, allocators, managed) -> list:
    """Run every case in its own process; a case that cannot run here says why."""
    results = []
    for name, (variables, _) in CASES.items():
        why = skip_reason(name, tuple(allocators))
        if why is not None:
            results.append({"case": name, "skipped": why})
            continue
        env = {k: v for k, v in os.environ.items() if k not in managed}
        env.update(variables, **devices)
        env.pop("JAX_PLATFORMS", None)
        command = [sys.executable, script, "--case", name, "--gpu", str(gpu)]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            results.append({"case": name, "error": f"timed out after {timeout:g} s"})
            continue
        line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("@@")), None)
        if line is None:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            results.append({"case": name, "error": f"exit {done.returncode}: {tail[:200]}"})
        else:
            results.append(json.loads(line[2:]))
    return results


def case_verdicts(results: list[dict]) -> list[tuple[str, str, bool | None, str]]:
    """Each case's checks, and a row for each case that did not run (unknown, with why)."""
    found = []
    for seen in results:
        why = seen.get("skipped") or seen.get("error") or seen.get("no_gpu_backend")
        if why:
            passed = False if "error" in seen else None
            found.append((seen["case"], "ran", passed, why))
            continue
        found.extend((seen["case"], *check) for check in case_checks(seen))
    return found


def check_all(script: str, gpu: int, devices: dict, timeout: float, results: list) -> list:
    """Run the cases, print their checks (gpu_check's table goes on), return the verdicts."""
    from jax_nbmem.allocator import jaxlib

    allocators = jaxlib.installed_jaxlib().allocators
    cases = run_cases(script, gpu, devices, timeout, allocators, jaxlib.MANAGED_VARIABLES)
    found = case_verdicts(cases) + reserved_checks(results)
    for case, check, passed, detail in found:
        shown = "unknown" if passed is None else ("ok" if passed else "FAILED")
        print(f"| {case} | {check} | {shown} | {detail} |")
    return found
