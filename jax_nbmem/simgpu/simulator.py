"""A simulated NVIDIA GPU for tests and the no-GPU demo.

The simulation is a small C stand-in for ``libnvidia-ml.so.1`` (``nvml_stub.c``, beside this
module) that the real ``pynvml`` loads like the real library. It reports whatever a *state file*
says: the GPUs, their memory, the processes on them, a lost GPU or a missing driver. This module
builds the library, writes state files, and sets up processes to use it. It never imports
pynvml.

Typical use::

    lib = build(tmp_dir)
    state = SimState(tmp_dir / "gpu.state").gpu(0, total=80 * GIB).process(0, 4242, 4 * GIB)
    state.write()
    subprocess.run(cmd, env=env_for_subprocess(lib.parent, state.path))

Simulated devices say so in their names ("(simulated)"), so nobody mistakes them for hardware.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid as uuid_module
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "GIB",
    "CALLS",
    "LIBRARY_NAME",
    "NVML_ERRORS",
    "STATE_ENV_VAR",
    "SimState",
    "build",
    "demo_state",
    "env_for_subprocess",
    "preload",
]

GIB = 1024**3
LIBRARY_NAME = "libnvidia-ml.so.1"
STATE_ENV_VAR = "JAX_NBMEM_SIMGPU_STATE"

_SOURCE = Path(__file__).with_name("nvml_stub.c")
_BASE_FLAGS = ("-O2", "-shared", "-fPIC", "-fvisibility=hidden", f"-Wl,-soname,{LIBRARY_NAME}")
_DEFAULT_NAME = "NVIDIA H200 (simulated)"


def build(dest_dir: str | os.PathLike[str], old_driver: bool = False) -> Path:
    """Compile the stand-in NVML library under ``dest_dir`` and return its path.

    The library lands in its own sub-folder (named after a hash of the source and flags) as
    ``libnvidia-ml.so.1``, so that folder can go on ``LD_LIBRARY_PATH``. A build that already
    exists is reused; concurrent builders each compile to a temporary file and rename it into
    place. ``old_driver=True`` leaves out the newer NVML functions (``..._v2`` memory info,
    ``..._v3`` process lists), as an old driver would.

    Raises ``RuntimeError`` when no C compiler is found or compiling fails.
    """
    flags = (*_BASE_FLAGS, "-DSIM_OLD_DRIVER") if old_driver else _BASE_FLAGS
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source + "\0".join(flags).encode()).hexdigest()[:16]
    flavor = "old-driver" if old_driver else "current"
    lib_dir = Path(dest_dir) / f"simgpu-{flavor}-{digest}"
    lib_path = lib_dir / LIBRARY_NAME
    if lib_path.exists():
        return lib_path
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (gcc or cc) found to build the simulated GPU library")
    lib_dir.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=lib_dir, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run(
            [compiler, *flags, "-o", partial, str(_SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"building the simulated GPU library failed:\n{done.stderr}")
        os.replace(partial, lib_path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return lib_path


def preload(lib_path: str | os.PathLike[str]) -> ctypes.CDLL:
    """Load the stand-in library into this process so later loads by soname find it.

    glibc reads ``LD_LIBRARY_PATH`` only when a process starts; a library that is already
    loaded, though, satisfies any later ``dlopen("libnvidia-ml.so.1")``. It stays loaded for
    the life of the process.
    """
    return ctypes.CDLL(os.fspath(lib_path), mode=ctypes.RTLD_GLOBAL)


def env_for_subprocess(
    lib_dir: str | os.PathLike[str],
    state_path: str | os.PathLike[str],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return a copy of ``base`` (default ``os.environ``) that makes a child use the simulation.

    ``lib_dir`` goes first on ``LD_LIBRARY_PATH`` and ``JAX_NBMEM_SIMGPU_STATE`` names the state.
    """
    env = dict(os.environ if base is None else base)
    earlier = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = os.fspath(lib_dir) + (f":{earlier}" if earlier else "")
    env[STATE_ENV_VAR] = os.fspath(state_path)
    return env


# NVML's error codes (nvml.h) that the simulation can be told to return.
NVML_ERRORS = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "INSUFFICIENT_SIZE": 7,
    "DRIVER_NOT_LOADED": 9,
    "GPU_IS_LOST": 15,
    "UNKNOWN": 999,
}
# The calls a fault or a delay can target (see nvml_stub.c); "any" is every one of them.
CALLS = ("init", "count", "name", "uuid", "memory", "processes", "driver", "any")


@dataclass
class _Gpu:
    total: int
    uuid: str
    name: str | bytes
    used: int | None
    reserved: int
    free: int | None = None
    raw: bool = False


@dataclass
class _Process:
    gpu: int
    pid: int
    used: int | None
    graphics: bool


@dataclass
class SimState:
    """What the simulated GPUs report; edit it, then ``write()`` it for readers to see.

    Methods return the state itself, so calls chain. ``write()`` replaces the file atomically:
    a reader in another process sees the old state or the new one, never a mix.
    """

    path: Path
    driver: str = "550.54.15"
    driver_loaded: bool = True
    _gpus: dict[int, _Gpu] = field(default_factory=dict, init=False, repr=False)
    _processes: list[_Process] = field(default_factory=list, init=False, repr=False)
    _lost: set[int] = field(default_factory=set, init=False, repr=False)
    _slow: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _faults: list[tuple[str, int, int | None]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    def gpu(
        self,
        index: int,
        total: int,
        uuid: str | None = None,
        name: str | bytes | None = None,
        used: int | None = None,
        reserved: int = 0,
        *,
        free: int | None = None,
        raw: bool = False,
    ) -> SimState:
        """Add (or replace) GPU ``index`` with ``total`` bytes.

        ``uuid`` defaults to one derived from the index; ``name`` to a simulated H200 (bytes
        are passed as they are, so a name need not be valid UTF-8). ``used`` pins the device's
        used bytes; by default it is the sum of its processes plus 500 MiB for the driver.
        ``reserved`` is memory the driver keeps back (NVML's v2 memory info). ``raw=True``
        reports ``total``, ``used`` and ``free`` exactly as given, even when they make no
        sense (used above total, 2**64 - 1), as a confused driver would.
        """
        name = _DEFAULT_NAME if name is None else name
        if isinstance(name, str) and ("\n" in name or " #" in name):
            raise ValueError(f"a simulated GPU name cannot hold a newline or ' #': {name!r}")
        if isinstance(name, bytes) and (len(name) >= 96 or b"\0" in name):
            raise ValueError("a simulated GPU name in bytes must be < 96 bytes without NUL")
        if uuid is None:
            uuid = "GPU-" + str(uuid_module.uuid5(uuid_module.NAMESPACE_OID, f"simgpu-{index}"))
        self._gpus[index] = _Gpu(total, uuid, name, used, reserved, free, raw)
        return self

    def slow(self, call: str, seconds: float) -> SimState:
        """Make every ``call`` (see :data:`CALLS`) take ``seconds`` before it answers."""
        if call not in CALLS:
            raise ValueError(f"unknown NVML call {call!r}; one of {', '.join(CALLS)}")
        self._slow[call] = max(0, round(seconds * 1000))
        return self

    def fail(self, call: str, error: str | int, gpu: int | None = None) -> SimState:
        """Make ``call`` return NVML error ``error`` (a name of :data:`NVML_ERRORS` or a code).

        Only on ``gpu`` when given, else on every GPU. ``fail("processes",
        "INSUFFICIENT_SIZE")`` keeps saying the buffer is too small, as when processes come
        and go between NVML's two calls.
        """
        if call not in CALLS:
            raise ValueError(f"unknown NVML call {call!r}; one of {', '.join(CALLS)}")
        code = NVML_ERRORS[error] if isinstance(error, str) else int(error)
        self._faults.append((call, code, gpu))
        return self

    def heal(self) -> SimState:
        """Take back every :meth:`slow` and :meth:`fail`."""
        self._slow.clear()
        self._faults.clear()
        return self

    def process(self, gpu: int, pid: int, used: int | None, graphics: bool = False) -> SimState:
        """Put process ``pid`` on GPU ``gpu`` holding ``used`` bytes (None: NVML can't tell)."""
        self._processes.append(_Process(gpu=gpu, pid=pid, used=used, graphics=graphics))
        return self

    def remove_process(self, pid: int) -> SimState:
        """Take process ``pid`` off every GPU."""
        self._processes = [proc for proc in self._processes if proc.pid != pid]
        return self

    def lose(self, gpu: int) -> SimState:
        """Make GPU ``gpu`` "fall off the bus": NVML calls on it fail with GPU_IS_LOST."""
        self._lost.add(gpu)
        return self

    def recover(self, gpu: int) -> SimState:
        """Bring a lost GPU back."""
        self._lost.discard(gpu)
        return self

    def no_driver(self, missing: bool = True) -> SimState:
        """Pretend the kernel driver is not loaded (or, with ``missing=False``, is back)."""
        self.driver_loaded = not missing
        return self

    def render(self) -> str:
        """Return the state file's text."""
        lines = ["# jax_nbmem simulated GPU state", f"driver {self.driver}"]
        if not self.driver_loaded:
            lines.append("nodriver")
        for index, gpu in sorted(self._gpus.items()):
            used = "" if gpu.used is None else f" used={gpu.used}"
            free = "" if gpu.free is None else f" free={gpu.free}"
            raw = " raw" if gpu.raw else ""
            name = (
                f" namehex={gpu.name.hex()}" if isinstance(gpu.name, bytes) else f" name={gpu.name}"
            )
            lines.append(
                f"gpu {index} {gpu.uuid} total={gpu.total}{used}{free} reserved={gpu.reserved}"
                f"{raw}{name}"
            )
        for proc in self._processes:
            used = "na" if proc.used is None else str(proc.used)
            kind = "graphics" if proc.graphics else "compute"
            lines.append(f"proc {proc.gpu} {proc.pid} used={used} kind={kind}")
        lines.extend(f"lost {index}" for index in sorted(self._lost))
        lines.extend(f"slow {call} {ms}" for call, ms in sorted(self._slow.items()))
        for call, code, gpu in self._faults:
            lines.append(f"fail {call} {code}" + ("" if gpu is None else f" {gpu}"))
        return "\n".join(lines) + "\n"

    def write(self) -> Path:
        """Write the state file atomically (temporary file, then rename) and return its path."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as out:
                # Every user's processes see the one GPU, as with /dev/nvidia*.
                os.fchmod(out.fileno(), 0o644)
                out.write(self.render())
            os.replace(partial, self.path)
        except BaseException:
            os.unlink(partial)
            raise
        return self.path


def demo_state(path: str | os.PathLike[str]) -> SimState:
    """Return (unwritten) a one-GPU state for the demo: a simulated 150 GB H200, no processes."""
    return SimState(Path(path)).gpu(0, total=150_000_000_000)


def _print_shell_env(folder: Path) -> int:
    """For `eval "$(python -m jax_nbmem.simgpu shell-env DIR)"` in the demo script."""
    try:
        lib = build(folder)
    except RuntimeError as error:
        print(f"echo {shlex.quote(str(error))} >&2; false")
        return 1
    state = folder / "gpu.state"
    if not state.exists():
        demo_state(state).write()
    env = env_for_subprocess(lib.parent, state, base=os.environ)
    for name in ("LD_LIBRARY_PATH", STATE_ENV_VAR):
        print(f"export {name}={shlex.quote(env[name])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m jax_nbmem.simgpu``: build the library, write a demo state, print shell env."""
    parser = argparse.ArgumentParser(
        prog="python -m jax_nbmem.simgpu", description="Simulated NVIDIA GPU for demos and tests."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser("build", help="compile the stand-in libnvidia-ml.so.1")
    build_cmd.add_argument("dir", help="folder to build into (reused when already built)")
    build_cmd.add_argument("--old-driver", action="store_true", help="leave out newer functions")
    state_cmd = commands.add_parser("demo-state", help="write a one-GPU state file")
    state_cmd.add_argument("file")
    shell_cmd = commands.add_parser(
        "shell-env",
        help="build into DIR, write DIR/gpu.state (demo) if missing, print `export` lines",
    )
    shell_cmd.add_argument("dir")
    args = parser.parse_args(argv)
    if args.command == "shell-env":
        return _print_shell_env(Path(args.dir))
    if args.command == "build":
        try:
            print(build(args.dir, old_driver=args.old_driver).parent)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
    else:
        print(demo_state(args.file).write())
    return 0
