"""What "will it fit?" and `%jaxmem top` cost with many live arrays, against what JAX costs anyway.

With N live JAX arrays (default 20,000, on the CPU backend), a namespace that names them (half
as plain names, half in lists of 100) and the last error's frames holding 1,000 more (in a list):

* ``fit``: ``check_fit`` of a jitted step over a pytree of ``--leaves`` arrays, end to end,
  less its own compile time (``compile_s``), against that compile time: the part of ``fit``
  that is ours (resident arguments, the room, the verdict). Also the verdict's search for
  names worth freeing (run when a call does not fit) over the whole namespace.
* ``top``: ``top_arrays`` (names, output history and the error's frames), against
  ``jax.live_arrays()`` with each array's ``nbytes`` read: the walk any answer needs.
* ``after a failed cell``: what the session reads then, on the cell's path (``hold_of``: the
  error's frames' locals and the namespace's names, never the live arrays).

Rounds alternate the two sides; medians are reported.

    python benchmarks/fit_and_top.py [--arrays 20000] [--leaves 200] [--rounds 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def make_world(count: int):
    import jax.numpy as jnp

    namespace: dict = {}
    arrays = [jnp.full((16,), float(i)) for i in range(count)]
    half = count // 2
    for i in range(half):
        namespace[f"a{i}"] = arrays[i]
    for start in range(half, count, 100):
        namespace[f"batch{start}"] = arrays[start : start + 100]

    return namespace, arrays, _failed_holding(1000)


def _failed_holding(count: int) -> BaseException:
    """An error whose frames hold *count* small arrays (in a list, as a step's batch would)."""
    import jax.numpy as jnp

    def step(batch):
        raise ValueError("the step failed")

    batch = [jnp.ones(8) for _ in range(count)]
    try:
        step(batch)
    except ValueError as exc:
        return exc
    raise AssertionError("unreachable")


def timed(action) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arrays", type=int, default=20_000)
    parser.add_argument("--leaves", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from jax_nbmem.tools.arrays import top_arrays
    from jax_nbmem.tools.fit_report import _argument_ids, _freeable, check_fit
    from jax_nbmem.tools.last_error import error_frames, hold_of

    namespace, arrays, error = make_world(args.arrays)
    params = {f"w{i}": jnp.ones((32, 32)) for i in range(args.leaves)}
    batch = jnp.ones((64, 32))

    @jax.jit
    def step(params, batch):
        out = batch
        for w in params.values():
            out = jnp.tanh(out @ w)
        return out.sum()

    frames = error_frames([error])
    rows = {
        "fit (ours)": [],
        "compile (JAX)": [],
        "freeable search": [],
        "top": [],
        "live walk": [],
        "after a failed cell": [],
    }
    for _ in range(args.rounds):
        jax.clear_caches()  # each fit compiles afresh, as a new call would
        began = time.perf_counter()
        report = check_fit(step, (params, batch), call="step(params, batch)")
        total = time.perf_counter() - began
        rows["fit (ours)"].append(total - report.needs.compile_s)
        rows["compile (JAX)"].append(report.needs.compile_s)
        used = _argument_ids((params, batch))
        rows["freeable search"].append(timed(lambda: _freeable(namespace, used)))  # noqa: B023
        rows["top"].append(timed(lambda: top_arrays(namespace, 10, frames=frames)))
        rows["live walk"].append(
            timed(lambda: sum(int(a.nbytes) for a in jax.live_arrays()))  # noqa: B023
        )
        # What the session reads on a failed cell's path: the error's frames and the names.
        rows["after a failed cell"].append(timed(lambda: hold_of(error, namespace)))
    medians = {name: statistics.median(values) for name, values in rows.items()}
    result = {
        "live_arrays": len(jax.live_arrays()),
        "argument_leaves": args.leaves + 1,
        "rounds": args.rounds,
        "median_s": medians,
        "fit_overhead_over_compile": medians["fit (ours)"] / medians["compile (JAX)"],
        "top_over_live_walk": medians["top"] / medians["live walk"],
        "python": sys.version.split()[0],
        "jax": jax.__version__,
    }
    print(f"{result['live_arrays']} live arrays; {result['argument_leaves']} argument leaves")
    print(f"{'':<18}{'median':>10}")
    for name, value in medians.items():
        print(f"{name:<18}{value * 1000:>8.1f} ms")
    print(f"fit's own cost / JAX's compile: {result['fit_overhead_over_compile']:.3f}")
    print(f"top / walking the live arrays:  {result['top_over_live_walk']:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as stream:
            json.dump(result, stream, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
