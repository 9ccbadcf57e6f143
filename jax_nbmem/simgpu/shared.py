"""``shared-setup``: one simulated GPU for every user of a machine (a JupyterHub without GPU).

Root runs it once. It builds the stand-in ``libnvidia-ml.so.1`` readable by all, writes the
state file every user's processes read, lets every user's kernel write its own lines there,
and (when asked) installs the IPython startup file that makes every user's kernels mirror
their JAX arrays onto the one simulated GPU. It prints the environment the spawner gives each
user's server.

The layout under ``DIR``::

    DIR/simgpu-current-HASH/libnvidia-ml.so.1    root's, 0755: loaded by every user's processes
    DIR/state/                                   0777 (not sticky): every writer's own files
    DIR/state/gpu.state                          0644: the GPUs and who holds what
    DIR/state/gpu.state.lock                     0666: writers take turns on it (flock)

Why so: a writer changes its own lines under the lock and replaces the whole file by renaming
its own temporary file over it (readers never see half a file). That needs the folder writable
by all; a sticky folder would refuse the rename over a file another user last wrote. The lock
file must be writable by all so that every writer can take it; taking turns on it is what keeps
one kernel's rewrite from losing another's lines. What this does not do: keep a user from
changing or removing others' lines on purpose (anyone may write the folder). It is a
simulator for demos and tests, not a boundary between users.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

from jax_nbmem.rootfiles import UnsafeFile, lock_file, private_folder, read_regular, write_file
from jax_nbmem.simgpu import registrar
from jax_nbmem.simgpu.simulator import (
    STARTUP_FILE,
    STATE_ENV_VAR,
    SimState,
    StateError,
    build,
    env_for_subprocess,
)
from jax_nbmem.simgpu.simulator import main as simulator_main

__all__ = ["STARTUP_NAME", "SharedSetupError", "parse_total", "setup_shared"]

STARTUP_NAME = "50-jax-nbmem-simgpu.py"
DEFAULT_TOTAL = 150_000_000_000  # a simulated H200, as the single-user demo
_STATE_DIR_MODE = 0o777
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class SharedSetupError(Exception):
    """Bad input or a folder in the way; nothing was changed."""


def parse_total(text: str) -> int:
    """``80GiB``, ``141GB`` or a number of bytes; raises ``ValueError`` for anything else."""
    match = _SIZE.match(text)
    factor = None if match is None else _UNITS.get(match.group(2).lower())
    if match is None or factor is None:
        raise ValueError(f"not a size: {text!r} (e.g. 80GiB, 141GB or 150000000000)")
    value = int(float(match.group(1)) * factor)
    if value <= 0:
        raise ValueError(f"a GPU's total memory must be more than 0, not {text!r}")
    return value


def _check(folder: Path, gpus: int, total: int, startup: Path | None) -> None:
    """Refuse bad input before anything is changed."""
    if gpus < 1 or gpus > 64:
        raise SharedSetupError(f"--gpus must be between 1 and 64, not {gpus}")
    if total <= 0:
        raise SharedSetupError(f"--total must be more than 0 bytes, not {total}")
    if not folder.is_absolute():
        raise SharedSetupError(f"{folder}: give an absolute folder (every user's path to it)")
    for path in (folder, folder / "state"):
        if path.exists() and not path.is_dir():
            raise SharedSetupError(f"{path} exists and is not a folder")
    state = folder / "state" / "gpu.state"
    if os.path.lexists(state):
        try:
            SimState.read(state)
        except StateError as error:
            raise SharedSetupError(f"{error}: fix or remove it first") from None
    if startup is not None:
        target = startup / STARTUP_NAME
        if startup.exists() and not startup.is_dir():
            raise SharedSetupError(f"{startup} exists and is not a folder")
        if os.path.lexists(target) and not _ours_as_is(target):
            raise SharedSetupError(f"{target} exists and is not ours: move it away first")


def setup_shared(
    folder: str | os.PathLike[str],
    gpus: int = 1,
    total: int = DEFAULT_TOTAL,
    startup: str | os.PathLike[str] | None = None,
) -> dict[str, str]:
    """Set up one simulated GPU for all users under ``folder``; return the users' environment.

    An existing state file is kept as it is (who holds what stays), so running it again
    changes nothing. ``startup``: a folder IPython runs startup files from for every user
    (e.g. ``{sys.prefix}/etc/ipython/startup``); the mirror's startup file goes there.
    Raises :class:`SharedSetupError` (having changed nothing) for bad input, ``RuntimeError``
    when the library cannot be built.
    """
    folder = Path(folder)
    startup = None if startup is None else Path(startup)
    _check(folder, gpus, total, startup)
    try:
        # DIR is root's and only root's (every user reaches it): nothing in it is a user's
        # but DIR/state's entries, and those root opens by descriptor (the module's note).
        with private_folder(folder, create=True) as _:
            pass
        lib = build(folder)
        state_dir = folder / "state"
        with private_folder(folder) as parent:
            _state_dir(parent)
        state = state_dir / "gpu.state"
        if not os.path.lexists(state):
            sim = SimState(state)
            for index in range(gpus):
                sim.gpu(index, total=total)
            sim.write()  # a new file of root's renamed over the name: never through a link
        os.close(lock_file(f"{state}.lock", shared_mode=0o666))
        if startup is not None:
            with private_folder(startup, create=True) as _:
                pass
            target = startup / STARTUP_NAME
            if not os.path.lexists(target) or _ours_as_is(target):
                write_file(target, STARTUP_FILE.encode(), mode=0o644)
    except UnsafeFile as error:
        raise SharedSetupError(str(error)) from None
    env = env_for_subprocess(lib.parent, state, base={})
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _state_dir(parent: int) -> None:
    """DIR/state: made if missing, root's own folder, 0777 by ``fchmod`` (never through a link)."""
    try:
        os.mkdir("state", 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    try:
        fd = os.open("state", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=parent)  # fmt: skip
    except OSError as error:
        raise UnsafeFile(error.errno, "the state folder is a link or no folder") from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise UnsafeFile(0, "the state folder is not root's: move it away first")
        os.fchmod(fd, _STATE_DIR_MODE)  # whatever the umask; not sticky (the module's note)
    finally:
        os.close(fd)


def _ours_as_is(target: Path) -> bool:
    """Whether the startup file there is ours, unchanged (then written again, mode 0644)."""
    try:
        return read_regular(target, 1 << 20).decode(errors="replace") == STARTUP_FILE
    except OSError:
        return False


def print_shared_setup(folder: str, gpus: int, total_text: str | None, startup: str | None) -> int:
    """``python -m jax_nbmem.simgpu shared-setup``: do it and print what the spawner needs."""
    try:
        total = DEFAULT_TOTAL if total_text is None else parse_total(total_text)
        env = setup_shared(folder, gpus, total, startup)
    except (SharedSetupError, ValueError, RuntimeError) as error:
        print(f"jax_nbmem simulated GPU: {error} (nothing was changed)", file=sys.stderr)
        return 1
    state = env[STATE_ENV_VAR]
    print(f"# One simulated GPU for every user: state {state}")
    print(f"#   {SimState.read(state).summary()}")
    if startup is None:
        print("# No --startup: kernels do not mirror their JAX arrays onto it.")
    else:
        print(f"# Kernels mirror their JAX arrays: {Path(startup) / STARTUP_NAME}")
    print("# In jupyterhub_config.py:")
    print("c.Spawner.environment.update({")
    for name, value in env.items():
        print(f"    {name!r}: {value!r},")
    print("})")
    print("# In root's shell, for jax-nbmem status:")
    for name, value in env.items():
        print(f"# export {name}={shlex.quote(value)}")
    # Where kernels leave their beacons and the node agent its resolution (docs/containers.md);
    # root's commands read /var/tmp/jax_nbmem with no flag, any other folder through this.
    print("# export JAX_NBMEM_SHARE_DIR=/var/tmp/jax_nbmem")
    return 0


def _add_parser(commands, name: str) -> None:
    """The ``shared-setup`` subcommand's arguments."""
    shared_cmd = commands.add_parser(
        name,
        help="as root, once: one simulated GPU for every user of this machine (a JupyterHub "
        "without GPU): the library, a state file all users' kernels write, the mirror's "
        "startup file (--startup); prints the environment for c.Spawner.environment",
        description="Build the stand-in library into DIR (readable by all), write "
        "DIR/state/gpu.state (kept if there) with its lock file, and with --startup install "
        "the IPython startup file that makes every user's kernels mirror their JAX arrays onto "
        "the one simulated GPU. DIR/state is world-writable and not sticky: every writer "
        "replaces the state file by renaming its own temporary file over it, under the lock "
        "(DIR/state/gpu.state.lock, 0666), so no kernel's rewrite loses another's lines; a "
        "sticky folder would refuse that rename. It does not stop a user from changing others' "
        "lines on purpose: a simulator, not a boundary between users. Running it again "
        "changes nothing; bad input changes nothing.",
    )
    shared_cmd.add_argument("dir", help="an absolute folder every user can reach")
    shared_cmd.add_argument(
        "--gpus", type=int, default=1, help="simulated GPUs in a new state file (default 1)"
    )
    shared_cmd.add_argument(
        "--total",
        default=None,
        metavar="BYTES",
        help="each GPU's memory in a new state file: bytes, or e.g. 80GiB, 141GB "
        "(default 150GB, an H200)",
    )
    shared_cmd.add_argument(
        "--startup",
        default=None,
        metavar="FOLDER",
        help="install the mirror's IPython startup file into FOLDER, one IPython runs for "
        f"every user: {Path(sys.prefix) / 'etc' / 'ipython' / 'startup'} for this Python "
        "(IPython 8 reads PREFIX/etc/ipython/startup beside each user's own profile); "
        "without it, nothing is installed there and kernels do not mirror",
    )


def _run(args) -> int:
    return print_shared_setup(args.dir, args.gpus, args.total, args.startup)


def main(argv: list[str] | None = None) -> int:
    """``python -m jax_nbmem.simgpu``: the simulator's subcommands and ``shared-setup``."""
    extra = {
        "shared-setup": (_add_parser, _run),
        "registrar": (registrar.add_parser, registrar.main_from_args),
    }
    return simulator_main(argv, extra)
