"""Overhead of jax_nbmem on the cells a user runs, as ratios against bare IPython in the same run.

    python benchmarks/overhead.py [--cells 2000] [--rounds 5]

Two figures, each measured in rounds of alternating order (bare then loaded, loaded then bare,
...) inside one IPython process so that drift in the machine's speed hits both sides alike;
medians are reported:

- trivial cell: wall time per `x = 1` cell, extension loaded and sampling vs. not loaded
  (goal: <= 1.05x);
- the same trivial cell through a real ipykernel (what a notebook user waits for);
- CPU-bound cell: a pure-Python loop of about half a second, with the sampler thread running
  vs. not loaded (goal: <= 1.01x).

Each is run twice: without NVML (as on this CI machine) and against the simulated GPU (the C
stand-in for libnvidia-ml.so.1, so the sampler's NVML calls are real calls through pynvml).
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

DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from IPython.testing.globalipapp import start_ipython
    cells, rounds = int(sys.argv[1]), int(sys.argv[2])
    shell = start_ipython()
    BURN = "def burn(n=15_000_000):\\n    t = 0\\n    for i in range(n):\\n        t += i * i\\n"
    shell.run_cell(BURN, store_history=True)
    def per_cell():
        start = time.perf_counter()
        for _ in range(cells):
            shell.run_cell("x = 1", store_history=True)
        return (time.perf_counter() - start) / cells
    def cpu_bound():
        start = time.perf_counter()
        shell.run_cell("burn()", store_history=True)
        return time.perf_counter() - start
    per_cell(); cpu_bound()  # warm up both paths
    shell.run_line_magic("load_ext", "jax_nbmem"); per_cell(); cpu_bound()
    shell.run_line_magic("unload_ext", "jax_nbmem")
    bare_cell, ext_cell, bare_cpu, ext_cpu = [], [], [], []
    def bare():
        bare_cell.append(per_cell()); bare_cpu.append(cpu_bound())
    def loaded():
        shell.run_line_magic("load_ext", "jax_nbmem")
        time.sleep(0.3)  # let the sampler reach its steady rate
        ext_cell.append(per_cell()); ext_cpu.append(cpu_bound())
        shell.run_line_magic("unload_ext", "jax_nbmem")
    for round_ in range(rounds):
        # ABBA order: a drift in the machine's speed favours neither side.
        for step in ((bare, loaded) if round_ % 2 == 0 else (loaded, bare)):
            step()
    print("@@" + json.dumps([bare_cell, ext_cell, bare_cpu, ext_cpu]))
    """
)


KERNEL_DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from jupyter_client.manager import start_new_kernel
    cells, rounds = int(sys.argv[1]), int(sys.argv[2])
    km, kc = start_new_kernel(kernel_name="python3")
    def run(code):
        kc.execute_interactive(code, timeout=60, output_hook=lambda msg: None)
    def per_cell():
        start = time.perf_counter()
        for _ in range(cells):
            run("x = 1")
        return (time.perf_counter() - start) / cells
    try:
        per_cell()
        bare, ext = [], []
        for _ in range(rounds):
            bare.append(per_cell())
            run("%load_ext jax_nbmem")
            time.sleep(0.3)
            ext.append(per_cell())
            run("%unload_ext jax_nbmem")
        print("@@" + json.dumps([bare, ext]))
    finally:
        kc.stop_channels(); km.shutdown_kernel(now=True)
    """
)


def _run_driver(driver: str, env: dict[str, str], cells: int, rounds: int) -> list:
    """Run a driver script in a fresh process; returns the lists of timings it printed."""
    done = subprocess.run(
        [sys.executable, "-c", driver, str(cells), str(rounds)],
        env=env,
        capture_output=True,
        text=True,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("@@")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"benchmark driver failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(line[2:])


def measure_kernel(env: dict[str, str], cells: int, rounds: int) -> dict[str, float]:
    """Round trip of a trivial cell through a real ipykernel, as a notebook frontend sees it."""
    bare, ext = _run_driver(KERNEL_DRIVER, env, cells, rounds)
    return {
        "bare_us": statistics.median(bare) * 1e6,
        "ext_us": statistics.median(ext) * 1e6,
        "ratio": statistics.median(e / b for e, b in zip(ext, bare, strict=True)),
    }


def measure(env: dict[str, str], cells: int, rounds: int) -> dict[str, float]:
    """Trivial and CPU-bound cells in one in-process IPython shell; medians and ratios."""
    bare_cell, ext_cell, bare_cpu, ext_cpu = _run_driver(DRIVER, env, cells, rounds)
    cell_ratio = statistics.median(e / b for e, b in zip(ext_cell, bare_cell, strict=True))
    cpu_ratio = statistics.median(e / b for e, b in zip(ext_cpu, bare_cpu, strict=True))
    return {
        "bare_cell_us": statistics.median(bare_cell) * 1e6,
        "ext_cell_us": statistics.median(ext_cell) * 1e6,
        "cell_ratio": cell_ratio,
        "bare_cpu_s": statistics.median(bare_cpu),
        "ext_cpu_s": statistics.median(ext_cpu),
        "cpu_ratio": cpu_ratio,
    }


def main() -> None:
    """Measure both configurations and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_NBMEM"))}
    base["JAX_PLATFORMS"] = "cpu"
    configs = {"no NVML": {**base, "LD_LIBRARY_PATH": "/nonexistent"}}
    with tempfile.TemporaryDirectory() as folder:
        lib = simgpu.build(folder)
        state = simgpu.SimState(Path(folder) / "gpu.state").gpu(0, total=80 * simgpu.GIB)
        state.process(0, 4242, 2 * simgpu.GIB).write()
        configs["simulated GPU"] = simgpu.env_for_subprocess(lib.parent, state.path, base=base)
        rows = {name: measure(env, args.cells, args.rounds) for name, env in configs.items()}
        kernel_rows = {
            name: measure_kernel(env, max(50, args.cells // 4), args.rounds)
            for name, env in configs.items()
        }
    print(f"jax_nbmem overhead ({args.cells} cells x {args.rounds} alternating rounds, medians)")
    print(
        f"{'configuration':<15} {'bare cell':>10} {'loaded':>10} {'ratio':>7}   "
        f"{'bare CPU':>9} {'loaded':>9} {'ratio':>7}"
    )
    for name, r in rows.items():
        print(
            f"{name:<15} {r['bare_cell_us']:>8.0f}us {r['ext_cell_us']:>8.0f}us "
            f"{r['cell_ratio']:>6.3f}x   {r['bare_cpu_s']:>8.3f}s {r['ext_cpu_s']:>8.3f}s "
            f"{r['cpu_ratio']:>6.3f}x"
        )
    print()
    print("Trivial cell through a real ipykernel (execute request to idle, as a notebook sees it)")
    print(f"{'configuration':<15} {'bare':>10} {'loaded':>10} {'ratio':>7}")
    for name, r in kernel_rows.items():
        print(f"{name:<15} {r['bare_us']:>8.0f}us {r['ext_us']:>8.0f}us {r['ratio']:>6.3f}x")
    print("goals: trivial cell <= 1.05x, CPU-bound cell <= 1.01x")


if __name__ == "__main__":
    main()
