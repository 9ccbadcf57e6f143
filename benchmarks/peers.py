"""jax_nbmem against its peers, and the sampler's CPU cost, as ratios measured in one run.

    python benchmarks/peers.py [--cells 200] [--rounds 5] [--peers-dir DIR] [--no-install]

1. Per-cell overhead: a trivial cell (`x = 1`) and a CPU-bound cell (a pure-Python loop of about
   half a second) in one IPython process, with nothing loaded (bare), with jax_nbmem, with
   ipyexperiments' CellLogger and with ipython_memory_usage. Rounds alternate (the order rotates
   each round) so that drift in the machine's speed hits every side alike; each ratio is taken
   against the bare figure of the same round, and medians are reported.
2. Sampler CPU cost at 10, 20 and 50 Hz: CPU seconds the sampler thread spends per wall second
   (``time.thread_time`` read on that thread at each tick), and the process's CPU time over a
   fixed sleep with the sampler running minus the same sleep with it stopped.

Both run against the simulated GPU (the C stand-in for libnvidia-ml.so.1, so NVML calls are
real calls through pynvml) when a C compiler is there, else without NVML; the header says which.

The peers are not dependencies of jax_nbmem. They are installed on demand, with
``pip install --no-deps --target DIR ipyexperiments ipython_memory_usage memory_profiler``
into DIR (default ``~/.cache/jax_nbmem/bench-peers``), which only the benchmark's subprocesses
put on their path; their remaining dependencies (IPython, psutil, pynvml from nvidia-ml-py) are
already ours. A peer that cannot be installed or fails to start gets its reason in its row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jax_nbmem import simgpu  # noqa: E402

PEER_PACKAGES = ("ipyexperiments", "ipython_memory_usage", "memory_profiler")
PEER_MODULES = {
    "ipyexperiments CellLogger": "ipyexperiments.cell_logger",
    "ipython_memory_usage": "ipython_memory_usage",
}

CELLS_DRIVER = textwrap.dedent(
    """
    import io, json, sys, threading, time, types
    from IPython.testing.globalipapp import start_ipython
    cells, rounds = int(sys.argv[1]), int(sys.argv[2])
    results = sys.stdout
    sys.stdout = io.StringIO()  # the peers print after every cell; nobody reads it here
    shell = start_ipython()
    BURN = "def burn(n=15_000_000):\\n    t = 0\\n    for i in range(n):\\n        t += i * i\\n"
    shell.run_cell(BURN, store_history=True)

    def trivial():
        start = time.perf_counter()
        for _ in range(cells):
            shell.run_cell("x = 1", store_history=True)
        sys.stdout.seek(0); sys.stdout.truncate()
        return (time.perf_counter() - start) / cells

    def cpu_bound():
        start = time.perf_counter()
        shell.run_cell("burn()", store_history=True)
        return time.perf_counter() - start

    def jax_nbmem_on():
        shell.run_line_magic("load_ext", "jax_nbmem")
        time.sleep(0.3)  # let the sampler reach its steady rate
        return lambda: shell.run_line_magic("unload_ext", "jax_nbmem")

    def cell_logger_on():
        from ipyexperiments.cell_logger import CellLogger
        logger = CellLogger(exp=types.SimpleNamespace(backend="cpu"), compact=True).start()
        return logger.stop

    def memory_usage_on():
        from ipython_memory_usage import ipython_memory_usage as imu
        imu.start_watching_memory()

        def stop():
            imu.stop_watching_memory()
            # Its per-cell sampling thread can start after the cell ended and then runs for up
            # to 60 s; tell any such thread to stop so it does not slow the next figures.
            deadline = time.monotonic() + 5
            while threading.active_count() > baseline_threads and time.monotonic() < deadline:
                imu.keep_watching = False
                time.sleep(0.01)
        return stop

    configs = {"bare IPython": lambda: (lambda: None), "jax_nbmem": jax_nbmem_on,
               "ipyexperiments CellLogger": cell_logger_on,
               "ipython_memory_usage": memory_usage_on}
    figures = {name: {"cell": [], "cpu": []} for name in configs}
    failed = {}
    trivial(); cpu_bound()  # warm up
    baseline_threads = threading.active_count()
    for round_number in range(rounds):
        names = list(configs)
        names = names[round_number % len(names):] + names[:round_number % len(names)]
        for name in names:
            if name in failed:
                continue
            try:
                stop = configs[name]()
            except Exception as exc:
                failed[name] = f"failed to start: {type(exc).__name__}: {exc}"[:160]
                continue
            figures[name]["cell"].append(trivial())
            figures[name]["cpu"].append(cpu_bound())
            stop()
            deadline = time.monotonic() + 5  # let per-cell threads wind down before the next
            while threading.active_count() > baseline_threads and time.monotonic() < deadline:
                time.sleep(0.01)
    results.write("@@" + json.dumps({"figures": figures, "failed": failed}) + "\\n")
    """
)

SAMPLER_DRIVER = textwrap.dedent(
    """
    import json, sys, threading, time
    import jax.numpy as jnp
    from jax_nbmem.record.sampler import Sampler
    window = float(sys.argv[1])
    arrays = [jnp.ones((256, 256)) for _ in range(50)]  # the backend is up, arrays are live
    rows = {}
    for hz in (10, 20, 50):
        idle_start = time.process_time(); time.sleep(window)
        idle = time.process_time() - idle_start
        sampler = Sampler(interval=1 / hz)
        stamps = []
        sampler.subscribe(lambda sample: stamps.append((time.perf_counter(), time.thread_time())))
        sampler.start(); time.sleep(0.5)  # past the first, slower readings
        busy_start, first = time.process_time(), len(stamps)
        time.sleep(window)
        busy = time.process_time() - busy_start
        last = len(stamps)
        sampler.stop()
        (t0, c0), (t1, c1) = stamps[first], stamps[last - 1]
        span = t1 - t0
        rows[hz] = {"thread_cpu_per_s": (c1 - c0) / span, "ticks_per_s": (last - 1 - first) / span,
                    "process_extra_per_s": (busy - idle) / window, "errors": sampler.last_error}
    print("@@" + json.dumps(rows))
    """
)


def peers_dir_default() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jax_nbmem/bench-peers"


def with_path(env: dict[str, str], folder: Path) -> dict[str, str]:
    paths = [str(folder), env.get("PYTHONPATH", "")]
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def importable(module: str, env: dict[str, str]) -> str | None:
    """None when ``module`` imports in an IPython shell with ``env``, else why not."""
    code = (
        "from IPython.testing.globalipapp import start_ipython; start_ipython()\n"
        f"import importlib; importlib.import_module({module!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["unknown error"])[-1]
    return f"cannot import {module}: {last[:120]}"


def ensure_peers(folder: Path, env: dict[str, str], install: bool) -> dict[str, str]:
    """Install missing peers into ``folder``; returns {peer: why it is unavailable}."""
    env = with_path(env, folder)
    missing = {name: importable(module, env) for name, module in PEER_MODULES.items()}
    if install and any(missing.values()):
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target"]
        done = subprocess.run(
            [*command, str(folder), *PEER_PACKAGES], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["pip failed"])[-1][:120]
            return {name: f"not installed: {reason}" for name, why in missing.items() if why}
        missing = {name: importable(module, env) for name, module in PEER_MODULES.items()}
    return {name: why for name, why in missing.items() if why}


def run_driver(driver: str, env: dict[str, str], *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", driver, *args], env=env, capture_output=True, text=True, check=False
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("@@")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"benchmark driver failed:\n{done.stderr[-3000:]}")
    return json.loads(line[2:])


def cell_table(result: dict, unavailable: dict[str, str]) -> list[str]:
    figures, failed = result["figures"], {**result["failed"], **unavailable}
    bare = figures["bare IPython"]
    lines = [
        "| extension | trivial cell | ratio | CPU-bound cell | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, series in figures.items():
        if name in failed or not series["cell"]:
            lines.append(f"| {name} | {failed.get(name, 'no figures')} | | | |")
            continue
        cell_ratios = [e / b for e, b in zip(series["cell"], bare["cell"], strict=False)]
        cpu_ratios = [e / b for e, b in zip(series["cpu"], bare["cpu"], strict=False)]
        lines.append(
            f"| {name} | {statistics.median(series['cell']) * 1e6:.0f} µs "
            f"| {statistics.median(cell_ratios):.3f}x "
            f"| {statistics.median(series['cpu']):.3f} s | {statistics.median(cpu_ratios):.3f}x |"
        )
    return lines


def sampler_table(rows: dict) -> list[str]:
    lines = [
        "| rate | ticks/s | sampler thread CPU | process CPU, running - idle | last error |",
        "|---|---:|---:|---:|---|",
    ]
    for hz, row in rows.items():
        lines.append(
            f"| {hz} Hz | {row['ticks_per_s']:.1f} | {row['thread_cpu_per_s'] * 1e3:.2f} ms/s "
            f"({row['thread_cpu_per_s']:.2%} of a core) | "
            f"{row['process_extra_per_s'] * 1e3:.2f} ms/s | {row['errors'] or ''} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window", type=float, default=3.0, help="sampler window, seconds")
    parser.add_argument("--peers-dir", type=Path, default=peers_dir_default())
    parser.add_argument("--no-install", action="store_true", help="do not pip install peers")
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_NBMEM"))}
    base["JAX_PLATFORMS"] = "cpu"
    with tempfile.TemporaryDirectory() as folder:
        try:
            lib = simgpu.build(folder)
        except Exception as exc:  # no C compiler: measure without NVML, and say so
            where = f"no NVML (simulated GPU unavailable: {type(exc).__name__})"
            env = {**base, "LD_LIBRARY_PATH": "/nonexistent"}
        else:
            state = simgpu.SimState(Path(folder) / "gpu.state").gpu(0, total=80 * simgpu.GIB)
            state.process(0, 4242, 2 * simgpu.GIB).write()
            env = simgpu.env_for_subprocess(lib.parent, state.path, base=base)
            where = "simulated GPU (stand-in libnvidia-ml.so.1)"
        unavailable = ensure_peers(args.peers_dir, env, install=not args.no_install)
        env = with_path(env, args.peers_dir)
        cells = run_driver(CELLS_DRIVER, env, str(args.cells), str(args.rounds))
        sampler = run_driver(SAMPLER_DRIVER, env, str(args.window))
    print(f"## Per-cell overhead ({args.cells} cells x {args.rounds} rounds, medians; {where})")
    print()
    print("\n".join(cell_table(cells, unavailable)))
    print()
    print(f"## Sampler CPU cost ({args.window:g} s windows, JAX CPU backend up; {where})")
    print()
    print("\n".join(sampler_table(sampler)))


if __name__ == "__main__":
    main()
