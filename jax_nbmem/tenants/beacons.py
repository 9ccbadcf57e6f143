"""Beacons: each kernel running jax_nbmem says what it knows of itself, in a small JSON file.

Another kernel can read a process's environment only as it was at its start, not at all for
another user, and cannot tell widget traffic from work. The kernel itself knows its mode in
effect, its pool and when its last cell finished. :class:`BeaconWriter` keeps that in
``jax_nbmem-beacon-<pid>.json`` (rewritten on change, at most once a second, atomically;
removed at unload and at exit); :func:`read_beacons` gives the beacons a reader can trust.

Where: the user's Jupyter runtime directory, so the user's own kernels, CLI and server see each
other; on a shared node, also the directory an admin names (``c.JaxNbMem.share_dir`` or
``$JAX_NBMEM_SHARE_DIR``, e.g. a sticky world-writable folder), where every user's kernels
write. A beacon holds no secret: no token, no environment, no cell source (mode and allocator
variables only), and is world-readable (0644).

A reader trusts a beacon only when it can check it: the PID is alive with the start time the
beacon states, and the file's owner is that process's owner (nobody can speak for another's
process). Symlinks, oversized, malformed or foreign-schema files are skipped, never fatal.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil
from jupyter_core.paths import jupyter_runtime_dir

__all__ = [
    "ENV_SHARE_DIR",
    "SCHEMA",
    "Beacon",
    "BeaconWriter",
    "beacon_dirs",
    "read_beacons",
]

log = logging.getLogger("jax_nbmem")

SCHEMA = 1
ENV_SHARE_DIR = "JAX_NBMEM_SHARE_DIR"
_PREFIX = "jax_nbmem-beacon-"
_SUFFIX = ".json"
_MAX_BYTES = 64 * 1024
# A beacon's start time and the process's may differ by the rounding of /proc's clock ticks.
_START_SLACK_S = 1.0
_WRITE_EVERY_S = 1.0


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

    ``share_dir`` (the setting) wins over ``$JAX_NBMEM_SHARE_DIR``.
    """
    environ = os.environ if environ is None else environ
    dirs = []
    try:
        dirs.append(jupyter_runtime_dir())
    except Exception:  # a broken Jupyter install leaves the shared directory
        log.debug("jax_nbmem: no Jupyter runtime directory", exc_info=True)
    shared = share_dir or environ.get(ENV_SHARE_DIR, "")
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

    def __init__(self, facts: Callable[[], dict], directories: str | Iterable[str]) -> None:
        self._facts = facts
        if isinstance(directories, str):
            directories = [directories]
        name = f"{_PREFIX}{os.getpid()}{_SUFFIX}"
        self.paths = list(dict.fromkeys(os.path.join(d, name) for d in directories))
        if not self.paths:
            raise ValueError("a beacon needs at least one directory")
        self.path = self.paths[0]
        self._last: dict | None = None
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
            if self._discarded or facts == self._last:
                return False
            content, errors = {**facts, "written_at": time.time()}, []
            for path in self.paths:
                try:
                    _write_atomically(path, content)
                except (OSError, TypeError, ValueError) as exc:  # unwritable, or not JSON
                    errors.append(f"cannot write {path}: {getattr(exc, 'strerror', None) or exc}")
            self.last_error = "; ".join(errors) or None
            if len(errors) == len(self.paths):
                return False
            self._last = facts
            return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self.write_now()
            self._stop.wait(_WRITE_EVERY_S)

    def _remove(self) -> None:
        for path in self.paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._last = None


def _write_atomically(path: str, content: dict) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o644)  # others may read it: it holds no secret
            json.dump(content, out)
        os.replace(partial, path)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise


def read_beacons(dirs: Iterable[str] | None = None) -> dict[int, Beacon]:
    """The beacons in ``dirs`` (default: :func:`beacon_dirs`) that can be trusted, by PID.

    Never raises: a file that cannot be read or trusted is left out.
    """
    found: dict[int, Beacon] = {}
    for directory in beacon_dirs() if dirs is None else dirs:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if not (entry.name.startswith(_PREFIX) and entry.name.endswith(_SUFFIX)):
                continue
            beacon = _read_one(entry.path)
            if beacon is not None and (
                beacon.pid not in found or beacon.written_at > found[beacon.pid].written_at
            ):
                found[beacon.pid] = beacon
    return found


def _read_one(path: str) -> Beacon | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:  # a symlink (ELOOP), gone, or not ours to read
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_BYTES:
            return None
        data = os.read(fd, _MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        content = json.loads(data)
        beacon = _beacon_from(content, path)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if beacon is None or not _vouched_for(beacon, info.st_uid):
        return None
    return beacon


def _beacon_from(content: Any, path: str) -> Beacon | None:
    if not isinstance(content, dict) or content.get("schema") != SCHEMA:
        return None
    pid, started_at = content["pid"], content["started_at"]
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(started_at, float | int):
        return None
    gpus = content.get("gpus") or {}
    if not isinstance(gpus, dict):
        return None
    fraction = content.get("pool_fraction")
    return Beacon(
        pid=pid,
        started_at=float(started_at),
        user=_text(content.get("user")),
        kernel_id=_text(content.get("kernel_id")),
        notebook=_text(content.get("notebook")),
        mode_requested=_text(content.get("mode_requested")),
        mode_in_effect=_text(content.get("mode_in_effect")),
        pool_fraction=float(fraction) if isinstance(fraction, float | int) else None,
        gpus={
            str(uuid): {key: _count(value) for key, value in counters.items()}
            for uuid, counters in gpus.items()
            if isinstance(counters, dict)
        },
        cell_running=bool(content.get("cell_running")),
        last_cell_finished_at=_number(content.get("last_cell_finished_at")),
        written_at=_number(content.get("written_at")) or 0.0,
        jax=_text(content.get("jax")),
        jaxlib=_text(content.get("jaxlib")),
        jax_nbmem=_text(content.get("jax_nbmem")),
        variables={str(k): str(v) for k, v in (content.get("variables") or {}).items()},
        mode_reason=_text(content.get("mode_reason")),
        path=path,
    )


def _vouched_for(beacon: Beacon, owner_uid: int) -> bool:
    """Whether the process is alive, is the one that wrote it, and belongs to the file's owner."""
    try:
        process = psutil.Process(beacon.pid)
        if abs(process.create_time() - beacon.started_at) > _START_SLACK_S:
            return False  # the PID was recycled: another process now
        return process.uids().real == owner_uid
    except (psutil.Error, OverflowError, ValueError):
        return False


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and len(value) <= 4096 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, float | int) and not isinstance(value, bool) else None


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
