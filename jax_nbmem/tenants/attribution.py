"""Who else is on the GPU: NVML's processes attributed to kernels, notebooks and preallocation.

NVML gives PIDs and bytes; psutil tells what each PID is (its command line, environment and
memory maps, readable for our own user's processes only) and the Jupyter servers tell which
notebook a kernel serves. What cannot be found out stays None, with a ``reason``.
From these records come the warnings: whose preallocation blocks whom, and what to do.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import psutil

from jax_nbmem.allocator.extras import EXTRA_VARIABLES
from jax_nbmem.allocator.jaxlib import MANAGED_VARIABLES, effective
from jax_nbmem.gpu import own_process
from jax_nbmem.node.beacons import Beacon, read_beacons
from jax_nbmem.node.identity import in_initial_namespace, own_identity
from jax_nbmem.node.servers import ServerKernel, current_user, kernel_sessions
from jax_nbmem.tenants.owners import hub_user_of, in_container
from jax_nbmem.tenants.verdicts import ProcessInfo, verdict_from_beacon, verdict_from_outside
from jax_nbmem.text import mask_secrets

if TYPE_CHECKING:
    from jax_nbmem.gpu.nvml import GpuMemory, GpuProcess

# What a process's environment at its start says of its GPU memory: the allocator variables,
# the ones beside them (the collective allocator's size, JAX's client options...) and XLA_FLAGS.
_READ_AT_START = (*MANAGED_VARIABLES, *(name for name, _ in EXTRA_VARIABLES), "XLA_FLAGS")

__all__ = [
    "PID_MAX",
    "own_kernel_id",
    "INFERRED_WITHOUT_AGENT",
    "PID_NAMESPACE_REASON",
    "SessionsOnDemand",
    "Tenant",
    "attribute",
    "inspect_process",
]

# Reasons beginning so mean NVML's PIDs belong to another PID namespace (a container).
PID_NAMESPACE_REASON = "pid-namespace"
# How a row a container inferred without the node agent starts its reason (.containers).
INFERRED_WITHOUT_AGENT = "inferred, not proven (no node agent)"

_KERNEL_ID = re.compile(r"kernel-([0-9A-Za-z_.-]+?)\.json$")
# How a kernel is told its connection file: ipykernel's -f, and the long spellings of it.
_CONNECTION_OPTIONS = ("-f", "--f", "--IPKernelApp.connection_file", "--connection-file")
# Paths that only a process running jaxlib maps (checked against jaxlib 0.10.2 and the CUDA
# plugin package): the jaxlib package's shared objects and the PJRT plugins.
_JAXLIB_MARKERS = ("/jaxlib/", "xla_extension", "/jax_plugins/", "/jax_cuda")
_GPU_DEVICE_MARKER = "/dev/nvidia"
_CMDLINE_CHARS = 120


def _pid_max() -> int:
    """The largest PID this system hands out (Linux's pid_max; 2**31 - 1 elsewhere)."""
    try:
        with open("/proc/sys/kernel/pid_max", encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 2**31 - 1


# A PID above this comes from another PID namespace (NVML reports the host's) or is garbage:
# it is reported as foreign, never looked up (psutil raises OverflowError beyond 2**31).
PID_MAX = _pid_max()


@dataclass(frozen=True)
class Tenant:
    """One process's memory on one GPU, attributed. ``preallocated`` None means cannot tell.

    ``source`` says where the verdict came from: ``beacon`` (the kernel said so itself),
    ``session`` (this very kernel, from its own session: only in its own status),
    ``environment`` (its environment at start and its memory maps), ``memory size`` (its
    insides cannot be read — another user's — and its size matches a preallocated pool), or
    ``unknown``. ``mode`` is its allocator mode as that source knows it (``on (starting)``: its
    beacon, up to a second behind, says not started, but NVML shows that mode's pool); ``jax``
    its JAX counters on this GPU from its beacon (``bytes_in_use``, ``pool_bytes``,
    ``bytes_limit``, ``peak_bytes_in_use``);
    ``idle_source`` is ``beacon`` (since its last finished cell) or ``server`` (its Jupyter
    server's last activity: approximate, widget traffic counts as activity).

    ``pid`` is the host's PID; ``pid_in_container``/``container`` (``name``, ``id``, ``pod``,
    ``namespace``) come from the node agent (None on a plain host). ``source`` may also be
    ``agent`` (proven by the agent) or ``inferred`` (an unproven claim, see ``reason``).
    Not in ``to_dict``: ``pid_here``, its PID in the reader's namespace (None: ``pid``), and
    ``elsewhere``, set when it is in another PID namespace (never inspected nor signalled).
    """

    pid: int
    gpu: int
    used_bytes: int | None
    kind: str
    notebook: str | None
    preallocated: bool | None
    user: str | None = None
    cmdline: str | None = None
    kernel_id: str | None = None
    idle_s: float | None = None
    runs_jax: bool | None = None
    allocator_env: dict | None = None
    started_at: float | None = None
    reason: str | None = None
    server_url: str | None = None
    mode_at_start: str | None = None
    notebook_shown: str | None = None
    source: str = "unknown"
    mode: str | None = None
    jax: dict | None = None
    idle_source: str | None = None
    mode_reason: str | None = None
    hub_user: str | None = None  # its JupyterHub user name (beacon, else environment)
    pid_in_container: int | None = None
    container: dict | None = None
    pid_here: int | None = field(default=None, repr=False)
    elsewhere: bool = field(default=False, repr=False)
    memory_cap_bytes: int | None = None  # its MPS/HAMi cap here (its beacon, or this process's)
    # What ``user`` is (owners.unix_user_text): None, the host's account; in a container its
    # own name there (``container``), its uid there (``uid``) or the host's uid (``host_uid``).
    user_source: str | None = None

    def to_dict(self) -> dict:
        """JSON-ready dict: the fields above by name (less ``pid_here`` and ``elsewhere``)."""
        fields = asdict(self)
        del fields["pid_here"], fields["elsewhere"]
        return fields


def shown_notebook(path: str | None, user: str | None) -> str | None:
    """A notebook's path as people read it: under its owner's home, ``~/...`` or ``~alice/...``.

    The reader's own home is ``~/``, another user's ``~name/``; a path elsewhere stays as is.

    A Jupyter server shows paths relative to its root (usually that home), which wins when
    it is known; this is for paths from a kernel's own environment or beacon.
    """
    if not path or not os.path.isabs(path):
        return path
    try:
        home = os.path.expanduser(f"~{user}") if user else os.path.expanduser("~")
    except (KeyError, RuntimeError):
        return path
    if home and home != "/" and path.startswith(home.rstrip("/") + "/"):
        whose = user if user and user != current_user() else ""
        return f"~{whose}/" + path[len(home.rstrip("/")) + 1 :]
    return path


def inspect_process(
    pid: int,
    *,
    own_pid: int,
    server_sessions=None,
    own_environ: Mapping[str, str] | None = None,
) -> ProcessInfo:
    """Find out what ``pid`` is; never raises.

    ``server_sessions`` maps kernel ids to :class:`~jax_nbmem.node.servers.ServerKernel`
    (anything with ``.get``; with ``.for_pid`` too, a PID its server names as a kernel is that
    kernel whatever its command line says); a server's notebook path wins over
    ``JPY_SESSION_NAME``, which keeps the name the notebook had when its kernel started.
    ``own_environ`` stands for our own environment, which ``%jaxalloc`` may have changed since
    the process started.
    """
    if not 0 < pid <= PID_MAX:
        return ProcessInfo(
            pid, "unknown", reason=f"PID outside this system's range (1 to {PID_MAX})"
        )
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return ProcessInfo(pid, "unknown", reason="zombie: exited, not yet reaped")
            user, started_at, args = proc.username(), proc.create_time(), proc.cmdline()
    except psutil.ZombieProcess:
        return ProcessInfo(pid, "unknown", reason="zombie: exited, not yet reaped")
    except psutil.NoSuchProcess:
        return ProcessInfo(pid, "unknown", reason="exited, or not in this PID namespace")
    except (psutil.AccessDenied, KeyError):  # KeyError: a uid without a name
        return ProcessInfo(pid, "unknown", reason="access denied (another user's process)")
    # A kernel runs a kernel program *and* was given a connection file: `tail -f
    # kernel-1.json` is no kernel, nor is `pip install ipykernel`.
    connection_file = _connection_file(args) if _runs_ipykernel(args) else None
    kernel_id = _kernel_id(connection_file)
    kind = "self" if pid == own_pid else "kernel" if connection_file else "process"
    problems = []
    if kind == "self" and own_environ is not None:
        environ = own_environ
    else:
        environ = _read(proc.environ, "environment", problems)
    maps = _read(lambda: _memory_map_paths(proc), "memory maps", problems)
    runs_jax = maps is not None and any(m in maps for m in _JAXLIB_MARKERS)
    if kind == "self":  # our own modules tell it without reading the maps
        runs_jax = "jaxlib" in sys.modules
    elif maps is None:
        runs_jax = None
    session: ServerKernel | None = None
    if kernel_id is not None and server_sessions is not None:
        session = server_sessions.get(kernel_id)
    by_pid = getattr(server_sessions, "for_pid", None)
    if session is None and by_pid is not None and (session := by_pid(pid)) is not None:
        # Its server says this PID is one of its kernels, whatever its command line shows.
        kernel_id = session.kernel_id
        kind = "kernel" if kind == "process" else kind
    notebook = session.notebook if session is not None else None
    if notebook is None and environ is not None:
        notebook = environ.get("JPY_SESSION_NAME") or None
    shown = session.path if session is not None and session.path else None
    allocator_env = (
        None if environ is None else {k: environ[k] for k in _READ_AT_START if k in environ}
    )
    mode_at_start = None
    if allocator_env is not None and kind != "self" and runs_jax:
        mode_at_start = effective(allocator_env).mode_name
    return ProcessInfo(
        pid=pid,
        kind=kind,
        user=user,
        cmdline=_short_cmdline(args),
        kernel_id=kernel_id,
        notebook=notebook,
        notebook_shown=shown or shown_notebook(notebook, user),
        idle_s=session.idle_s() if session is not None else None,
        runs_jax=runs_jax,
        allocator_env=allocator_env,
        started_at=started_at,
        reason="; ".join(problems) or None,
        server_url=session.server_url if session is not None else None,
        gpu_device_open=None if maps is None else _GPU_DEVICE_MARKER in maps,
        mode_at_start=mode_at_start,
        hub_user=hub_user_of(environ),
    )


def _read(getter, what: str, problems: list[str]):
    try:
        return getter()
    except psutil.AccessDenied:
        problems.append(f"{what} not readable (another user's process)")
    except psutil.Error as exc:
        problems.append(f"{what} not readable ({type(exc).__name__})")
    except OSError as exc:
        problems.append(f"{what} not readable ({exc.strerror or type(exc).__name__})")
    return None


def _memory_map_paths(proc: psutil.Process) -> str:
    # /proc/PID/maps is read in microseconds; psutil's memory_maps() parses the much larger
    # smaps file, so it serves only where /proc is missing.
    try:
        with open(f"/proc/{proc.pid}/maps", encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        if os.path.isdir(f"/proc/{os.getpid()}"):
            raise psutil.NoSuchProcess(proc.pid) from None
        return "\n".join(m.path for m in proc.memory_maps(grouped=True))
    except PermissionError:
        raise psutil.AccessDenied(proc.pid) from None


def _kernel_id(connection_file: str | None) -> str | None:
    """The kernel id in Jupyter's ``kernel-<id>.json`` file name, if it is named so."""
    match = _KERNEL_ID.search(connection_file) if connection_file else None
    return match.group(1) if match else None


def kernel_id_of(connection_file: str | None) -> str | None:
    """The kernel id a connection file's name says (``kernel-<id>.json``), else None."""
    return _kernel_id(connection_file)


def own_kernel_id(argv: Sequence[str]) -> str | None:
    """This process's kernel id, when it is a Jupyter kernel started with its connection file."""
    return _kernel_id(_connection_file(argv)) if _runs_ipykernel(["python", *argv]) else None


def _connection_file(args: Sequence[str]) -> str | None:
    """The connection file a kernel's command line names (``-f FILE``, ``--f=FILE``, ...)."""
    for before, arg in zip(["", *args], args, strict=False):
        if before in _CONNECTION_OPTIONS and arg:
            return arg
        name, equals, value = arg.partition("=")
        if equals and name in _CONNECTION_OPTIONS and value:
            return value
    return None


def _runs_ipykernel(args: Sequence[str]) -> bool:
    # `python -m ipykernel_launcher`, `-m ipykernel`, the launcher's path or `ipython kernel`:
    # not `pip install ipykernel`, nor a script in a folder named so.
    for before, arg in zip(["", *args], args, strict=False):
        if before == "-m" and arg in ("ipykernel", "ipykernel_launcher"):
            return True
        if arg.endswith("/ipykernel_launcher.py"):
            return True
        if arg == "kernel" and os.path.basename(before) in ("ipython", "ipython3"):
            return True
    return False


def _short_cmdline(args: Sequence[str]) -> str:
    if not args:
        return ""
    # Tokens, passwords and the kernel's signing key never leave this function; newlines and
    # runs of spaces (a `python -c` script) would break a one-line display.
    shown = mask_secrets([os.path.basename(args[0]), *args[1:]])
    text = " ".join(" ".join(shown).split())
    return text if len(text) <= _CMDLINE_CHARS else text[: _CMDLINE_CHARS - 1] + "…"


class SessionsOnDemand:
    """Asks the Jupyter servers only when a kernel is actually found on the GPU."""

    def __init__(self) -> None:
        self._index = None

    def get(self, kernel_id: str) -> ServerKernel | None:
        """The server's record of ``kernel_id`` (None: no server knows it)."""
        if self._index is None:
            self._index = kernel_sessions()
        return self._index.get(kernel_id)


def attribute(
    processes: Iterable[GpuProcess],
    gpus: Iterable[GpuMemory],
    *,
    own_pid: int | None = None,
    environ: Mapping[str, str] | None = None,
    sessions=None,
    own_on_gpu: bool | None = None,
    check_device_files: bool | None = None,
    beacons: Mapping[int, Beacon] | None = None,
    resolution=None,
    dirs: Sequence[str] | None = None,
    identity: Mapping | None = None,
) -> list[Tenant]:
    """Attribute NVML's GPU processes; one :class:`Tenant` per (PID, GPU). Never raises.

    A process with a trusted beacon (``beacons``, default: :func:`read_beacons` of these PIDs)
    is judged by what it says of itself: its mode in effect, its pool, its idleness.

    ``own_pid``/``environ`` default to this process and ``os.environ``. ``sessions`` (kernel id
    → :class:`~jax_nbmem.node.servers.ServerKernel`, e.g. a ``SessionIndex``) defaults to asking
    the running Jupyter servers, once, if a kernel is found. When NVML's PIDs evidently come
    from another PID namespace (see :func:`_foreign_namespace`), every tenant is "unknown" with
    a reason starting with ``PID_NAMESPACE_REASON`` rather than attributed to the wrong process.
    ``own_on_gpu`` says this kernel holds GPU memory itself (None: unknown);
    ``check_device_files`` (default: when ``/dev/nvidiactl`` exists here) checks that listed
    processes have an NVIDIA device file mapped.

    ``resolution``: the node agent's (names its processes while fresh); ``identity``
    (default: ours) says whether this runs in a container, where NVML's host PIDs are never
    looked up: :func:`.containers.from_container` attributes them; ``dirs``: beacons' place.
    """
    own_pid = own_process.nvml_pid() if own_pid is None else own_pid  # None: unknown
    environ = os.environ if environ is None else environ
    sessions = SessionsOnDemand() if sessions is None else sessions
    if check_device_files is None:
        check_device_files = os.path.exists("/dev/nvidiactl")
    processes = list(processes)
    gpus = list(gpus)
    identity = own_identity() if identity is None else identity
    if in_initial_namespace(identity) is False:  # host PIDs: never looked up here
        reason = f"{PID_NAMESPACE_REASON}: this process runs in a container; see .containers"
        return [Tenant(p.pid, p.gpu, p.used_bytes, "unknown", None, None, reason=reason,
                       elsewhere=True) for p in processes]  # fmt: skip
    fresh = resolution is not None and resolution.fresh
    totals = {gpu.index: gpu.total_bytes for gpu in gpus}
    uuids = {gpu.index: gpu.uuid for gpu in gpus}
    if beacons is None:
        try:
            beacons = read_beacons(dirs, pids=[process.pid for process in processes])
        except Exception:  # never fatal: without beacons, judge as before
            beacons = {}
    # On the host: the processes in containers that the node agent resolved.
    resolved = {p.pid: resolution.get(p.pid) for p in processes} if fresh else {}
    proven = {pid: e for pid, e in resolved.items() if e and e.pid_in_container is not None}
    infos = _inspect_each(processes, own_pid, sessions, environ)
    # PIDs the node agent resolved are the host's, whatever else says: only the others count.
    unresolved = {pid: info for pid, info in infos.items() if not resolved.get(pid)}
    foreign = _foreign_namespace(unresolved, own_pid, own_on_gpu, check_device_files)
    if foreign is not None:
        reason = f"{PID_NAMESPACE_REASON}: {foreign}"
        infos = {pid: ProcessInfo(pid, "unknown", reason=reason) if pid in unresolved else info
                 for pid, info in infos.items()}  # fmt: skip
    tenants = []
    for process in processes:
        beacon = beacons.get(process.pid) if foreign is None else None
        entry = proven.get(process.pid)
        total, uuid = totals.get(process.gpu), uuids.get(process.gpu)
        tenants.append(_tenant(process, infos[process.pid], beacon, entry, total, uuid))
    return tenants


def _inspect_each(
    processes: list[GpuProcess], own_pid: int | None, sessions, environ: Mapping[str, str]
) -> dict[int, ProcessInfo]:
    """What the host says of each process (once per PID); a surprise becomes a reason."""
    infos: dict[int, ProcessInfo] = {}
    for process in processes:
        if process.pid not in infos:
            try:
                infos[process.pid] = inspect_process(
                    process.pid, own_pid=own_pid, server_sessions=sessions, own_environ=environ
                )
            except Exception as exc:  # the sampler calls this: a surprise becomes a reason
                reason = f"inspection failed: {type(exc).__name__}"
                infos[process.pid] = ProcessInfo(process.pid, "unknown", reason=reason)
    return infos


def _tenant(
    process: GpuProcess, info: ProcessInfo, beacon, entry, total: int | None, uuid: str | None
) -> Tenant:
    """One process on one GPU: by its beacon (or the agent's proof of it), else from outside.

    ``entry`` is the node agent's, for a process in a container.
    """
    fields = {k: v for k, v in vars(info).items() if k != "gpu_device_open"}
    if beacon is None and entry is not None and entry.kernel is not None:
        beacon = entry.kernel  # a kernel in a container, as the node agent proved it
    if beacon is not None:
        verdict = verdict_from_beacon(beacon, process.used_bytes, total, uuid)
        if entry is not None and beacon is entry.kernel:
            verdict["source"] = "agent"
        if verdict["idle_s"] is None and info.idle_s is not None:
            # No cell has finished there yet: its server's last activity is all there is.
            verdict.update(idle_s=info.idle_s, idle_source="server")
    else:
        verdict = verdict_from_outside(info, process.used_bytes, total)
    if info.server_url is not None and info.notebook_shown:
        # Its Jupyter server names its notebook, as that server shows it (relative to its
        # root, after renames): the name every view of this server uses. The beacon's is
        # a full path, from the same server or from the kernel's start.
        verdict.pop("notebook", None)
    fields.update(verdict)
    if "notebook" in verdict:  # the kernel named its notebook itself
        fields["notebook_shown"] = shown_notebook(verdict["notebook"], fields.get("user"))
    if entry is not None:
        fields.update(pid_in_container=entry.pid_in_container, container=entry.shown_container)
        if entry.container is not None:  # never the host's account name for a container's uid
            fields.update(in_container(fields, entry.user, entry.user_source, process.pid))
    return Tenant(gpu=process.gpu, used_bytes=process.used_bytes, **fields)


def _foreign_namespace(
    infos: Mapping[int, ProcessInfo],
    own_pid: int | None,
    own_on_gpu: bool | None,
    check_device_files: bool,
) -> str | None:
    """Why NVML's PIDs cannot be ours, or None when nothing says so.

    NVML reports host PIDs. In a container without the host's PID namespace they either do not
    exist here, or name unrelated processes: we then see none of them exist, or miss our own
    PID while we hold GPU memory, or find that none of them has an NVIDIA device file mapped
    (which every CUDA process has).
    """
    if not infos:
        return None
    if not any(0 < pid <= PID_MAX and psutil.pid_exists(pid) for pid in infos):
        pids = ", ".join(str(pid) for pid in sorted(infos))
        return f"none of NVML's PIDs ({pids}) exists in this PID namespace"
    if own_on_gpu and own_pid is not None and own_pid not in infos:
        return f"this kernel uses the GPU but NVML does not list its PID {own_pid}"
    inspected = [info for info in infos.values() if info.gpu_device_open is not None]
    if check_device_files and inspected and not any(i.gpu_device_open for i in inspected):
        return f"PID {inspected[0].pid} ({inspected[0].cmdline}) has no NVIDIA device open"
    return None
