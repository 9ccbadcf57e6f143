"""What a trivial cell's hooks touch: distinct Python functions and C functions per cell, traced.

    python benchmarks/overhead_objects.py [--cells 200] [--only NAME ...] [--list] [--json PATH]

``overhead.py`` times the hooks and ``overhead_count.py`` counts their instructions and cache
misses; this counts what the cache-miss account of their cost is about. In the same
long-lived shell as the other two, the trivial cell ``x = 1`` runs under ``sys.setprofile``
on IPython's main thread, asleep and then awake (the other threads are not traced), and for
each cell it counts the distinct code objects entered (Python functions, each a frame), the
distinct C functions called (``dict.get`` once however many dicts it reads) and all calls;
medians per cell. Every function called is traced, so the figures do not move with load; the
tracing makes the cells slower, so this script gives no time at all. ``--list`` prints the
functions only the awake cells call: jax_nbmem's per-cell path, by name.

The shell imports jax_nbmem from the current folder, so the code before a change is
measured by running this script from a worktree of it:
``cd OLD && python NEW/benchmarks/overhead_objects.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import NO_MIRROR, TOGGLE, Shell, arrays  # noqa: E402

from jax_nbmem import simgpu  # noqa: E402


def trace(env: dict, setup: str, cells: int) -> dict:
    """Asleep, then awake, in one shell: each side's distinct functions and calls per cell."""
    shell = Shell(env)
    try:
        shell.run(NO_MIRROR)
        shell.run(setup)
        shell.run("%load_ext jax_nbmem")
        shell.run(TOGGLE)
        sides = {}
        for on in (False, True):
            shell.run(f"_jax_nbmem_awake({on})")
            shell.ask(objects=max(5, cells // 10))  # warm the path
            sides[on] = shell.ask(objects=cells)
    finally:
        shell.close()
    asleep, awake = sides[False], sides[True]
    return {
        "package": awake["package"],
        **{
            f"{kind}_{side}": sides[on][kind]
            for kind in ("python", "c", "calls")
            for side, on in (("asleep", False), ("awake", True))
        },
        "awake_only": sorted(set(awake["names"]) - set(asleep["names"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=200, help="cells per side")
    parser.add_argument("--only", nargs="*", help="run only the rows whose name has this text")
    parser.add_argument("--list", action="store_true", help="name what only awake cells call")
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_NBMEM"))}
    base["JAX_PLATFORMS"] = "cpu"
    folder = Path(tempfile.mkdtemp(prefix="jax_nbmem_objects_"))
    base["IPYTHONDIR"] = str(folder / "ipython")  # an empty profile: no startup files
    no_nvml = {**base, "LD_LIBRARY_PATH": "/nonexistent"}
    lib = simgpu.build(folder)
    state = simgpu.SimState(folder / "one.state").gpu(0, total=80 * simgpu.GIB)
    state.process(0, 4242, 2 * simgpu.GIB).write()
    sim_env = simgpu.env_for_subprocess(lib.parent, state.path, base=base)
    table = {  # overhead_count.py's rows
        "in-process, JAX not imported": (no_nvml, ""),
        "in-process, 0 live arrays": (no_nvml, arrays(0)),
        "in-process, 1,000 live arrays": (no_nvml, arrays(1_000)),
        "in-process, simulated GPU": (sim_env, ""),
    }
    rows = {}
    for name, (env, setup) in table.items():
        if args.only and not any(part in name for part in args.only):
            continue
        print(f"... {name}", file=sys.stderr, flush=True)
        rows[name] = trace(env, setup, args.cells)
    package = next(iter(rows.values()))["package"] if rows else "?"
    print(f"jax_nbmem per-cell functions ({args.cells} cells a side, main thread, medians; "
          f"{package})")  # fmt: skip
    print(f"{'row':<34} {'Python functions':>18} {'C functions':>14} {'calls':>14}")
    for name, f in rows.items():
        cells = [
            f"{f[f'{kind}_asleep']} -> {f[f'{kind}_awake']}" for kind in ("python", "c", "calls")
        ]
        print(f"{name:<34} {cells[0]:>18} {cells[1]:>14} {cells[2]:>14}")
        if args.list:
            for what in f["awake_only"]:
                print(f"    {what}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
