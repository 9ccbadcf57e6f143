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
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid as uuid_module
from collections.abc import Callable, Mapping
from pathlib import Path

from jax_nbmem.simgpu.liveness import running_since
from jax_nbmem.simgpu.state import (
    CALLS,
    DEFAULT_RESERVED_BYTES,
    GIB,
    NVML_ERRORS,
    STATE_FORMAT,
    SimState,
    StateError,
)

__all__ = [
    "CALLS",
    "DEFAULT_RESERVED_BYTES",
    "GIB",
    "LIBRARY_NAME",
    "NO_COMPILER",
    "NVML_ERRORS",
    "STARTUP_FILE",
    "STATE_ENV_VAR",
    "SimState",
    "StateError",
    "build",
    "demo_state",
    "env_for_subprocess",
    "preload",
]

DRIVER_BYTES = DEFAULT_RESERVED_BYTES  # deprecated name: the default reserved memory
LIBRARY_NAME = "libnvidia-ml.so.1"
STATE_ENV_VAR = "JAX_NBMEM_SIMGPU_STATE"

# The stand-in is compiled on first use (then reused): a C compiler is the one thing the
# simulated GPU needs that pip does not install (docs/how-it-is-built.md, "Why a C compiler").
NO_COMPILER = (
    "the simulated GPU needs a C compiler, and none was found (gcc, cc, or $CC): its stand-in "
    "libnvidia-ml.so.1 is compiled from C on first use. Install one (Debian/Ubuntu: "
    "`apt-get install gcc`; Fedora/RHEL: `dnf install gcc`; conda: `conda install -c "
    "conda-forge c-compiler`) or set CC, then run again. A real NVIDIA GPU needs no compiler."
)
_SOURCE = Path(__file__).with_name("nvml_stub.c")
_BASE_FLAGS = (
    "-O2",
    "-shared",
    "-fPIC",
    "-pthread",
    "-fvisibility=hidden",
    f"-Wl,-soname,{LIBRARY_NAME}",
)


def build(dest_dir: str | os.PathLike[str], old_driver: bool = False) -> Path:
    """Compile the stand-in NVML library under ``dest_dir`` and return its path.

    The library lands in its own sub-folder (named after a hash of the source and flags) as
    ``libnvidia-ml.so.1``, so that folder can go on ``LD_LIBRARY_PATH``. A build that already
    exists is reused; concurrent builders each compile to a temporary file and rename it into
    place. ``old_driver=True`` leaves out the newer NVML functions (``..._v2`` memory info,
    ``..._v3`` process lists), as an old driver would.

    Raises ``RuntimeError`` when no C compiler is found (:data:`NO_COMPILER` says what to
    install) or compiling fails; no half-built library is left behind.
    """
    flags = (*_BASE_FLAGS, "-DSIM_OLD_DRIVER") if old_driver else _BASE_FLAGS
    # nvml_stub.c includes the other parts: a change to any of them is a new build.
    source = b"".join(part.read_bytes() for part in sorted(_SOURCE.parent.glob("nvml_*.c")))
    digest = hashlib.sha256(source + "\0".join(flags).encode()).hexdigest()[:16]
    flavor = "old-driver" if old_driver else "current"
    lib_dir = Path(dest_dir) / f"simgpu-{flavor}-{digest}"
    lib_path = lib_dir / LIBRARY_NAME
    if lib_path.exists():
        return lib_path
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError(NO_COMPILER)
    lib_dir.mkdir(parents=True, exist_ok=True)
    lib_dir.chmod(0o755)  # whatever the umask: every user's processes load the one library
    fd, partial = tempfile.mkstemp(dir=lib_dir, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        try:
            done = subprocess.run(
                [compiler, *flags, "-o", partial, str(_SOURCE)],
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as error:  # $CC names something that cannot run
            raise RuntimeError(
                f"the C compiler {compiler!r} could not run ({error}): set CC to a C compiler, "
                "or unset it to use gcc"
            ) from None
        if done.returncode != 0:
            raise RuntimeError(f"building the simulated GPU library failed:\n{done.stderr}")
        os.chmod(partial, 0o755)  # as libnvidia-ml.so.1 is: readable by all
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


def demo_state(path: str | os.PathLike[str]) -> SimState:
    """Return (unwritten) a one-GPU state for the demo: a simulated 150 GB H200, no processes."""
    return SimState(Path(path)).gpu(0, total=150_000_000_000)


STARTUP_FILE = """\
# Written by `python -m jax_nbmem.simgpu shell-env --kernels` (or `shared-setup --startup`):
# kernels put their JAX arrays on the simulated GPU the way JAX's allocator would hold them.
try:
    import jax_nbmem.simgpu.mirror as _jax_nbmem_mirror

    _jax_nbmem_mirror.start_from_environment()
    del _jax_nbmem_mirror
except Exception as _error:  # a demo aid never stops a kernel from starting
    print(f"jax_nbmem simulated GPU: the mirror did not start ({_error})")
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
    try:
        # A new run meets only live processes: what earlier runs left (a neighbour, a kernel
        # killed before its mirror could leave) goes; running processes, anyone's, stay.
        with SimState.update(state) as current:
            current.forget_ended()
    except StateError as error:
        print(f"echo {shlex.quote(f'jax_nbmem simulated GPU: {error}')} >&2")
    env = env_for_subprocess(lib.parent, state, base=os.environ)
    for name in ("LD_LIBRARY_PATH", STATE_ENV_VAR):
        print(f"export {name}={shlex.quote(env[name])}")
    if kernels:
        # An IPython profile of the demo's own, so the user's profile stays untouched.
        ipython_dir = folder / "ipython"
        startup = ipython_dir / "profile_default" / "startup" / "50-jax-nbmem-simgpu.py"
        startup.parent.mkdir(parents=True, exist_ok=True)
        startup.write_text(STARTUP_FILE)
        print(f"export IPYTHONDIR={shlex.quote(str(ipython_dir))}")
    return 0


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def stop_when_gone(pid: int, interval: float = 0.5) -> threading.Thread:
    """End this process (SIGTERM) once process *pid* has ended; a daemon thread watches.

    A process that has ended but is not yet reaped (a zombie) counts as ended.
    """

    def watch() -> None:
        while running_since(pid)[0]:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="jax_nbmem-simgpu-stop-with", daemon=True)
    thread.start()
    return thread


def start_tenant(
    state_path: str | os.PathLike[str],
    notebook: str = "neighbour.ipynb",
    fraction: float | None = None,
    timeout: float = 90.0,
    stop_with: int | None = None,
) -> tuple[int, int]:
    """Start a neighbour on the simulated GPU: a real, idle Jupyter kernel that preallocated.

    It runs JAX (on the CPU) with preallocation on (``fraction`` of the GPU, JAX's 75% by
    default), and its mirror puts the pool on the simulated GPU; it names ``notebook`` as its
    own (``JPY_SESSION_NAME``). It runs until it is shut down (the panel's button does), killed,
    or, with *stop_with*, process *stop_with* has ended (the demo script's). Returns its PID as
    the GPU lists it and the bytes it holds once its pool is on the GPU: in a container, with
    the state file's registrar running, that is its host PID (see :func:`start_tenant_process`
    for both).
    """
    pid, _, held = start_tenant_process(state_path, notebook, fraction, timeout, stop_with)
    return pid, held


def start_tenant_process(
    state_path: str | os.PathLike[str],
    notebook: str = "neighbour.ipynb",
    fraction: float | None = None,
    timeout: float = 90.0,
    stop_with: int | None = None,
) -> tuple[int, int, int]:
    """:func:`start_tenant`, returning the PID the GPU lists, this namespace's PID and its bytes.

    The two PIDs differ in a container whose state file has a registrar: the GPU lists the host
    PID, and ``kill`` here takes the other.
    """
    from jupyter_client.connect import write_connection_file
    from jupyter_core.paths import jupyter_runtime_dir

    from jax_nbmem.simgpu.registration import RegistrarError, register

    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], not {fraction}")
    if stop_with is not None and (stop_with <= 0 or not _exists(stop_with)):
        raise ValueError(f"--stop-with needs a running process's ID, not {stop_with}")
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
    if stop_with is not None:
        warm_up += f"; import jax_nbmem.simgpu.simulator as _sim; _sim.stop_when_gone({stop_with})"
    log_path = state_path.with_name(f"tenant-{connection.stem}.log")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection),
             f"--IPKernelApp.exec_lines={warm_up}"],
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # it outlives this command
        )  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        registration = register(state_path)  # None: no registrar, PIDs are this namespace's
    except RegistrarError as error:
        process.kill()
        raise RuntimeError(f"{error} (the state file's registrar)") from None
    try:
        while time.monotonic() < deadline:
            listed = process.pid
            if registration is not None and registration.pid != os.getpid():
                listed = registration.host_pid(process.pid)  # in a container: its host PID
            try:
                held = None if listed is None else SimState.read(state_path).process_bytes(listed)
            except StateError:  # being edited by hand: look again
                held = None
            if held and listed is not None:
                return listed, process.pid, held
            if process.poll() is not None:
                break
            time.sleep(0.2)
    finally:
        if registration is not None:
            registration.close()
    process.kill()
    raise RuntimeError(f"the neighbour kernel did not take its pool; its log: {log_path}")


def _check(path: Path) -> int:
    """``check FILE``: what the stand-in would make of it (its reader and this one agree)."""
    if not path.exists():
        print(f"{path}: no such file (NVML would say the driver is not loaded)", file=sys.stderr)
        return 1
    try:
        state = SimState.read(path)
    except StateError as error:
        print(f"{error}; the last good state stays in use", file=sys.stderr)
        return 1
    print(f"{path}: good: {state.summary()}")
    from jax_nbmem.simgpu.registration import RegistrarError, register, socket_path

    try:
        registration = register(path, timeout=1.0)
    except RegistrarError as error:
        print(f"{socket_path(path)}: {error}: processes in containers wait for it")
        return 0
    if registration is None:
        print("no registrar: processes are listed by the PID they write (plain host)")
    else:
        registration.close()
        print(f"registrar: answers at {socket_path(path)} (processes listed by host PID)")
    return 0


def main(
    argv: list[str] | None = None,
    extra: Mapping[str, tuple[Callable[..., object], Callable[..., int]]] | None = None,
) -> int:
    """``python -m jax_nbmem.simgpu``: build the library, write a demo state, print shell env.

    ``extra``: more subcommands, name → (add its parser to the subparsers, run it on the
    parsed arguments), from modules that build on this one (``shared-setup``).
    """
    parser = argparse.ArgumentParser(
        prog="python -m jax_nbmem.simgpu",
        description="A simulated NVIDIA GPU for the demo and the tests: a stand-in "
        "libnvidia-ml.so.1 that the real pynvml loads, answering from a state file named by "
        f"${STATE_ENV_VAR}. Its GPUs say '(simulated)' in their names. The library is "
        "compiled from C on first use: it needs a C compiler (gcc, cc or $CC).",
        epilog=STATE_FORMAT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser(
        "build", help="compile the stand-in libnvidia-ml.so.1 (with gcc, cc or $CC)"
    )
    build_cmd.add_argument("dir", help="folder to build into (reused when already built)")
    build_cmd.add_argument("--old-driver", action="store_true", help="leave out newer functions")
    state_cmd = commands.add_parser("demo-state", help="write a one-GPU state file")
    state_cmd.add_argument("file")
    check_cmd = commands.add_parser(
        "check", help="say whether the simulated GPU would use a state file, or which line is bad"
    )
    check_cmd.add_argument("file")
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
    for name, (add, _) in (extra or {}).items():
        add(commands, name)
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
    tenant_cmd.add_argument(
        "--stop-with",
        type=int,
        default=None,
        metavar="PID",
        help="it ends once process PID has ended (scripts/quickstart.sh passes its own)",
    )
    args = parser.parse_args(argv)
    if args.command == "shell-env":
        return _print_shell_env(None if args.dir is None else Path(args.dir), kernels=args.kernels)
    if args.command in (extra or {}):
        return extra[args.command][1](args)
    if args.command == "tenant":
        if not args.state:
            parser.error(f"tenant: no state file: pass --state or set ${STATE_ENV_VAR}")
        try:
            pid, own_pid, held = start_tenant_process(
                args.state, args.notebook, args.fraction, stop_with=args.stop_with
            )
        except (RuntimeError, ValueError) as error:
            print(f"jax_nbmem simulated GPU: {error}", file=sys.stderr)
            return 1
        where = "" if pid == own_pid else f" (host PID; {own_pid} in this container)"
        ends = "" if args.stop_with is None else f", or it stops when PID {args.stop_with} ends"
        print(
            f"Simulated neighbour: kernel PID {pid}{where} ({args.notebook}, preallocated) "
            f"holds {held / GIB:.1f} GiB of the simulated GPU. Stop it: kill {own_pid}{ends}"
        )
        return 0
    if args.command == "check":
        return _check(Path(args.file))
    if args.command == "build":
        try:
            print(build(args.dir, old_driver=args.old_driver).parent)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
    else:
        print(demo_state(args.file).write())
    return 0
