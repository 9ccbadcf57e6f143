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
import time
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
DRIVER_BYTES = 500 * 1024**2  # what the stub counts as used besides its processes
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
        os.chmod(partial, 0o755)  # every user's processes load it, as the driver's library
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
    ends_with_process: bool = False


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
        used bytes; by default it is the sum of its processes plus 500 MiB for the driver
        (:data:`DRIVER_BYTES`).
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

    def process(
        self,
        gpu: int,
        pid: int,
        used: int | None,
        graphics: bool = False,
        *,
        ends_with_process: bool = False,
    ) -> SimState:
        """Put process ``pid`` on GPU ``gpu`` holding ``used`` bytes (None: NVML can't tell).

        ``ends_with_process=True``: the GPU lists it only while a process ``pid`` exists, as
        a real driver forgets a process that exited (the demo's kernels are written so).
        """
        self._processes.append(_Process(gpu, pid, used, graphics, ends_with_process))
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

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> SimState:
        """The state a file holds (what :meth:`write` wrote); an empty state if it is missing.

        For writers that change one thing and keep the rest, as the kernels' mirrors do
        (:mod:`jax_nbmem.simgpu.mirror`).
        """
        state = cls(Path(path))
        try:
            text = state.path.read_text()
        except FileNotFoundError:
            return state
        for line in text.splitlines():
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            kind = words[0]
            if kind == "driver" and len(words) > 1:
                state.driver = words[1]
            elif kind == "nodriver":
                state.driver_loaded = False
            elif kind == "gpu":
                state._read_gpu(line)
            elif kind == "proc":
                fields = dict(word.split("=", 1) for word in words[3:] if "=" in word)
                used = None if fields.get("used") == "na" else int(fields["used"])
                state.process(
                    int(words[1]),
                    int(words[2]),
                    used,
                    fields.get("kind") == "graphics",
                    ends_with_process=fields.get("ends") == "exit",
                )
            elif kind == "lost":
                state.lose(int(words[1]))
            elif kind == "slow":
                state._slow[words[1]] = int(words[2])
            elif kind == "fail":
                state._faults.append(
                    (words[1], int(words[2]), int(words[3]) if len(words) > 3 else None)
                )
        return state

    def _read_gpu(self, line: str) -> None:
        head, _, name = line.partition(" name=")
        words = head.split()
        fields = dict(word.split("=", 1) for word in words[3:] if "=" in word)
        if "namehex" in fields:
            gpu_name: str | bytes = bytes.fromhex(fields["namehex"])
        else:
            gpu_name = name
        self._gpus[int(words[1])] = _Gpu(
            total=int(fields["total"]),
            uuid=words[2],
            name=gpu_name,
            used=int(fields["used"]) if "used" in fields else None,
            reserved=int(fields.get("reserved", 0)),
            free=int(fields["free"]) if "free" in fields else None,
            raw="raw" in words[3:],
        )

    def process_bytes(self, pid: int) -> int | None:
        """What process ``pid`` holds over all GPUs; None when it is on none (or unknown)."""
        held = [proc.used for proc in self._processes if proc.pid == pid]
        return sum(held) if held and None not in held else None

    def free_bytes(self, gpu: int, leaving_out: int | None = None) -> int | None:
        """What GPU ``gpu`` reports free, as the stub computes it, without process ``leaving_out``.

        None when the state has no such GPU or pins numbers that say nothing (``raw``).
        """
        found = self._gpus.get(gpu)
        if found is None or found.raw:
            return None
        if found.free is not None:
            return found.free
        if found.used is not None:
            used = found.used
        else:
            held = [p.used or 0 for p in self._processes if p.gpu == gpu and p.pid != leaving_out]
            used = DRIVER_BYTES + sum(held)
        return max(0, found.total - found.reserved - used)

    def total_bytes(self, gpu: int) -> int | None:
        """GPU ``gpu``'s total memory, or None when the state has no such GPU."""
        found = self._gpus.get(gpu)
        return None if found is None else found.total

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
            ends = " ends=exit" if proc.ends_with_process else ""
            lines.append(f"proc {proc.gpu} {proc.pid} used={used} kind={kind}{ends}")
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


_STARTUP_FILE = """\
# Written by `python -m jax_nbmem.simgpu shell-env --kernels`: the demo's kernels put their JAX
# arrays on the simulated GPU the way JAX's allocator would hold them on a real one.
try:
    import jax_nbmem.simgpu.mirror as _jax_nbmem_mirror

    _jax_nbmem_mirror.start_from_environment()
    del _jax_nbmem_mirror
except Exception as _error:  # a demo aid never stops a kernel from starting
    print(f"jax_nbmem simulated GPU: the mirror did not start ({_error})")
"""


STATE_FORMAT = """\
The state file, one fact per line (what `SimState.write()` writes; `#` starts a comment):
  driver VERSION
  gpu INDEX UUID total=BYTES [used=BYTES] [free=BYTES] [reserved=BYTES] [raw] [name=NAME]
  proc GPU PID used=BYTES|na [kind=compute|graphics] [ends=exit]
  lost GPU | nodriver | slow CALL MS | fail CALL ERROR [GPU]
A GPU's used memory is its processes' plus 500 MiB for the driver unless `used=` pins it.
`ends=exit`: the process is listed only while it runs. CALL: init, count, name, uuid,
memory, processes, driver or any. Edit the file at any time: every NVML call reads it again.
Example, a neighbour holding 60 GiB of an 80 GiB GPU (or use the `tenant` command):
  gpu 0 GPU-00000000-0000-0000-0000-000000000000 total=85899345920 name=NVIDIA H200 (simulated)
  proc 0 12345 used=64424509440
"""


def default_dir() -> Path:
    """This user's folder for the demo's simulated GPU: two users on one machine never share.

    ``jax_nbmem-simgpu-UID`` in the temporary directory, created private to the user (its
    state file stays readable by all, as the real /dev/nvidia* is).
    """
    folder = Path(tempfile.gettempdir()) / f"jax_nbmem-simgpu-{os.getuid()}"
    folder.mkdir(mode=0o755, exist_ok=True)
    if folder.stat().st_uid != os.getuid():
        raise RuntimeError(f"{folder} belongs to another user; pass a folder of your own")
    return folder


def _print_shell_env(folder: Path | None, kernels: bool = False) -> int:
    """For `eval "$(python -m jax_nbmem.simgpu shell-env [DIR])"` in the demo script."""
    try:
        folder = default_dir() if folder is None else folder
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
    if kernels:
        # An IPython profile of the demo's own, so the user's profile stays untouched.
        ipython_dir = folder / "ipython"
        startup = ipython_dir / "profile_default" / "startup" / "50-jax-nbmem-simgpu.py"
        startup.parent.mkdir(parents=True, exist_ok=True)
        startup.write_text(_STARTUP_FILE)
        print(f"export IPYTHONDIR={shlex.quote(str(ipython_dir))}")
    return 0


def start_tenant(
    state_path: str | os.PathLike[str],
    notebook: str = "neighbour.ipynb",
    fraction: float | None = None,
    timeout: float = 90.0,
) -> tuple[int, int]:
    """Start a neighbour on the simulated GPU: a real, idle Jupyter kernel that preallocated.

    It runs JAX (on the CPU) with preallocation on (``fraction`` of the GPU, JAX's 75% by
    default), and its mirror puts the pool on the simulated GPU; it names ``notebook`` as its
    own (``JPY_SESSION_NAME``). It runs until it is shut down (the panel's button does) or
    killed. Returns its PID and the bytes it holds once its pool is on the GPU.
    """
    from jupyter_client.connect import write_connection_file
    from jupyter_core.paths import jupyter_runtime_dir

    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], not {fraction}")
    state_path = Path(state_path).resolve()
    runtime = Path(jupyter_runtime_dir())
    runtime.mkdir(parents=True, exist_ok=True)
    connection = runtime / f"kernel-{uuid_module.uuid4()}.json"
    write_connection_file(str(connection), ip="127.0.0.1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PYTHON_CLIENT_")}
    env.pop("XLA_CLIENT_MEM_FRACTION", None)
    env.update({STATE_ENV_VAR: str(state_path), "JAX_PLATFORMS": "cpu"})
    env["JPY_SESSION_NAME"] = notebook
    if fraction is not None:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{fraction:g}"  # every jaxlib reads this one
    warm_up = (
        "import jax_nbmem.simgpu.mirror as _mirror, jax.numpy as _jnp; "
        "_mirror.start_from_environment(); _jnp.ones(1).block_until_ready()"
    )
    log_path = state_path.with_name(f"tenant-{connection.stem}.log")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection),
             f"--IPKernelApp.exec_lines={warm_up}"],
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # it outlives this command
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = SimState.read(state_path).process_bytes(process.pid)
        if held:
            return process.pid, held
        if process.poll() is not None:
            break
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the neighbour kernel did not take its pool; its log: {log_path}")


def main(argv: list[str] | None = None) -> int:
    """``python -m jax_nbmem.simgpu``: build the library, write a demo state, print shell env."""
    parser = argparse.ArgumentParser(
        prog="python -m jax_nbmem.simgpu",
        description="A simulated NVIDIA GPU for the demo and the tests: a stand-in "
        "libnvidia-ml.so.1 that the real pynvml loads, answering from a state file named by "
        f"${STATE_ENV_VAR}. Its GPUs say '(simulated)' in their names.",
        epilog=STATE_FORMAT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    shell_cmd.add_argument(
        "dir",
        nargs="?",
        default=None,
        help="folder (default: jax_nbmem-simgpu-UID in the temporary directory, one per user)",
    )
    shell_cmd.add_argument(
        "--kernels",
        action="store_true",
        help="also have kernels mirror their JAX arrays onto the simulated GPU, as JAX's "
        "allocator would hold them (an IPython startup file; exports IPYTHONDIR)",
    )
    tenant_cmd = commands.add_parser(
        "tenant",
        help="start a neighbour: a real idle Jupyter kernel whose JAX preallocated on the "
        "simulated GPU (stop it with the panel's shut-down button, or kill PID)",
    )
    tenant_cmd.add_argument(
        "--state",
        default=os.environ.get(STATE_ENV_VAR),
        help=f"state file (default: ${STATE_ENV_VAR})",
    )
    tenant_cmd.add_argument("--notebook", default="neighbour.ipynb", help="the notebook it names")
    tenant_cmd.add_argument(
        "--fraction", type=float, default=None, help="its pool's share of the GPU (default 0.75)"
    )
    args = parser.parse_args(argv)
    if args.command == "shell-env":
        return _print_shell_env(None if args.dir is None else Path(args.dir), kernels=args.kernels)
    if args.command == "tenant":
        if not args.state:
            parser.error(f"tenant: no state file: pass --state or set ${STATE_ENV_VAR}")
        try:
            pid, held = start_tenant(args.state, args.notebook, args.fraction)
        except (RuntimeError, ValueError) as error:
            print(f"jax_nbmem simulated GPU: {error}", file=sys.stderr)
            return 1
        print(
            f"Simulated neighbour: kernel PID {pid} ({args.notebook}, preallocated) holds "
            f"{held / GIB:.1f} GiB of the simulated GPU. Stop it: kill {pid}"
        )
        return 0
    if args.command == "build":
        try:
            print(build(args.dir, old_driver=args.old_driver).parent)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
    else:
        print(demo_state(args.file).write())
    return 0
