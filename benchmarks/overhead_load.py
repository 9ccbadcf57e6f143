"""What ``%load_ext jax_nbmem`` costs, JAX not imported, in fresh IPython shells.

    python benchmarks/overhead_load.py [--shells 15] [--json PATH]

Each shell is a new process (modules imported once per process, as a user's kernel does),
with bytecode caching on (as an installed package has it: a checkout run with
PYTHONDONTWRITEBYTECODE compiles every module at each import and measures the compiler). In
each, IPython's own ``%load_ext autoreload`` is loaded first, as the baseline of the same run,
then ``%load_ext jax_nbmem``; both are timed on the wall clock and in the main thread's CPU time
(``time.thread_time``: what the machine's load moves least). Reports the medians over shells,
the modules the load imported, and whether numpy, the Jupyter-servers module or JAX came with
it (the goal: <= 0.1 s, none of them).
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

SHELL = textwrap.dedent(
    """
    import json, sys, time
    from IPython.testing.globalipapp import start_ipython
    shell = start_ipython()
    def timed(name):
        had = set(sys.modules)
        wall, cpu = time.perf_counter(), time.thread_time()
        shell.run_line_magic("load_ext", name)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        return wall, cpu, set(sys.modules) - had
    base_wall, base_cpu, _ = timed("autoreload")
    wall, cpu, new = timed("jax_nbmem")
    print(json.dumps({
        "base_wall": base_wall, "base_cpu": base_cpu, "wall": wall, "cpu": cpu,
        "modules": len(new), "numpy": "numpy" in new, "jax": "jax" in sys.modules,
        "servers": "jax_nbmem.node.servers" in new,
    }))
    """
)


def one_shell(env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SHELL], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shells", type=int, default=15)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    root = str(Path(__file__).resolve().parents[1])
    cache = tempfile.mkdtemp(prefix="jax_nbmem_pyc_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_NBMEM"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        PYTHONPYCACHEPREFIX=cache,
        JAX_PLATFORMS="cpu",
        IPYTHONDIR=str(Path(cache) / "ipython"),
        PYTHONPATH=os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")])),
    )
    one_shell(env)  # writes the bytecode caches
    runs = [one_shell(env) for _ in range(args.shells)]

    def median(key: str) -> float:
        return statistics.median(run[key] for run in runs)

    figures = {
        "shells": len(runs),
        "wall_s": median("wall"),
        "cpu_s": median("cpu"),
        "autoreload_wall_s": median("base_wall"),
        "autoreload_cpu_s": median("base_cpu"),
        "modules": median("modules"),
        "numpy_imported": any(run["numpy"] for run in runs),
        "servers_imported": any(run["servers"] for run in runs),
        "jax_imported": any(run["jax"] for run in runs),
    }
    print(
        f"%load_ext jax_nbmem over {len(runs)} fresh shells (medians): "
        f"wall {figures['wall_s'] * 1e3:.0f} ms, main thread CPU {figures['cpu_s'] * 1e3:.0f} ms; "
        f"%load_ext autoreload in the same shells: wall {figures['autoreload_wall_s'] * 1e3:.1f} "
        f"ms, CPU {figures['autoreload_cpu_s'] * 1e3:.1f} ms; {figures['modules']:.0f} modules "
        f"imported; numpy {figures['numpy_imported']}, the servers module "
        f"{figures['servers_imported']}, jax {figures['jax_imported']}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
