"""What each ``%%jaxalloc compare`` subprocess runs: one cell, in one allocator mode, measured.

Run as ``python -m jax_nbmem.tools.compare.child CODE_FILE RESULT_FILE``; the parent has
already put the mode's variables into this process's environment, so JAX reads them when the
cell starts its backend. This script imports jax (if installed) before the cell so that the
cell's wall time leaves out the import, but never starts the backend itself: the cell may
configure JAX first. It writes one JSON object to RESULT_FILE (stdout belongs to the cell) and
exits: the figures of ``compare.ModeResult`` that a process can measure of itself (see
:func:`measure`).

A SIGTERM from the parent (timeout, Ctrl-C) stops the cell and still writes what was measured
so far, with ``"stopped": true``.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import linecache
import os
import resource
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Iterable
from typing import Any

from jax_nbmem.gpu import jaxstats, nvml, own_process

__all__ = ["CELL_FILENAME", "main"]

CELL_FILENAME = "<cell>"
_SAMPLE_INTERVAL_S = 0.05
_TRACEBACK_LINES = 20


class _Stopped(BaseException):
    """Raised inside the cell by SIGTERM; a BaseException so ``except Exception`` lets it by."""


_in_cell = False
_stop_requested = False


def _on_sigterm(signum: int, frame: Any) -> None:
    global _stop_requested
    _stop_requested = True
    # Raise only while the cell runs: a stop during our own bookkeeping must not lose the
    # result. A stop before the cell starts keeps it from starting.
    if _in_cell:
        raise _Stopped


class _NvmlPeak:
    """Samples NVML's memory figure for one pid in a daemon thread; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak: int | None = None
        self.gpus: set[int] = set()
        self.unknown_seen = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jax_nbmem-compare", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and take one last sample (the cell's end state)."""
        self._stop.set()
        self._thread.join()
        self.sample()

    def sample(self) -> None:
        try:
            mine = [p for p in nvml.processes() if p.pid == self.pid]
        except Exception:  # a sampler never raises; a missed sample only lowers the peak seen
            return
        if not mine:
            return
        known = [p.used_bytes for p in mine if p.used_bytes is not None]
        self.unknown_seen = self.unknown_seen or len(known) < len(mine)
        self.gpus.update(p.gpu for p in mine)
        if known:
            self.peak = max(self.peak or 0, sum(known))

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample()
            next_at += _SAMPLE_INTERVAL_S
            self._stop.wait(max(0.0, next_at - time.monotonic()))


def _host_peak_rss() -> int | None:
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (OSError, ValueError):
        return None
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # Linux counts KiB


def _import_jax() -> str | None:
    """Import jax ahead of the cell (its import is not the mode's cost); say what went wrong."""
    try:
        import jax  # noqa: F401
    except ImportError:
        return "jax is not installed in the subprocess's Python"
    except Exception as exc:  # a broken install: the cell will meet the same error and say more
        return f"importing jax failed: {type(exc).__name__}: {exc}"
    return None


def _short_traceback(exc: BaseException) -> str:
    # Drop our own frame (the exec call) so the traceback starts in the cell.
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    lines = "".join(traceback.format_exception(type(exc), exc, tb)).splitlines()
    if len(lines) > _TRACEBACK_LINES:
        lines = ["...", *lines[-_TRACEBACK_LINES:]]
    return "\n".join(lines)


def _run_cell(source: str) -> dict[str, Any]:
    """Compile and run the cell as ``__main__`` in a fresh namespace; say how it ended."""
    global _in_cell
    linecache.cache[CELL_FILENAME] = (len(source), None, source.splitlines(True), CELL_FILENAME)
    outcome: dict[str, Any] = {"stopped": False, "exception": None}
    # A module of its own as __main__, so what the cell defines can be pickled by reference
    # (multiprocessing, cloudpickle) as it can in a kernel.
    main_module = types.ModuleType("__main__")
    main_module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main_module
    start = time.perf_counter()
    try:
        code = compile(source, CELL_FILENAME, "exec", dont_inherit=True)
        _in_cell = True
        if _stop_requested:
            raise _Stopped
        exec(code, main_module.__dict__)
    except _Stopped:
        outcome["stopped"] = True
    except SystemExit as exc:
        if exc.code not in (None, 0):
            outcome["exception"] = exc
    except BaseException as exc:
        outcome["exception"] = exc
    finally:
        _in_cell = False
        outcome["wall_s"] = time.perf_counter() - start
    return outcome


def _describe_exception(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"oom": False}
    undefined = getattr(exc, "name", None) if isinstance(exc, NameError) else None
    hint = None
    if isinstance(undefined, str):
        hint = (
            f"the cell must be self-contained: {undefined} is not defined in the subprocess "
            "(define or import it inside the cell)"
        )
    return {
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": _short_traceback(exc),
        "oom": jaxstats.is_resource_exhausted(exc),
        "hint": hint,
    }


def _sum(values: Iterable[int | None]) -> int | None:
    known = list(values)
    return sum(known) if known and None not in known else None  # type: ignore[arg-type]


def _free(stats: jaxstats.DeviceStats) -> int | None:
    # Free space *inside the pool*, which is where the largest free block lies: the limit
    # minus what is in use would count room the pool never took (with `off`, most of it) as
    # fragmented.
    return stats.pool_free_bytes


def _jax_figures(gpu_devices: list[jaxstats.DeviceStats]) -> dict[str, Any]:
    """Sums over the GPUs; the free-block figures of the GPU where free memory is most split."""

    def largest_block_share(stats: jaxstats.DeviceStats) -> float:
        free, block = _free(stats), stats.largest_free_block_bytes
        return block / free if free and block is not None else 1.0

    known = [d for d in gpu_devices if _free(d) is not None and d.largest_free_block_bytes]
    worst = min(known, key=largest_block_share) if known else None
    return {
        "jax_peak_bytes": _sum(d.peak_bytes_in_use for d in gpu_devices),
        "jax_in_use_bytes": _sum(d.bytes_in_use for d in gpu_devices),
        "jax_limit_bytes": _sum(d.bytes_limit for d in gpu_devices),
        "jax_pool_bytes": _sum(d.held_bytes for d in gpu_devices),
        "jax_free_bytes": _free(worst) if worst else None,
        "largest_free_block_bytes": worst.largest_free_block_bytes if worst else None,
    }


def _unmeasured(
    jax_problem: str | None,
    devices: list[jaxstats.DeviceStats],
    figures: dict[str, Any],
    nvml_state: nvml.NvmlStatus,
    sampler: _NvmlPeak | None,
) -> list[str]:
    """Say, per missing figure, why it is missing."""
    notes = []
    if jax_problem:
        notes.append(f"no JAX figures: {jax_problem}")
    elif not devices:
        notes.append("no JAX figures: the cell did not start JAX's backend")
    elif not figures["on_gpu"]:
        platforms = ", ".join(sorted({str(d.platform) for d in devices}))
        notes.append(
            f"no JAX allocator figures: JAX ran on {platforms}, not a GPU, and keeps no "
            "allocator statistics there"
        )
    elif figures["jax_peak_bytes"] is None:
        notes.append("no JAX peak: this allocator does not report peak_bytes_in_use")
    if sampler is None:
        why = nvml_state.reason if not nvml_state.available else own_process.unknown_reason()
        notes.append(f"no GPU memory per process (NVML): {why}")
    elif sampler.peak is None and sampler.unknown_seen:
        notes.append("NVML listed the subprocess but could not say how much memory it held")
    elif sampler.peak is None:
        notes.append(
            "NVML never listed the subprocess: it used no GPU, or runs in a container whose "
            "process ids differ from the host's"
        )
    return notes


def _gpu_totals(indices: set[int]) -> int | None:
    return _sum(gpu.total_bytes for gpu in nvml.memory(sorted(indices))) if indices else None


def measure(source: str) -> dict[str, Any]:
    """Run ``source``; return the figures of ``compare.ModeResult`` plus ``stopped``, ``oom``.

    A figure that could not be measured is None, and one of ``notes`` says why.
    """
    nvml_state = nvml.status()
    # NVML lists this child by its host PID: in a container, one only the node agent can prove
    # (the child is never proven), so there its GPU peak is unknown, and said.
    own_pid = own_process.nvml_pid()
    sampler = _NvmlPeak(own_pid) if nvml_state.available and own_pid is not None else None
    if sampler is not None:
        sampler.start()
    jax_problem = _import_jax()
    outcome = _run_cell(source)
    if sampler is not None:
        sampler.stop()
    devices = jaxstats.device_stats()
    gpu_devices = [d for d in devices if d.platform in jaxstats.GPU_PLATFORMS]
    result: dict[str, Any] = {
        "wall_s": outcome["wall_s"],
        "stopped": outcome["stopped"],
        "on_gpu": bool(gpu_devices),
        **_jax_figures(gpu_devices),
        "gpu_peak_bytes": sampler.peak if sampler else None,
        "gpu_total_bytes": _gpu_totals(sampler.gpus) if sampler else None,
        "host_peak_rss_bytes": _host_peak_rss(),
        "devices": [dataclasses.asdict(stats) for stats in devices],
    }
    result["notes"] = _unmeasured(jax_problem, devices, result, nvml_state, sampler)
    result.update(_describe_exception(outcome["exception"]))
    return result


def _write_atomically(path: str, payload: dict[str, Any]) -> None:
    # A parent that kills us mid-write must find no result rather than half of one.
    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as out:
        json.dump(payload, out, default=str)
    os.replace(partial, path)


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` is ``[script, CODE_FILE, RESULT_FILE]``."""
    if len(argv) != 3:
        print(
            "usage: python -m jax_nbmem.tools.compare.child CODE_FILE RESULT_FILE",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    code_path, result_path = argv[1], argv[2]
    with open(code_path, encoding="utf-8") as source_file:
        source = source_file.read()
    for stream in (sys.stdout, sys.stderr):
        # Line by line, so a child killed after a timeout still leaves its last words.
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except Exception:
            pass
    sys.argv = [CELL_FILENAME]
    _write_atomically(result_path, measure(source))
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    # Skip interpreter shutdown: threads the cell left running would keep us alive, and
    # tearing down JAX's runtime only costs time. The result is already on disk.
    os._exit(code)
