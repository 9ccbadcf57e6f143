"""Beacons: each kernel running jax_nbmem says what it knows of itself, in a small JSON file.

Another kernel can read a process's environment only as it was at its start, not at all for
another user, and cannot tell widget traffic from work. The kernel itself knows its mode in
effect, its pool and when its last cell finished. :class:`BeaconWriter` keeps that in
``jax_nbmem-beacon-<pid>.json`` (rewritten on change, at most once a second, atomically;
removed at unload and at exit); :func:`read_beacons` gives the beacons a reader can trust.
In a container (a PID namespace that is not the host's) the name is
``jax_nbmem-beacon-<ns inode>-<pid>.json``, and the content says the kernel's ``identity``
(:mod:`.identity`); a name another user took first is replaced by an unpredictable one that
readers find too (:mod:`.beacon_files`). Beside it the writer holds an alive lock for the
kernel's life (:mod:`.alive`), and sends each beacon to the node agent, where one listens
(:mod:`jax_nbmem.node.agent_client`). Beacons of other namespaces are claims (:mod:`.neighbours`).

Where: the user's Jupyter runtime directory, so the user's own kernels, CLI and server see each
other; on a shared node, also the directory an admin names (``c.JaxNbMem.share_dir`` or
``$JAX_NBMEM_SHARE_DIR``, e.g. a sticky world-writable folder), where every user's kernels
write. A beacon holds no secret: no token, no environment, no cell source (mode and allocator
variables only), and is world-readable (0644).

A reader trusts a beacon only when it can check it: the PID is alive with the start time the
beacon states, its file bears that PID's name, and the file's owner is that process's owner
(nobody can speak for another's process). Anyone can write anything in a shared directory, so
whatever else is there must neither crash, slow nor mislead a reader: a status opens only the
beacons of the PIDs it looks at, by name, and never lists the directory; symlinks, FIFOs,
directories, oversized files and malformed content of any shape (nesting too deep to parse,
numbers beyond a float, wrong types, text that is not UTF-8) are skipped, never fatal.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil
from jupyter_core.paths import jupyter_runtime_dir

from jax_nbmem.gpu import own_process
from jax_nbmem.node import beacon_files as _files
from jax_nbmem.node.agent_client import AgentClient
from jax_nbmem.node.agent_client_tcp import network_client
from jax_nbmem.node.alive import AliveLock
from jax_nbmem.node.beacon_files import BEACON_PREFIX, BEACON_SUFFIX
from jax_nbmem.node.fields import strict_count, strict_number, strict_text
from jax_nbmem.node.identity import beacon_key, own_identity, same_namespace
from jax_nbmem.node.sharedir import find_share_dir

__all__ = [
    "MAX_PIDS",
    "SCHEMA",
    "START_SLACK_S",
    "Beacon",
    "BeaconWriter",
    "beacon_dirs",
    "beacon_from",
    "listed_keys",
    "parse_beacon_file",
    "read_beacons",
    "read_small_file",
    "write_atomically",
]

log = logging.getLogger("jax_nbmem")

SCHEMA = 1
# A beacon's start time and the process's may differ by the rounding of /proc's clock ticks.
START_SLACK_S = 1.0
_MAX_KEY_CHARS = 256
# More processes than any GPU node runs: what one look at the beacons reads at most.
MAX_PIDS = 1024
_WRITE_EVERY_S = 1.0
read_small_file = _files.read_small_file  # where it always was


@dataclass(frozen=True)
class Beacon:
    """What one kernel said of itself. ``mode_in_effect`` is None until its backend starts.

    ``pool_fraction`` is the share of the GPU its mode takes as a pool at the first allocation
    (0 for none; None when not modelled or not known); ``gpus`` maps GPU UUIDs to JAX's
    counters there (``bytes_in_use``, ``pool_bytes``, ``bytes_limit``, ``peak_bytes_in_use``).
    """

    pid: int
    started_at: float
    user: str | None
    kernel_id: str | None
    notebook: str | None
    mode_requested: str | None
    mode_in_effect: str | None
    pool_fraction: float | None
    gpus: Mapping[str, Mapping[str, int | None]]
    cell_running: bool
    last_cell_finished_at: float | None
    written_at: float
    jax: str | None = None
    jaxlib: str | None = None
    jax_nbmem: str | None = None
    variables: Mapping[str, str] = field(default_factory=dict)
    path: str | None = None
    mode_reason: str | None = None  # why `auto` chose its mode
    hub_user: str | None = None  # its JupyterHub user name ($JUPYTERHUB_USER), if any
    # What it claims of itself across PID namespaces (see jax_nbmem.node.identity): pid_ns,
    # pid_in_ns, start_ticks, boot_id, hostname; None from a kernel that does not say.
    identity: Mapping[str, Any] | None = None
    # Its MPS or HAMi memory cap by GPU UUID, as the kernel reads its own environment.
    memory_caps: Mapping[str, int] = field(default_factory=dict)
    # Before its JAX starts: the UUIDs of the GPUs it will make its pool on (None: not said).
    pool_gpus: tuple[str, ...] | None = None

    def idle_s(self, now: float | None = None) -> float | None:
        """Seconds since its last cell finished; 0 while one runs; None before the first."""
        if self.cell_running:
            return 0.0
        if self.last_cell_finished_at is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.last_cell_finished_at)

    @property
    def mode(self) -> str:
        """The mode in effect, or the one its backend will start with."""
        if self.mode_in_effect is not None:
            return self.mode_in_effect
        return f"not started ({self.mode_requested or 'on'} when it starts)"


def beacon_dirs(
    share_dir: str | None = None, environ: Mapping[str, str] | None = None
) -> list[str]:
    """Where beacons are: the user's Jupyter runtime directory, and the shared one if any.

    ``share_dir`` is the one a face found (:func:`~.sharedir.find_share_dir`); None: the one
    ``environ`` (default: this process's) names, if any.
    """
    dirs = []
    try:
        dirs.append(jupyter_runtime_dir())
    except Exception:  # a broken Jupyter install leaves the shared directory
        log.debug("jax_nbmem: no Jupyter runtime directory", exc_info=True)
    shared = find_share_dir(share_dir, environ, default=None).path
    if shared and shared not in dirs:
        dirs.append(shared)
    return dirs


class BeaconWriter:
    """Keeps this process's beacon current on a daemon thread; ``close()`` removes it.

    ``facts()`` returns the beacon's content as a dict (without ``written_at``); it is asked
    once a second, and the file rewritten only when the answer changed. It is written to each
    of ``directories`` (the runtime directory and the shared one, when there is one, so that
    a reader that knows only one of them still finds it). Never raises.
    """

    def __init__(
        self,
        facts: Callable[[], dict],
        directories: str | Iterable[str],
        *,
        key: str | None = None,
        agent_socket: str | None = None,
    ) -> None:
        self._facts = facts
        if isinstance(directories, str):
            directories = [directories]
        directories = list(dict.fromkeys(directories))
        # In the host's PID namespace `<pid>`, in a container `<ns inode>-<pid>` (identity).
        self.key = beacon_key() if key is None else key
        name = f"{BEACON_PREFIX}{self.key}{BEACON_SUFFIX}"
        self.paths = [os.path.join(d, name) for d in directories]
        if not self.paths:
            raise ValueError("a beacon needs at least one directory")
        self.path = self.paths[0]
        # Held for the kernel's life beside each copy: how anyone, in any container, tells
        # that it still runs (jax_nbmem.node.alive).
        self.alive = AliveLock(directories, self.key)
        # The node agent: over the share directory's socket, else at the network address the
        # environment names (a pod on Kubernetes), else none.
        self.agent = AgentClient(agent_socket) if agent_socket else network_client()
        self._last: dict | None = None
        self._content: dict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        # Writing and removing exclude each other, and nothing is written once removed: at
        # exit the thread still runs (a daemon) while later exit handlers take their time.
        self._lock = threading.Lock()
        self._discarded = False

    def start(self) -> None:
        """Start the thread (a running one is reused) and remove the file at exit."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._discarded = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jax_nbmem-beacon", daemon=True)
        self._thread.start()
        atexit.register(self.discard)

    def close(self) -> None:
        """Stop the thread and remove the beacon; a second call is a no-op."""
        self.discard()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)
        atexit.unregister(self.discard)

    def discard(self) -> None:
        """Remove the beacon now and write it no more (until `start`); for any exit, any thread.

        It waits for a write under way (at most a second: a hung shared directory must not
        hold up the process's exit), never for the thread.
        """
        self._stop.set()
        locked = self._lock.acquire(timeout=1.0)
        try:
            self._discarded = True
            self._remove()
            self.alive.release()
            if self.agent is not None:
                self.agent.close()  # the agent forgets the registration
        finally:
            if locked:
                self._lock.release()

    def write_now(self) -> bool:
        """Write the beacon if its facts changed; whether it was written anywhere."""
        try:
            facts = self._facts()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.debug("jax_nbmem: beacon facts failed", exc_info=True)
            return False
        with self._lock:
            if self._discarded:
                return False
            self.alive.hold()  # before the first write: a beacon without its lock is dead
            if facts == self._last:
                return False
            content, errors = {**facts, "written_at": time.time()}, []
            for number, path in enumerate(self.paths):
                try:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    if _files.taken_by_another(path):  # squatted: a name readers find too
                        path = _files.fallback_path(path, self.key)
                        self.paths[number] = path
                    write_atomically(path, content)
                except (OSError, TypeError, ValueError) as exc:  # unwritable, or not JSON
                    errors.append(f"cannot write {path}: {getattr(exc, 'strerror', None) or exc}")
            self.last_error = "; ".join(errors) or None
            if len(errors) == len(self.paths):
                return False
            self._last, self._content = facts, content
            return True

    def _run(self) -> None:
        while not self._stop.is_set():
            written = self.write_now()
            if self.agent is not None and not self._stop.is_set():
                try:
                    content = self._content
                    if written and content is not None:
                        self.agent.send(content)
                    else:  # the agent restarted: register again (at most every 5 s)
                        self.agent.keep_alive(content)
                    proven = self.agent.proven_pid
                    if proven is not None and not own_process.in_host_namespace():
                        # This process's host PID, proven: what NVML lists it by. A live
                        # process keeps it, so a dropped connection does not unprove it.
                        own_process.set_proven_pid(proven)
                except Exception:  # never on a cell's path, never fatal
                    log.debug("jax_nbmem: the node agent's client failed", exc_info=True)
            self._stop.wait(_WRITE_EVERY_S)

    def _remove(self) -> None:
        for path in self.paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._last = self._content = None


def write_atomically(path: str, content: Mapping[str, Any] | str, mode: int = 0o644) -> str:
    """Write ``content`` (or its JSON text) at ``path``, mode 0644, atomically; returns the path.

    A temporary file in the same folder renamed over ``path``, so a reader never sees half of
    it. Beacons, publishers' files, the agent's resolution and the culler's notices and counts
    are all written so: others may read them, none holds a secret. ``mode`` 0600: a file for
    its owner only (the agent's resolution with every name).
    """
    directory = os.path.dirname(path)
    text = content if isinstance(content, str) else json.dumps(content)
    fd, partial = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), mode)
            out.write(text)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise
    return path


def read_beacons(
    dirs: Iterable[str] | None = None, pids: Iterable[int] | None = None
) -> dict[int, Beacon]:
    """The beacons in ``dirs`` (default: :func:`beacon_dirs`) that can be trusted, by PID.

    Only beacons of processes in the reader's own PID namespace, whose PIDs it can check:
    those named ``jax_nbmem-beacon-<PID>.json`` in the host's namespace, and
    ``jax_nbmem-beacon-<ns inode>-<PID>.json`` (its own inode) in a container. Beacons from
    other namespaces are claims, read by :func:`jax_nbmem.node.neighbours.read_claims`.

    With ``pids`` (e.g. the processes NVML lists), only those PIDs' beacons are opened, by
    name: the directories are not even listed, so nothing anyone else leaves there costs a
    status anything (at most ``MAX_PIDS`` PIDs are asked for). Without, each directory is
    listed and only the beacons of live PIDs are opened. Either way a file is read only if
    it is a regular file of at most 64 KiB, and its parsed form is reused while its inode,
    size and modification time stay the same.

    Never raises: a file that cannot be read, parsed or trusted is left out.
    """
    found: dict[int, Beacon] = {}
    wanted = None if pids is None else _pid_list(pids)
    own = own_identity()
    for directory in beacon_dirs() if dirs is None else dirs:
        if not isinstance(directory, str) or not directory:
            continue
        squatted: dict[str, int] = {}
        for pid in _listed_pids(directory, own) if wanted is None else wanted:
            key = beacon_key({**own, "pid_in_ns": pid})
            path = os.path.join(directory, f"{BEACON_PREFIX}{key}{BEACON_SUFFIX}")
            beacon = _read_one(path, pid, own)
            if beacon is None and os.path.lexists(path):  # its name taken: has it a fallback?
                squatted[key] = _files.owner_of(pid)
            _keep(found, beacon)
        for key, paths in (_files.fallbacks(directory, squatted) if squatted else {}).items():
            pid = int(key.rpartition("-")[2])
            for path in paths:
                _keep(found, _read_one(path, pid, own))
    return found


def _keep(found: dict[int, Beacon], beacon: Beacon | None) -> None:
    if beacon is not None and (
        beacon.pid not in found or beacon.written_at > found[beacon.pid].written_at
    ):
        found[beacon.pid] = beacon


def _pid_list(pids: Iterable[int]) -> list[int]:
    """The distinct, plausible PIDs among ``pids``, at most ``MAX_PIDS`` of them."""
    chosen: dict[int, None] = {}
    for pid in pids:
        if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2**31:
            chosen[pid] = None
            if len(chosen) >= MAX_PIDS:
                break
    return list(chosen)


def listed_keys(directory: str) -> list[tuple[str, int | None, int]]:
    """Every beacon name in ``directory``, as (key, namespace inode or None, PID); listing only.

    A name without an inode (``<PID>``) is a kernel's in the host's PID namespace (or one that
    could not read its own); names that are not spelled as a writer spells them are skipped.
    """
    try:
        names = os.listdir(directory)
    except (OSError, ValueError):  # missing, not a directory, or a NUL in its name
        return []
    keys = []
    for name in names:
        if not (name.startswith(BEACON_PREFIX) and name.endswith(BEACON_SUFFIX)):
            continue
        key = name[len(BEACON_PREFIX) : -len(BEACON_SUFFIX)]
        ino, dash, digits = key.rpartition("-")
        if not _is_pid(digits) or (dash and not _is_pid(ino, limit=2**64)):
            continue
        keys.append((key, int(ino) if dash else None, int(digits)))
    return keys


def _listed_pids(directory: str, own: Mapping[str, Any]) -> list[int]:
    """PIDs of live processes of the reader's namespace with a beacon in ``directory``."""
    pids = []
    for key, _, pid in listed_keys(directory):
        if key != beacon_key({**own, "pid_in_ns": pid}):
            continue  # another namespace's
        if psutil.pid_exists(pid):  # a name for a dead PID is not opened
            pids.append(pid)
            if len(pids) >= MAX_PIDS:
                break
    return pids


def _is_pid(digits: str, limit: int = 2**31) -> bool:
    # As the writer spells it: ASCII digits, no sign, no leading zero, within a PID's range
    # (an inode's, with ``limit``).
    return (
        0 < len(digits) <= 20
        and digits.isascii()
        and digits.isdigit()
        and digits[0] != "0"
        and int(digits) < limit
    )


# Parsed beacons by path, with the (device, inode, size, mtime, ctime, owner) they were parsed
# from. A rewrite is a new file (written aside, then renamed), at most once a second: parsed
# again. The file is read each time all the same (one read of at most 64 KiB): what is saved
# is the parse.
_parsed: dict[str, tuple[tuple, Beacon | None]] = {}
_PARSED_MAX = 4096


def parse_beacon_file(path: str) -> tuple[Beacon, os.stat_result] | None:
    """The well-formed beacon at ``path`` and its file's ``fstat``, trusted or not; or None.

    Its parse is reused while the file stays the same. Never raises.
    """
    found = read_small_file(path)
    if found is None:
        return None
    data, info = found
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns,
           info.st_uid)  # fmt: skip
    cached = _parsed.get(path)
    if cached is not None and cached[0] == key:
        beacon = cached[1]
    else:
        beacon = _parse(data, path)
        if len(_parsed) >= _PARSED_MAX:
            _parsed.clear()
        _parsed[path] = (key, beacon)
    return None if beacon is None else (beacon, info)


def _read_one(path: str, pid: int, own: Mapping[str, Any]) -> Beacon | None:
    """The beacon at ``path`` if it is well formed, speaks for ``pid`` and can be trusted."""
    found = parse_beacon_file(path)
    if found is None:
        return None
    beacon, info = found
    if beacon.pid != pid or not _vouched_for(beacon, info.st_uid):
        return None
    claimed = (beacon.identity or {}).get("pid_ns")
    if claimed is not None and own.get("pid_ns") and not same_namespace(claimed, own["pid_ns"]):
        return None  # it says it lives in another namespace: its PID is not ours to check
    return beacon


def _parse(data: bytes, path: str) -> Beacon | None:
    """The beacon in ``data``, or None for anything malformed, whatever its shape."""
    try:
        # Any user can write any bytes here: nesting too deep for the parser (RecursionError),
        # numbers too big for a float (OverflowError), bytes that are no text (ValueError)...
        # whatever the failure, the file is simply no beacon.
        return _beacon_from(json.loads(data), path)
    except Exception:
        log.debug("jax_nbmem: malformed beacon %s", path, exc_info=True)
        return None


def beacon_from(content: Any, where: str) -> Beacon | None:
    """A beacon from its parsed content (e.g. the node agent's copy); None when malformed."""
    try:
        return _beacon_from(content, where)
    except Exception:  # whatever shape anyone gave it
        log.debug("jax_nbmem: malformed beacon in %s", where, exc_info=True)
        return None


def _beacon_from(content: Any, path: str) -> Beacon | None:
    if not isinstance(content, dict) or content.get("schema") != SCHEMA:
        return None
    pid, started_at = content.get("pid"), strict_number(content.get("started_at"))
    if not isinstance(pid, int) or isinstance(pid, bool) or started_at is None:
        return None
    gpus = content.get("gpus") or {}
    if not isinstance(gpus, dict):
        return None
    variables = content.get("variables") or {}
    fraction = strict_number(content.get("pool_fraction"))
    finished = strict_number(content.get("last_cell_finished_at"))
    if finished is not None and not 0 < finished <= time.time() + 60:
        finished = None  # before 1970 or in the future: no time it can know
    return Beacon(
        pid=pid,
        started_at=started_at,
        user=strict_text(content.get("user")),
        kernel_id=strict_text(content.get("kernel_id")),
        notebook=strict_text(content.get("notebook")),
        mode_requested=strict_text(content.get("mode_requested")),
        mode_in_effect=strict_text(content.get("mode_in_effect")),
        # A share of the GPU: a pool larger than the GPU is no pool anyone can model.
        pool_fraction=fraction if fraction is not None and 0 <= fraction <= 1 else None,
        gpus={
            uuid: {
                key: strict_count(value)
                for key, value in counters.items()
                if strict_text(key, _MAX_KEY_CHARS) is not None
            }
            for uuid, counters in gpus.items()
            if isinstance(counters, dict) and strict_text(uuid, _MAX_KEY_CHARS) is not None
        },
        cell_running=content.get("cell_running") is True,
        last_cell_finished_at=finished,
        written_at=strict_number(content.get("written_at")) or 0.0,
        jax=strict_text(content.get("jax")),
        jaxlib=strict_text(content.get("jaxlib")),
        jax_nbmem=strict_text(content.get("jax_nbmem")),
        variables={
            key: value
            for key, value in (variables.items() if isinstance(variables, dict) else ())
            if strict_text(key, _MAX_KEY_CHARS) is not None and strict_text(value) is not None
        },
        mode_reason=strict_text(content.get("mode_reason")),
        hub_user=strict_text(content.get("hub_user")),
        identity=_identity(content.get("identity")),
        memory_caps=_caps(content.get("memory_caps")),
        pool_gpus=_uuids(content.get("pool_gpus")),
        path=path,
    )


def _identity(value: Any) -> dict[str, Any] | None:
    """A beacon's ``identity``, each claim kept only in its type; None when it is no object."""
    if not isinstance(value, dict):
        return None
    ns = value.get("pid_ns")
    ns_ok = isinstance(ns, list) and len(ns) == 2 and all(strict_count(v) is not None for v in ns)
    pid = strict_count(value.get("pid_in_ns"))
    return {
        "pid_ns": list(ns) if ns_ok else None,
        "pid_in_ns": pid if pid is not None and 0 < pid < 2**31 else None,
        "start_ticks": strict_count(value.get("start_ticks")),
        "boot_id": strict_text(value.get("boot_id"), 64),
        "hostname": strict_text(value.get("hostname"), 255),
    }


def _vouched_for(beacon: Beacon, owner_uid: int) -> bool:
    """Whether the process is alive, is the one that wrote it, and belongs to the file's owner."""
    try:
        process = psutil.Process(beacon.pid)
        if abs(process.create_time() - beacon.started_at) > START_SLACK_S:
            return False  # the PID was recycled: another process now
        return process.uids().real == owner_uid
    except (psutil.Error, OverflowError, ValueError):
        return False


def _caps(value: Any) -> dict[str, int]:
    """A beacon's ``memory_caps`` (GPU UUID → bytes), what of it is well-formed."""
    if not isinstance(value, dict):
        return {}
    caps = {}
    for uuid, size in value.items():
        size = strict_count(size)
        if strict_text(uuid, _MAX_KEY_CHARS) is not None and size:
            caps[uuid] = size
    return caps


def _uuids(value: Any) -> tuple[str, ...] | None:
    """A beacon's ``pool_gpus``: a list of GPU UUIDs, else None (not said, or malformed)."""
    if not isinstance(value, list) or len(value) > MAX_PIDS:
        return None
    uuids = tuple(strict_text(uuid, _MAX_KEY_CHARS) for uuid in value)
    return uuids if all(uuids) else None
