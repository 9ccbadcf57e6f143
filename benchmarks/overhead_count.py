"""jax_nbmem's per-cell cost counted in CPU instructions, a figure that load does not move.

    python benchmarks/overhead_count.py [--cells 300] [--rounds 2] [--only NAME ...]
                                        [--cache] [--keep DIR] [--json PATH]

The wall-clock ratios of ``overhead.py`` move by 10-20% with what else runs on the machine.
Here the same long-lived shell runs under Valgrind's callgrind, which counts the instructions
each thread executes; the same trivial cells ``x = 1`` are counted with the extension asleep
and awake, in alternating rounds, and the ratio is taken for IPython's main thread, the one a
cell runs on (repeated runs agree on it to about 1.5%: the sampler's thread, on its wall-clock
schedule, changes a little of what the hooks do from run to run). The other threads (the
sampler, the status watch, the beacon) are not counted: under Valgrind they run on a
wall-clock schedule while everything is some 50x slower, so their count would say nothing of
a native run; ``overhead.py`` measures the sampler's share of a core.

What instructions cannot show: the time a cell waits to take the GIL back from a thread that
it woke, the cost of that wake in the kernel (futex calls), and the caches; ``overhead.py``'s
wall-clock and CPU-time rows are for those. ``--cache`` has callgrind simulate the caches too
(its model of a first level and a last level, not this machine's, and some 2x slower): per
cell, the main thread's first-level and last-level misses, for instructions and data.
Last, the extension's two callbacks are called by themselves in a loop (garbage collection
off): the instructions of one pre/post pair, which neither IPython nor the collector (whose
share of a round moves by up to 10k a cell) nor the sampler's schedule blurs.

Needs ``valgrind`` (Debian: ``apt-get install valgrind``, which brings ``callgrind.h``) and a
C compiler for the two-function library that marks the rounds. With ``--keep DIR`` the
callgrind files stay there: ``callgrind_annotate DIR/row<N>/cg.<pid>.<part>-01`` shows where a
round's instructions went, by C function (part 1 is the warm-up, part 3 the first awake
round, part 2 the asleep one before it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import TOGGLE, Shell, arrays  # noqa: E402

from jax_nbmem import simgpu  # noqa: E402

# Zeroes the counters and writes them out, labelled, from inside the measured process.
MARKS_C = """
#include <valgrind/callgrind.h>
void marks_zero(void) { CALLGRIND_ZERO_STATS; }
void marks_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""


def build_marks(folder: Path) -> Path:
    """Compile the marking library; SystemExit with the reason when it cannot be."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise SystemExit("no C compiler (cc) to build the marking library")
    source, library = folder / "marks.c", folder / "libmarks.so"
    source.write_text(MARKS_C)
    built = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        raise SystemExit(f"cannot build the marking library:\n{built.stderr}")
    return library


def read_dumps(folder: Path) -> dict[str, dict[int, dict[str, int]]]:
    """Per round label, per thread (1 = the main thread), the events counted (``Ir``...).

    A client request dumps the counts of the thread that made it only: the main thread's.
    """
    rounds: dict[str, dict[int, dict[str, int]]] = {}
    for path in folder.glob("cg.*"):
        label = thread = totals = None
        events = ["Ir"]
        with path.open() as lines:
            for line in lines:
                if line.startswith("desc: Trigger: Client Request: "):
                    label = line.split(": ", 3)[3].strip()
                elif line.startswith("thread: "):
                    thread = int(line.split()[1])
                elif line.startswith("events: "):
                    events = line.split()[1:]
                elif line.startswith("summary: "):
                    totals = dict(zip(events, map(int, line.split()[1:]), strict=False))
                    break
        if label is not None and thread is not None and totals is not None:
            rounds.setdefault(label, {})[thread] = totals
    return rounds


# With --cache: callgrind's cache events, summed into four figures per cell.
MISSES = {
    "I1 misses": ("I1mr",),
    "D1 misses": ("D1mr", "D1mw"),
    "LL misses, instructions": ("ILmr",),
    "LL misses, data": ("DLmr", "DLmw"),
}


def count(env: dict, setup: str, cells: int, rounds: int, marks: Path, out: Path,
          cache: bool = False) -> dict:  # fmt: skip
    """Asleep against awake in one shell under callgrind; instructions (and misses) per cell."""
    out.mkdir(parents=True, exist_ok=True)
    valgrind = ("valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-instr=no",
                f"--callgrind-out-file={out}/cg.%p", "--log-file=/dev/null",
                *(("--cache-sim=yes",) if cache else ()))  # fmt: skip
    shell = Shell({**env, "PYTHONHASHSEED": "0"}, prefix=valgrind)
    labels = []
    try:
        shell.run(setup)
        shell.run("%load_ext jax_nbmem")
        shell.run(TOGGLE)
        shell.ask(count=max(5, cells // 5), marks=str(marks), label="warm")
        for round_ in range(rounds):
            for on in (False, True) if round_ % 2 == 0 else (True, False):
                shell.run(f"_jax_nbmem_awake({on})")
                if on:
                    time.sleep(1.0)  # the sampler's first readings are behind it
                label = f"{round_}-{'awake' if on else 'asleep'}"
                shell.ask(count=cells, marks=str(marks), label=label)
                labels.append(label)
        shell.run("_jax_nbmem_awake(True)")
        time.sleep(1.0)
        shell.ask(hooks=cells, marks=str(marks), label="hooks")
    finally:
        shell.close()
    counted = read_dumps(out)
    main: dict[bool, list[float]] = {False: [], True: []}
    misses: dict[str, dict[bool, list[float]]] = {name: {False: [], True: []} for name in MISSES}
    for label in labels:
        threads = counted.get(label, {})
        if 1 not in threads:
            raise RuntimeError(f"callgrind wrote no count for round {label} in {out}")
        awake = label.endswith("awake")
        main[awake].append(threads[1]["Ir"] / cells)
        for name, events in MISSES.items():
            if all(event in threads[1] for event in events):
                misses[name][awake].append(sum(threads[1][e] for e in events) / cells)
    figures = {
        "bare_ir": statistics.median(main[False]),
        "loaded_ir": statistics.median(main[True]),
        "ratio": statistics.median(a / b for a, b in zip(main[True], main[False], strict=True)),
        "spread": max(main[True]) / min(main[True]) - 1,
    }
    if 1 in counted.get("hooks", {}):  # the callbacks called in a loop: no IPython, no gc
        figures["hooks_ir"] = counted["hooks"][1]["Ir"] / cells
    for name, sides in misses.items():
        if sides[True] and sides[False]:
            figures[name] = (statistics.median(sides[False]), statistics.median(sides[True]))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=300, help="cells per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per side")
    parser.add_argument("--only", nargs="*", help="run only the rows whose name has this text")
    parser.add_argument("--cache", action="store_true", help="also count cache misses per cell")
    parser.add_argument("--keep", help="leave callgrind's files in this folder")
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_NBMEM"))}
    base["JAX_PLATFORMS"] = "cpu"
    no_nvml = {**base, "LD_LIBRARY_PATH": "/nonexistent"}
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="jax_nbmem_ir_"))
    folder.mkdir(parents=True, exist_ok=True)
    marks = build_marks(folder)
    lib = simgpu.build(folder)
    state = simgpu.SimState(folder / "one.state").gpu(0, total=80 * simgpu.GIB)
    state.process(0, 4242, 2 * simgpu.GIB).write()
    sim_env = simgpu.env_for_subprocess(lib.parent, state.path, base=base)
    table = {  # overhead.py's rows of the same names, and one without JAX
        "in-process, JAX not imported": (no_nvml, ""),
        "in-process, 0 live arrays": (no_nvml, arrays(0)),
        "in-process, 1,000 live arrays": (no_nvml, arrays(1_000)),
        "in-process, simulated GPU": (sim_env, ""),
    }
    rows = {}
    for number, (name, (env, setup)) in enumerate(table.items()):
        if args.only and not any(part in name for part in args.only):
            continue
        print(f"... {name}", file=sys.stderr, flush=True)
        rows[name] = count(
            env, setup, args.cells, args.rounds, marks, folder / f"row{number}", args.cache
        )
    print(f"jax_nbmem per-cell instructions ({args.cells} cells x {args.rounds} alternating "
          f"rounds a side, under callgrind; main thread, medians)")  # fmt: skip
    for name, f in rows.items():
        bare, loaded = f["bare_ir"] / 1e3, f["loaded_ir"] / 1e3
        print(f"{name:<48} {bare:7.0f}k -> {loaded:7.0f}k instr  {f['ratio']:6.3f}x  "
              f"(awake rounds within {f['spread']:.1%})")  # fmt: skip
        if "hooks_ir" in f:
            print(f"{'':<4}{'the two callbacks alone, in a loop, gc off':<44} "
                  f"{f['hooks_ir'] / 1e3:8.1f}k instr a pair")  # fmt: skip
        for what in MISSES:
            if what in f:
                bare, loaded = f[what]
                print(f"{'':<4}{what:<44} {bare:8.0f} -> {loaded:8.0f} per cell  "
                      f"(+{loaded - bare:.0f})")  # fmt: skip
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
