"""``%%jaxalloc compare``: run one cell in a fresh subprocess per allocator mode, and compare.

JAX reads its allocator settings once per process, so the only fair way to compare modes is a
new process for each: :func:`run_compare` starts ``python -m jax_nbmem.tools.compare.child``
once per mode, one after the other, on the same GPUs, with the mode's variables in its
environment. The cell must be self-contained: nothing defined in the notebook exists in the
subprocess.

Each subprocess runs in a process group of its own. When it ends — normally, on a timeout, or
because the user pressed Ctrl-C — whatever it started is stopped too (SIGTERM, then SIGKILL),
so no leftover holds GPU memory while the next mode runs. POSIX only.

Pure: no IPython, no plotly; `report` turns the result into a table and a figure.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jax_nbmem.allocator.jaxlib import MANAGED_VARIABLES
from jax_nbmem.allocator.modes import AllocatorMode, ModeError, mode_variables
from jax_nbmem.allocator.modes import parse_mode as _parse_mode
from jax_nbmem.gpu import nvml, own_process
from jax_nbmem.tools.compare import DEFAULT_TIMEOUT_S
from jax_nbmem.tools.compare.advice import recommend
from jax_nbmem.tools.compare.results import CompareResult, ModeResult
from jax_nbmem.units import format_bytes, format_duration

__all__ = [
    "DEFAULT_MODES",
    "DEFAULT_TIMEOUT_S",
    "SELF_CONTAINED",
    "CompareError",
    "parse_modes",
    "run_compare",
]

_log = logging.getLogger(__name__)

DEFAULT_MODES = ("on", "off", "platform")
SELF_CONTAINED = (
    "the cell runs in a fresh Python process per mode, so it must be self-contained: "
    "import and define everything it uses inside the cell (IPython magics and ! commands "
    "do not work there)"
)
# Between SIGTERM and SIGKILL: time for the child to write what it measured so far.
_STOP_GRACE_S = 3.0
_POLL_S = 0.05
_TAIL_CHARS = 2000


class CompareError(ValueError):
    """The cell cannot be compared at all (empty, not valid Python); the message says why."""


def parse_modes(words: Sequence[str] | None) -> list[AllocatorMode]:
    """Parse mode words (default: on, off, platform); ``fraction`` may take the next word.

    Raises ModeError for an invalid or repeated mode.
    """
    words = [word for word in (words or DEFAULT_MODES) if word.strip()] or list(DEFAULT_MODES)
    modes: list[AllocatorMode] = []
    index = 0
    while index < len(words):
        text = words[index]
        if text.strip().lower() == "fraction" and index + 1 < len(words):
            text, index = f"{text} {words[index + 1]}", index + 1
        mode = _parse_mode(text)
        if str(mode) in map(str, modes):
            raise ModeError(f"mode {mode} is given twice")
        modes.append(mode)
        index += 1
    return modes


def run_compare(
    code: str,
    modes: Sequence[str] | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    on_progress: Callable[[str, str], None] | None = None,
) -> CompareResult:
    """Run ``code`` once per mode, each in a fresh subprocess, and measure it.

    ``env`` (default ``os.environ``) is the subprocesses' environment, less the allocator
    variables, which each mode sets for itself. ``timeout_s`` limits each mode.
    ``on_progress(mode, state)`` is told ``running`` when a mode starts, then its final state
    (see :class:`ModeResult`), or ``interrupted``; it must not raise (if it does, it is logged).
    On Ctrl-C (KeyboardInterrupt) the running subprocess and all it started are stopped, and
    the KeyboardInterrupt is raised again.

    Raises ModeError for a bad mode and CompareError for an empty or invalid cell, before
    anything is started.
    """
    parsed = parse_modes(modes)
    if not code.strip():
        raise CompareError("the cell is empty: put the code to compare below %%jaxalloc compare")
    try:
        compile(code, "<cell>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise CompareError(
            f"the cell is not valid Python (line {exc.lineno}: {exc.msg}); {SELF_CONTAINED}"
        ) from None
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    base = dict(os.environ if env is None else env)
    notes = _kernel_gpu_notes()
    results = []
    with tempfile.TemporaryDirectory(prefix="jax_nbmem_compare_") as folder:
        code_path = Path(folder) / "cell.py"
        code_path.write_text(code, encoding="utf-8")
        for index, mode in enumerate(parsed):
            label = str(mode)
            _tell(on_progress, label, "running")
            try:
                result = _run_mode(
                    label,
                    _child_env(base, mode),
                    code_path,
                    Path(folder) / str(index),
                    timeout_s,
                    python,
                )
            except KeyboardInterrupt:
                _tell(on_progress, label, "interrupted")
                raise
            _tell(on_progress, label, result.state)
            results.append(result)
    return CompareResult(tuple(results), recommend(results), tuple(notes))


def _tell(on_progress: Callable[[str, str], None] | None, mode: str, state: str) -> None:
    if on_progress is None:
        return
    try:
        on_progress(mode, state)
    except Exception:  # a progress display must not stop the comparison
        _log.debug("jax_nbmem compare: on_progress failed", exc_info=True)


def _child_env(base: Mapping[str, str], mode: AllocatorMode) -> dict[str, str]:
    env = {name: value for name, value in base.items() if name not in MANAGED_VARIABLES}
    env.update({name: value for name, value in mode_variables(mode).items() if value is not None})
    # Last on the path, so the cell's own imports win; the child needs jax_nbmem itself.
    package_root = str(Path(__file__).resolve().parents[3])  # the folder holding jax_nbmem/
    earlier = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{earlier}{os.pathsep}{package_root}" if earlier else package_root
    return env


def _kernel_gpu_notes() -> list[str]:
    """Warn when the calling kernel itself holds GPU memory the subprocesses cannot use."""
    mine = [p for p in own_process.own_entries(nvml.processes()) or () if p.used_bytes]
    # A MIG instance is named by its label ("MIG 3g.71gb instance 2 of GPU 0"), not its number.
    labels = {gpu.index: gpu.label for gpu in nvml.gpus()} if mine else {}
    return [
        f"this kernel holds {format_bytes(process.used_bytes)} on "
        f"{labels.get(process.gpu, f'GPU {process.gpu}')} "
        "while the modes run; modes that preallocate have that much less room"
        for process in mine
    ]


def _run_mode(
    label: str, env: dict[str, str], code_path: Path, folder: Path, timeout_s: float, python: str
) -> ModeResult:
    folder.mkdir()
    result_path, out_path, err_path = folder / "result.json", folder / "out", folder / "err"
    command = [python, "-m", "jax_nbmem.tools.compare.child", str(code_path), str(result_path)]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.monotonic()
        child = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        timed_out = not _wait_exit(child, start + timeout_s)
    finally:
        # Also after a normal exit: what the cell started must not outlive it and hold memory
        # while the next mode runs. On Ctrl-C this is the clean-up before the re-raise.
        _end_group(child)
    total_s = time.monotonic() - start
    try:
        payload = json.loads(result_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        payload = None
    tails = {"stdout_tail": _tail(out_path), "stderr_tail": _tail(err_path)}
    common = {"total_s": total_s, "returncode": child.returncode, **tails}
    if payload is None:
        state = "timeout" if timed_out else "crashed"
        error = (
            f"no result after the {format_duration(timeout_s)} timeout"
            if timed_out
            else f"the subprocess ended ({_exit_text(child.returncode)}) before reporting"
        )
        return ModeResult(label, state, error=error, **common)
    return _from_payload(label, payload, timed_out, timeout_s, common)


def _wait_exit(child: subprocess.Popen, deadline: float) -> bool:
    """Wait until ``child`` exits or ``deadline``; leave it unreaped (True when it exited).

    An unreaped child keeps its process-group id reserved, so signalling the group afterwards
    cannot reach a stranger that was given the same number.
    """
    while True:
        if hasattr(os, "waitid"):
            try:
                options = os.WEXITED | os.WNOHANG | os.WNOWAIT
                if os.waitid(os.P_PID, child.pid, options) is not None:
                    return True
            except ChildProcessError:
                return True
        elif child.poll() is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def _end_group(child: subprocess.Popen) -> None:
    """SIGTERM the child's process group, give it a grace period, SIGKILL it, reap the child."""
    deadline = time.monotonic() + _STOP_GRACE_S
    try:
        _signal_group(child.pid, signal.SIGTERM)
        _wait_exit(child, deadline)
        while _group_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
    finally:
        _signal_group(child.pid, signal.SIGKILL)
        child.wait()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone (or what is left is not ours to signal)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs; zombies do not count."""
    try:
        import psutil
    except ImportError:
        return True  # cannot tell: wait out the grace period, then SIGKILL
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != "zombie":
                return True
        except (OSError, psutil.Error):
            continue
    return False


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - _TAIL_CHARS * 4))
            return stream.read().decode(errors="replace")[-_TAIL_CHARS:]
    except OSError:
        return ""


def _exit_text(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


# What the child measures, by ModeResult field; the parent adds the rest.
_MEASURED = ("wall_s", "on_gpu", "jax_peak_bytes", "jax_in_use_bytes", "jax_limit_bytes",
             "jax_pool_bytes", "jax_free_bytes", "largest_free_block_bytes", "gpu_peak_bytes",
             "gpu_total_bytes", "host_peak_rss_bytes", "error", "traceback", "hint")  # fmt: skip


def _from_payload(
    label: str, payload: dict[str, Any], timed_out: bool, timeout_s: float, common: dict
) -> ModeResult:
    figures = {name: payload.get(name) for name in _MEASURED}
    if timed_out:
        state = "timeout"
        figures["error"] = f"stopped after the {format_duration(timeout_s)} timeout"
    elif payload.get("stopped"):
        state = "stopped"
        figures["error"] = "stopped by a SIGTERM from outside"
    elif payload.get("oom"):
        state = "oom"
    else:
        state = "error" if figures["error"] else "ok"
    return ModeResult(
        label,
        state,
        **figures,
        notes=tuple(payload.get("notes", ())),
        devices=tuple(payload.get("devices", ())),
        **common,
    )
