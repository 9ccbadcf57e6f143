"""The simulated GPU's state file: what it may say, how it is read, and how it is written.

One format, two readers that follow the same rules: this module (:meth:`SimState.read`, for
the writers that change one thing and keep the rest) and the C stand-in (``nvml_state.c``),
which the tests feed the same lines and compare (``jaxNbmemSimCheck``). :data:`STATE_FORMAT`
documents it; ``python -m jax_nbmem.simgpu --help`` shows that text. The format's words and
records live in :mod:`.state_format`, its reader in :mod:`.state_parse`; their public names
are re-exported here, where they have always been.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import tempfile
import uuid as uuid_module
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from jax_nbmem.rootfiles import UnsafeFile, lock_file
from jax_nbmem.simgpu.liveness import line_ended
from jax_nbmem.simgpu.state_format import (
    CALLS,
    DEFAULT_DRIVER,
    DEFAULT_MIG_NAME,
    DEFAULT_NAME,
    DEFAULT_RESERVED_BYTES,
    GIB,
    NVML_ERRORS,
    STATE_FORMAT,
    TEXT_BYTES,
    GpuLine,
    MigLine,
    ProcLine,
    StateError,
)
from jax_nbmem.simgpu.state_format import MAX_GPUS as MAX_GPUS
from jax_nbmem.simgpu.state_parse import parse_into, read_stable

__all__ = [
    "CALLS",
    "DEFAULT_RESERVED_BYTES",
    "GIB",
    "NVML_ERRORS",
    "STATE_FORMAT",
    "SimState",
    "StateError",
]


@dataclass
class SimState:
    """What the simulated GPUs report; edit it, then ``write()`` it for readers to see.

    Methods return the state itself, so calls chain. ``write()`` replaces the file atomically:
    a reader in another process sees the old state or the new one, never a mix. A writer that
    changes one thing and keeps the rest goes through :meth:`update`, so that two such writers
    never lose each other's lines.
    """

    path: Path
    driver: str = DEFAULT_DRIVER
    driver_loaded: bool = True
    all_unprivileged: bool = False
    _gpus: dict[int, GpuLine] = field(default_factory=dict, init=False, repr=False)
    _processes: list[ProcLine] = field(default_factory=list, init=False, repr=False)
    _lost: set[int] = field(default_factory=set, init=False, repr=False)
    _slow: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _faults: list[tuple[str, int, int | None]] = field(default_factory=list, init=False, repr=False)
    _migs: dict[tuple[int, int], MigLine] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    def gpu(
        self,
        index: int,
        total: int,
        uuid: str | None = None,
        name: str | bytes | None = None,
        used: int | None = None,
        reserved: int = DEFAULT_RESERVED_BYTES,
        *,
        free: int | None = None,
        raw: bool = False,
        util: int | None = None,
        mig: bool = False,
    ) -> SimState:
        """Add (or replace) GPU ``index`` with ``total`` bytes.

        ``uuid`` defaults to one derived from the index; ``name`` to a simulated H200 (bytes
        are passed as they are, so a name need not be valid UTF-8). ``used`` pins the device's
        used bytes; by default it is the sum of its processes, as R510+ drivers count it.
        ``reserved`` is memory the driver keeps back (NVML's v2 memory info; 500 MiB, as on a
        real GPU, unless given). ``raw=True`` reports ``total``, ``used`` and ``free`` exactly
        as given, even when they make no sense (used above total, 2**64 - 1), as a confused
        driver would. ``util`` is its utilization in percent (0 by default), which its
        temperature, power and clocks follow. ``mig=True``: the GPU is in MIG mode, split
        into the instances :meth:`mig` adds; a user other than root may then not ask the GPU
        itself for memory or processes (NO_PERMISSION), only its instances.
        """
        name = DEFAULT_NAME if name is None else name
        if isinstance(name, str) and ("\n" in name or re.search(r"\s#", name)):
            raise ValueError(f"a simulated GPU name cannot hold a newline or ' #': {name!r}")
        if isinstance(name, bytes) and (len(name) >= TEXT_BYTES or b"\0" in name or not name):
            raise ValueError("a simulated GPU name in bytes must be 1 to 95 bytes without NUL")
        if uuid is None:
            uuid = "GPU-" + str(uuid_module.uuid5(uuid_module.NAMESPACE_OID, f"simgpu-{index}"))
        self._gpus[index] = GpuLine(total, uuid, name, used, reserved, free, raw, util, mig)
        return self

    def mig(
        self,
        gpu: int,
        instance: int,
        total: int,
        uuid: str | None = None,
        name: str | None = None,
    ) -> SimState:
        """Add (or replace) GPU instance ``instance`` (its id) of GPU ``gpu``, in MIG mode.

        It is a device of its own to NVML: a ``MIG-...`` UUID (derived from the GPU and the id
        unless given), ``total`` bytes, a name ("NVIDIA H200 MIG 1g.18gb", say), and the
        processes :meth:`process` puts in it (``mig=instance``).
        """
        if uuid is None:
            uuid = "MIG-" + str(
                uuid_module.uuid5(uuid_module.NAMESPACE_OID, f"simgpu-{gpu}-mig-{instance}")
            )
        self._migs[(gpu, instance)] = MigLine(uuid, total, name or DEFAULT_MIG_NAME)
        return self

    def unprivileged(self, on: bool = True) -> SimState:
        """Treat every caller as a user other than root (as when the tests run as root)."""
        self.all_unprivileged = on
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
        mig: int | None = None,
        pidns: int | None = None,
        start: int | None = None,
    ) -> SimState:
        """Put process ``pid`` on GPU ``gpu`` holding ``used`` bytes (None: NVML can't tell).

        ``used`` is the process's whole figure, its CUDA context included, as NVML reports it.
        A process on both of a GPU's lists (compute and graphics) has the same figure on both.
        ``ends_with_process=True``: the GPU lists it only while a process ``pid`` exists, as
        a real driver forgets a process that exited (the demo's kernels are written so).
        ``mig``: the GPU instance it runs in, on a GPU in MIG mode. ``pidns``: the PID namespace
        ``pid`` belongs to (the inode of its ``/proc/PID/ns/pid``), as the registrar's lines say:
        only a caller in that namespace judges ``ends_with_process`` by the PID. ``start``: when
        ``pid`` started (:func:`.liveness.process_start`), so that a later process that reuses
        the PID is not taken for it.
        """
        line = ProcLine(gpu, pid, used, graphics, ends_with_process, mig, pidns, start)
        self._processes.append(line)
        return self

    def remove_process(self, pid: int, pidns: int | None = None) -> SimState:
        """Take process ``pid`` off every GPU (with ``pidns``: only its lines of that namespace)."""
        self._processes = [
            proc
            for proc in self._processes
            if proc.pid != pid or (pidns is not None and proc.pidns != pidns)
        ]
        return self

    def processes(self) -> list[ProcLine]:
        """The ``proc`` lines, in order (copies: change the state through its methods)."""
        return [dataclasses.replace(proc) for proc in self._processes]

    def _held(self) -> list[ProcLine]:
        """The ``proc`` lines of processes that still hold their memory (:mod:`.liveness`)."""
        return [proc for proc in self._processes if not line_ended(proc)]

    def forget_ended(self) -> SimState:
        """Take off the lines of processes that ended, as the GPU no longer lists them.

        What a new demo run does first, so that it meets only live processes; lines of
        running processes (another user's too, on a shared state file) stay.
        """
        self._processes = self._held()
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

        Read as the stand-in reads it: until two reads in a row agree. Raises
        :class:`StateError` (naming the file and the line) for a state the stand-in would not
        use, incomplete ones included; the file is left as it is.
        """
        path = Path(path)
        try:
            text = read_stable(path)
        except FileNotFoundError:
            return cls(path)
        try:
            return cls.parse(text, path)
        except StateError as error:
            raise StateError(f"{path}: {error}") from None

    @classmethod
    @contextlib.contextmanager
    def update(cls, path: str | os.PathLike[str]) -> Iterator[SimState]:
        """Read the state, let the caller change it, and write it, holding the file's lock.

        Writers that change one thing and keep the rest (the kernels' mirrors) take turns
        so: none loses another's lines. The lock is ``PATH.lock``, beside it. Nothing is
        written when the block raises, nor when it changed nothing.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Read-only is enough for flock; never through a link, never a FIFO (anyone may put
        # one at the lock's name: the folder is everyone's).
        try:
            lock = lock_file(f"{path}.lock")
        except UnsafeFile as error:
            raise StateError(f"{error} (remove it; the lock is an empty regular file)") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = cls.read(path)
            before = state.render()
            yield state
            if state.render() != before:
                state.write()
        finally:
            os.close(lock)  # the lock goes with its descriptor

    @classmethod
    def parse(cls, text: str, path: str | os.PathLike[str] = "") -> SimState:
        """The state ``text`` says, by the rules of :data:`STATE_FORMAT`, as the stand-in reads it.

        Raises :class:`StateError` naming the line of the first problem.
        """
        return parse_into(cls(Path(path)), text)

    def process_bytes(self, pid: int) -> int | None:
        """What process ``pid`` holds over all GPUs; None when it is on none (or unknown)."""
        held: dict[int, int | None] = {}
        for proc in self._held():
            if proc.pid == pid:
                held[proc.gpu] = proc.used  # one figure per GPU, on however many lists
        figures = list(held.values())
        return sum(figures) if figures and None not in figures else None  # type: ignore[arg-type]

    def uuid_of(self, gpu: int, mig: int | None = None) -> str | None:
        """The UUID of GPU ``gpu`` (or of its MIG instance ``mig``); None: no such line."""
        line = self._migs.get((gpu, mig)) if mig is not None else self._gpus.get(gpu)
        return line.uuid if line is not None else None

    def gpu_indices(self) -> list[int]:
        """The whole GPUs' indices, in order: what numbers in ``CUDA_VISIBLE_DEVICES`` count."""
        return sorted(self._gpus)

    def devices(self) -> list[tuple[int, int | None, str]]:
        """Every device a CUDA process could see, as ``(gpu, mig, uuid)``, GPU 0's first.

        A whole GPU is ``(index, None, uuid)``; a GPU in MIG mode runs nothing itself and
        stands for its instances, each ``(index, instance, uuid)``.
        """
        found: list[tuple[int, int | None, str]] = []
        for index in sorted(self._gpus):
            line = self._gpus[index]
            if not line.mig:
                found.append((index, None, line.uuid))
                continue
            instances = sorted(place for place in self._migs if place[0] == index)
            found.extend((index, mig, self._migs[(index, mig)].uuid) for _, mig in instances)
        return found

    def mig_instance(self, uuid: str) -> tuple[int, int] | None:
        """The (GPU, GPU instance) of the one MIG instance whose UUID starts with ``uuid``."""
        found = [place for place, mig in self._migs.items() if mig.uuid.startswith(uuid)]
        return found[0] if len(found) == 1 else None

    def free_bytes(
        self, gpu: int, leaving_out: int | None = None, mig: int | None = None
    ) -> int | None:
        """What GPU ``gpu`` reports free, as the stub computes it, without process ``leaving_out``.

        Processes that ended hold nothing (:mod:`.liveness`, the stand-in's rule). None when
        the state has no such GPU or pins numbers that say nothing (``raw``).
        ``mig``: what its MIG instance ``mig`` reports free (its processes', no reserve).
        """
        if mig is not None:
            instance = self._migs.get((gpu, mig))
            if instance is None:
                return None
            held = {p.pid: p.used or 0 for p in self._held() if (p.gpu, p.mig) == (gpu, mig)}
            held.pop(leaving_out, None)  # type: ignore[arg-type]
            return max(0, instance.total - sum(held.values()))
        found = self._gpus.get(gpu)
        if found is None or found.raw:
            return None
        if found.free is not None:
            return found.free
        if found.used is not None:
            used = found.used
        else:
            held = {p.pid: p.used or 0 for p in self._held() if p.gpu == gpu}
            held.pop(leaving_out, None)  # type: ignore[arg-type]
            used = sum(held.values())
        return max(0, found.total - found.reserved - used)

    def total_bytes(self, gpu: int, mig: int | None = None) -> int | None:
        """GPU ``gpu``'s (or its MIG instance ``mig``'s) total memory; None when there is none."""
        found = self._gpus.get(gpu) if mig is None else self._migs.get((gpu, mig))
        return None if found is None else found.total

    def summary(self) -> str:
        """A line saying what the state holds: GPUs, processes, faults."""
        parts = [f"{len(self._gpus)} GPU(s)", f"{len(self._processes)} process(es)"]
        registered = sum(1 for proc in self._processes if proc.pidns is not None)
        if registered:
            parts[-1] += f" ({registered} line(s) by a registrar's host PID)"
        if not self.driver_loaded:
            parts.append("no driver")
        if self._lost:
            parts.append(f"lost: {', '.join(map(str, sorted(self._lost)))}")
        if self._slow or self._faults:
            parts.append(f"{len(self._slow)} slow and {len(self._faults)} failing call(s)")
        return ", ".join(parts)

    def render(self) -> str:
        """Return the state file's text."""
        lines = ["# jax_nbmem simulated GPU state", f"driver {self.driver}"]
        if not self.driver_loaded:
            lines.append("nodriver")
        if self.all_unprivileged:
            lines.append("unprivileged")
        for index, gpu in sorted(self._gpus.items()):
            used = "" if gpu.used is None else f" used={gpu.used}"
            free = "" if gpu.free is None else f" free={gpu.free}"
            raw = " raw" if gpu.raw else ""
            raw += "" if gpu.util is None else f" util={gpu.util}"
            raw += " mig=on" if gpu.mig else ""
            name = (
                f" namehex={gpu.name.hex()}" if isinstance(gpu.name, bytes) else f" name={gpu.name}"
            )
            lines.append(
                f"gpu {index} {gpu.uuid} total={gpu.total}{used}{free} reserved={gpu.reserved}"
                f"{raw}{name}"
            )
        for (gpu_index, instance), mig in sorted(self._migs.items()):
            lines.append(f"mig {gpu_index} {instance} {mig.uuid} total={mig.total} name={mig.name}")
        for proc in self._processes:
            used = "na" if proc.used is None else str(proc.used)
            kind = "graphics" if proc.graphics else "compute"
            kind += "" if proc.mig is None else f" mig={proc.mig}"
            ends = " ends=exit" if proc.ends_with_process else ""
            ends += "" if proc.start is None else f" start={proc.start}"
            ends += "" if proc.pidns is None else f" pidns={proc.pidns}"
            lines.append(f"proc {proc.gpu} {proc.pid} used={used} kind={kind}{ends}")
        lines.extend(f"lost {index}" for index in sorted(self._lost))
        lines.extend(f"slow {call} {ms}" for call, ms in sorted(self._slow.items()))
        for call, code, gpu in self._faults:
            lines.append(f"fail {call} {code}" + ("" if gpu is None else f" {gpu}"))
        lines.append("end")
        return "\n".join(lines) + "\n"

    def write(self) -> Path:
        """Write the state file atomically (temporary file, then rename) and return its path.

        Raises :class:`StateError` (and writes nothing) for a state the stand-in would not
        use: a gap in the GPU indices, a process on a GPU the state lacks...
        """
        text = self.render()
        SimState.parse(text, self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as out:
                # Every user's processes see the one GPU, as with /dev/nvidia*.
                os.fchmod(out.fileno(), 0o644)
                out.write(text)
            os.replace(partial, self.path)
        except BaseException:
            os.unlink(partial)
            raise
        return self.path
