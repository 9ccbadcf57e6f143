"""The simulated GPU's state file: what it may say, how it is read, and how it is written.

One format, two readers that follow the same rules: this module (:meth:`SimState.read`, for
the writers that change one thing and keep the rest) and the C stand-in (``nvml_state.c``),
which the tests feed the same lines and compare (``jaxNbmemSimCheck``). :data:`STATE_FORMAT`
documents it; ``python -m jax_nbmem.simgpu --help`` shows that text.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import uuid as uuid_module
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CALLS",
    "DEFAULT_RESERVED_BYTES",
    "GIB",
    "NVML_ERRORS",
    "STATE_FORMAT",
    "SimState",
    "StateError",
]

GIB = 1024**3
# What an R510+ driver keeps back on an idle GPU, outside "used" (NVML's v2 `reserved`).
DEFAULT_RESERVED_BYTES = 500 * 1024**2
DEFAULT_NAME = "NVIDIA H200 (simulated)"
DEFAULT_MIG_NAME = "NVIDIA H200 MIG (simulated)"
_MAX_GI, _MAX_GI_PER_GPU, _MAX_MIGS = 32, 7, 64
DEFAULT_DRIVER = "550.54.15"
MAX_GPUS = 64
_TEXT = 96  # NVML's name and UUID buffers
_DRIVER_TEXT = 80
_MAX_FAULTS = 32
_NOT_AVAILABLE = 2**64 - 1
_STABLE_READS = 50

# NVML's error codes (nvml.h); a `fail` line takes a name (with or without NVML_ERROR_) or a code.
NVML_ERRORS = {
    "SUCCESS": 0,
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "IRQ_ISSUE": 11,
    "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13,
    "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17,
    "LIB_RM_VERSION_MISMATCH": 18,
    "IN_USE": 19,
    "MEMORY": 20,
    "NO_DATA": 21,
    "VGPU_ECC_NOT_SUPPORTED": 22,
    "INSUFFICIENT_RESOURCES": 23,
    "FREQ_NOT_SUPPORTED": 24,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "DEPRECATED": 26,
    "NOT_READY": 27,
    "GPU_NOT_FOUND": 28,
    "INVALID_STATE": 29,
    "UNKNOWN": 999,
}
# The calls a fault or a delay can target (see nvml_stub.c); "any" is every one of them.
# "info": the rest (utilization, temperature, power, PCI, clocks, MIG queries...).
CALLS = ("init", "count", "name", "uuid", "memory", "processes", "driver", "info", "any")

STATE_FORMAT = """\
The state file, one fact per line (what `SimState.write()` writes; `#` starts a comment):
  driver VERSION
  gpu INDEX UUID total=BYTES [used=BYTES] [free=BYTES] [reserved=BYTES] [util=PCT]
      [mig=on] [raw] [name=NAME]
  mig GPU GI UUID total=BYTES [name=NAME]
  proc GPU PID used=BYTES|na [kind=compute|graphics] [mig=GI] [ends=exit]
  lost GPU | nodriver | unprivileged | slow CALL MS | fail CALL ERROR [GPU]
  end
Keys come in any order, but name= takes the rest of its line. GPU indices run 0, 1, 2 ...
As an R510+ driver counts: a GPU's used memory is what its processes hold (a process's
figure includes its CUDA context) unless `used=` pins it, and 500 MiB is reserved for the
driver unless `reserved=` says otherwise. `ends=exit`: the process is listed only while it
runs. CALL: init, count, name, uuid, memory, processes, driver, info (the rest: utilization,
temperature, PCI...) or any; ERROR: a code or a name (GPU_IS_LOST). `util=`: the GPU's
utilization, which its temperature, power and clocks follow. MIG: a GPU with `mig=on` is
split into GPU instances (`mig` lines: GI is the instance's id, UUID its MIG-... UUID, each
a device of its own to NVML); each of its processes runs in one (`mig=GI`). Users other than
root get NO_PERMISSION for the memory and processes of a GPU in MIG mode, as from a real
driver, and answers from its instances; `unprivileged` treats root so too. Lines of any other
kind are ignored (a later format's), and so are unknown keys.
Edit the file at any time, in place or by renaming a new one over it: every NVML call reads
it again, and uses it only once it ends with the `end` line and reads the same twice in a
row. A file with a problem (a bad line, a missing field, a gap in the indices) is reported,
naming its line, and the last good state stays in use. Check one with
`python -m jax_nbmem.simgpu check FILE`.
Example, a neighbour holding 60 GiB of an 80 GiB GPU (or use the `tenant` command):
  gpu 0 GPU-00000000-0000-0000-0000-000000000000 total=85899345920 name=NVIDIA H200 (simulated)
  proc 0 12345 used=64424509440
  end
"""


class StateError(ValueError):
    """A state file (or text) the simulated GPU would not use; the message names the line."""


@dataclass
class _Gpu:
    total: int
    uuid: str
    name: str | bytes
    used: int | None
    reserved: int
    free: int | None = None
    raw: bool = False
    util: int | None = None
    mig: bool = False


@dataclass
class _Mig:
    uuid: str
    total: int
    name: str


@dataclass
class _Process:
    gpu: int
    pid: int
    used: int | None
    graphics: bool
    ends_with_process: bool = False
    mig: int | None = None


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
    _gpus: dict[int, _Gpu] = field(default_factory=dict, init=False, repr=False)
    _processes: list[_Process] = field(default_factory=list, init=False, repr=False)
    _lost: set[int] = field(default_factory=set, init=False, repr=False)
    _slow: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _faults: list[tuple[str, int, int | None]] = field(default_factory=list, init=False, repr=False)
    _migs: dict[tuple[int, int], _Mig] = field(default_factory=dict, init=False, repr=False)

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
        if isinstance(name, bytes) and (len(name) >= _TEXT or b"\0" in name or not name):
            raise ValueError("a simulated GPU name in bytes must be 1 to 95 bytes without NUL")
        if uuid is None:
            uuid = "GPU-" + str(uuid_module.uuid5(uuid_module.NAMESPACE_OID, f"simgpu-{index}"))
        self._gpus[index] = _Gpu(total, uuid, name, used, reserved, free, raw, util, mig)
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
        self._migs[(gpu, instance)] = _Mig(uuid, total, name or DEFAULT_MIG_NAME)
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
    ) -> SimState:
        """Put process ``pid`` on GPU ``gpu`` holding ``used`` bytes (None: NVML can't tell).

        ``used`` is the process's whole figure, its CUDA context included, as NVML reports it.
        A process on both of a GPU's lists (compute and graphics) has the same figure on both.
        ``ends_with_process=True``: the GPU lists it only while a process ``pid`` exists, as
        a real driver forgets a process that exited (the demo's kernels are written so).
        ``mig``: the GPU instance it runs in, on a GPU in MIG mode.
        """
        self._processes.append(_Process(gpu, pid, used, graphics, ends_with_process, mig))
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

        Read as the stand-in reads it: until two reads in a row agree. Raises
        :class:`StateError` (naming the file and the line) for a state the stand-in would not
        use, incomplete ones included; the file is left as it is.
        """
        path = Path(path)
        try:
            text = _read_stable(path)
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
        with open(f"{path}.lock", "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                state = cls.read(path)
                before = state.render()
                yield state
                if state.render() != before:
                    state.write()
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    @classmethod
    def parse(cls, text: str, path: str | os.PathLike[str] = "") -> SimState:
        """The state ``text`` says, by the rules of :data:`STATE_FORMAT`, as the stand-in reads it.

        Raises :class:`StateError` naming the line of the first problem.
        """
        return _Parser(cls(Path(path))).parse(text)

    def process_bytes(self, pid: int) -> int | None:
        """What process ``pid`` holds over all GPUs; None when it is on none (or unknown)."""
        held: dict[int, int | None] = {}
        for proc in self._processes:
            if proc.pid == pid:
                held[proc.gpu] = proc.used  # one figure per GPU, on however many lists
        figures = list(held.values())
        return sum(figures) if figures and None not in figures else None  # type: ignore[arg-type]

    def mig_instance(self, uuid: str) -> tuple[int, int] | None:
        """The (GPU, GPU instance) of the one MIG instance whose UUID starts with ``uuid``."""
        found = [place for place, mig in self._migs.items() if mig.uuid.startswith(uuid)]
        return found[0] if len(found) == 1 else None

    def free_bytes(
        self, gpu: int, leaving_out: int | None = None, mig: int | None = None
    ) -> int | None:
        """What GPU ``gpu`` reports free, as the stub computes it, without process ``leaving_out``.

        None when the state has no such GPU or pins numbers that say nothing (``raw``).
        ``mig``: what its MIG instance ``mig`` reports free (its processes', no reserve).
        """
        if mig is not None:
            instance = self._migs.get((gpu, mig))
            if instance is None:
                return None
            held = {p.pid: p.used or 0 for p in self._processes if (p.gpu, p.mig) == (gpu, mig)}
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
            held = {p.pid: p.used or 0 for p in self._processes if p.gpu == gpu}
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


def _read_stable(path: Path) -> str:
    """The file's text once two reads in a row agree (a writer may be rewriting it in place)."""
    first = path.read_bytes()
    for _ in range(_STABLE_READS):
        second = path.read_bytes()
        if second == first:
            return first.decode("utf-8", errors="surrogateescape")
        first = second
    raise StateError(f"{path}: it kept changing while it was read")


_TOKEN = re.compile(r"[^ \t\r\v\f]+")
_COMMENT = re.compile(r"(?:^|(?<=[ \t\r\v\f]))#")
_DIGITS = re.compile(r"[0-9]{1,20}")
_INCOMPLETE = "no end line: the file is incomplete"
_PROC_KEYS = frozenset(("used", "kind", "ends", "mig"))


class _Problem(Exception):
    def __init__(self, line: int | None, what: str) -> None:
        super().__init__(what)
        self.line, self.what = line, what

    def message(self) -> str:
        return self.what if self.line is None else f"line {self.line}: {self.what}"


def _first_word(line: str) -> str | None:
    found = _TOKEN.search(line)
    return found.group() if found else None


def _u64(text: str) -> int | None:
    if not _DIGITS.fullmatch(text):
        return None
    value = int(text)
    return value if value <= _NOT_AVAILABLE else None


def _cut(text: str) -> str:
    """What the stand-in quotes of a value (its 47 first bytes)."""
    return text.encode("utf-8", "surrogateescape")[:47].decode("utf-8", "surrogateescape")


class _Parser:
    """The rules of STATE_FORMAT, line by line, as ``parse_state`` in nvml_state.c applies them."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.gpu_lines: dict[int, int] = {}
        self.mig_lines: dict[tuple[int, int], int] = {}
        self.proc_lines: list[int] = []
        self.lost_lines: dict[int, int] = {}
        self.fail_lines: list[int] = []

    def parse(self, text: str) -> SimState:
        ended = False
        number = 0
        try:
            pieces = text.split("\n")
            if pieces and pieces[-1] == "":
                pieces.pop()  # the last line's newline
            if not any(_first_word(line) == "end" for line in pieces):
                # Without its end line the file is being written: even a half-written last
                # line is not a problem of the state.
                raise _Problem(None, _INCOMPLETE)
            for number, line in enumerate(pieces, 1):
                ended = self._line(number, line, ended)
            if not ended:
                raise _Problem(None, _INCOMPLETE)
            self._check()
        except _Problem as problem:
            raise StateError(problem.message()) from None
        return self.state

    def _line(self, number: int, line: str, ended: bool) -> bool:
        comment = _COMMENT.search(line) if "#" in line else None
        if comment:
            line = line[: comment.start()]
        tokens = [(m.group(), m.start()) for m in _TOKEN.finditer(line)][:64]
        if not tokens:
            return ended
        if ended:
            raise _Problem(number, "after the end line")
        words = [word for word, _ in tokens]
        kind = words[0][:47]
        state = self.state
        if kind == "end":
            return True
        if kind == "nodriver":
            state.driver_loaded = False
        elif kind == "unprivileged":
            state.all_unprivileged = True
        elif kind == "mig":
            self._mig(number, line, tokens)
        elif kind == "driver":
            if len(words) < 2:
                raise _Problem(number, "driver: missing VERSION")
            if len(words[1].encode("utf-8", "surrogateescape")) >= _DRIVER_TEXT:
                raise _Problem(number, f"driver: VERSION longer than {_DRIVER_TEXT - 1} bytes")
            state.driver = words[1]
        elif kind == "gpu":
            self._gpu(number, line, tokens)
        elif kind == "proc":
            self._proc(number, words)
        elif kind == "lost":
            index = self._gpu_number(number, "lost", "GPU", words, 1)
            state._lost.add(index)
            self.lost_lines.setdefault(index, number)
        elif kind == "slow":
            if len(words) < 2:
                raise _Problem(number, "slow: missing CALL")
            if words[1] not in CALLS:
                raise _Problem(number, f"slow: bad CALL '{_cut(words[1])}'")
            if len(words) < 3:
                raise _Problem(number, "slow: missing MS")
            ms = _u64(words[2])
            if ms is None or ms > 0xFFFFFFFF:
                raise _Problem(number, f"slow: bad MS '{_cut(words[2])}'")
            state._slow[words[1]] = ms
        elif kind == "fail":
            self._fail(number, words)
        return ended  # any other line is ignored (a later format's, or a note)

    def _gpu_number(self, number: int, kind: str, what: str, words: list[str], at: int) -> int:
        if at >= len(words):
            raise _Problem(number, f"{kind}: missing {what}")
        value = _u64(words[at])
        if value is None or value >= MAX_GPUS:
            raise _Problem(number, f"{kind}: bad {what} '{_cut(words[at])}'")
        return value

    def _gpu(self, number: int, line: str, tokens: list[tuple[str, int]]) -> None:
        words = [word for word, _ in tokens]
        index = self._gpu_number(number, "gpu", "INDEX", words, 1)
        if len(words) < 3 or words[2].startswith("name="):
            raise _Problem(number, "gpu: missing UUID")
        if len(words[2].encode("utf-8", "surrogateescape")) >= _TEXT:
            raise _Problem(number, f"gpu: UUID longer than {_TEXT - 1} bytes")
        name_at = next((i for i in range(3, len(words)) if words[i].startswith("name=")), None)
        options = words[3:name_at]

        def key(name: str) -> str | None:
            found = None
            for word in options:
                if word.startswith(name):
                    found = word[len(name) :]
            return found

        def byte_count(name: str) -> int | None:
            value = key(name)
            if value is None:
                return None
            parsed = _u64(value)
            if parsed is None:
                raise _Problem(number, f"gpu: bad {name} '{_cut(value)}'")
            return parsed

        total = byte_count("total=")
        if total is None:
            raise _Problem(number, "gpu: missing total=")
        used, free = byte_count("used="), byte_count("free=")
        reserved = byte_count("reserved=")
        util_text = key("util=")
        util = None if util_text is None else _u64(util_text)
        if util_text is not None and (util is None or util > 100):
            raise _Problem(number, f"gpu: bad util= '{_cut(util_text)}'")
        mig = key("mig=")
        if mig not in (None, "on", "off"):
            raise _Problem(number, f"gpu: bad mig= '{_cut(mig)}'")
        raw = "raw" in options
        hex_name = key("namehex=")
        name: str | bytes
        if hex_name is not None:
            try:
                name = bytes.fromhex(hex_name) if re.fullmatch(r"[0-9a-fA-F]*", hex_name) else b""
            except ValueError:
                name = b""
            if len(hex_name) % 2 or not name or len(name) >= _TEXT or b"\0" in name:
                raise _Problem(number, f"gpu: bad namehex= '{_cut(hex_name)}'")
        elif name_at is not None:
            name = line[tokens[name_at][1] + 5 :].rstrip(" \t\r\v\f")
            size = len(name.encode("utf-8", "surrogateescape"))
            if size == 0:
                raise _Problem(number, "gpu: bad name= ''")
            if size >= _TEXT:
                raise _Problem(number, f"gpu: name= longer than {_TEXT - 1} bytes")
            if any("\udc80" <= c <= "\udcff" for c in name):
                name = name.encode("utf-8", "surrogateescape")
        else:
            name = DEFAULT_NAME
        if index in self.gpu_lines:
            raise _Problem(number, f"gpu: GPU {index} given twice")
        self.gpu_lines[index] = number
        self.state._gpus[index] = _Gpu(
            total,
            words[2],
            name,
            used,
            DEFAULT_RESERVED_BYTES if reserved is None else reserved,
            free,
            raw,
            util,
            mig == "on",
        )

    def _proc(self, number: int, words: list[str]) -> None:
        gpu = self._gpu_number(number, "proc", "GPU", words, 1)
        if len(words) < 3:
            raise _Problem(number, "proc: missing PID")
        pid = _u64(words[2])
        if pid is None or pid > 0xFFFFFFFF:
            raise _Problem(number, f"proc: bad PID '{_cut(words[2])}'")
        keys: dict[str, str] = {}
        for word in words[3:]:
            name, equals, value = word.partition("=")
            if equals and name in _PROC_KEYS:
                keys[name + "="] = value
        if "used=" not in keys:
            raise _Problem(number, "proc: missing used=")
        used: int | None
        if keys["used="] == "na":
            used = None
        else:
            used = _u64(keys["used="])
            if used is None or used == _NOT_AVAILABLE:
                raise _Problem(number, f"proc: bad used= '{_cut(keys['used='])}'")
        kind = keys.get("kind=", "compute")
        if kind not in ("compute", "graphics"):
            raise _Problem(number, f"proc: bad kind= '{_cut(kind)}'")
        ends = keys.get("ends=")
        if ends not in (None, "exit"):
            raise _Problem(number, f"proc: bad ends= '{_cut(ends)}'")
        mig = None if "mig=" not in keys else _u64(keys["mig="])
        if "mig=" in keys and (mig is None or mig >= _MAX_GI):
            raise _Problem(number, f"proc: bad mig= '{_cut(keys['mig='])}'")
        self.state.process(
            gpu, pid, used, kind == "graphics", ends_with_process=ends == "exit", mig=mig
        )
        self.proc_lines.append(number)

    def _mig(self, number: int, line: str, tokens: list[tuple[str, int]]) -> None:
        words = [word for word, _ in tokens]
        gpu = self._gpu_number(number, "mig", "GPU", words, 1)
        if len(words) < 3:
            raise _Problem(number, "mig: missing GI")
        instance = _u64(words[2])
        if instance is None or instance >= _MAX_GI:
            raise _Problem(number, f"mig: bad GI '{_cut(words[2])}'")
        if len(words) < 4 or words[3].startswith("name="):
            raise _Problem(number, "mig: missing UUID")
        uuid = words[3]
        size = len(uuid.encode("utf-8", "surrogateescape"))
        if size >= _TEXT or size < 5 or not uuid.startswith("MIG-"):
            raise _Problem(number, f"mig: bad UUID '{_cut(uuid)}' (MIG-...)")
        name_at = next((i for i in range(4, len(words)) if words[i].startswith("name=")), None)
        total_text = None
        for word in words[4:name_at]:
            if word.startswith("total="):
                total_text = word[6:]
        if total_text is None:
            raise _Problem(number, "mig: missing total=")
        total = _u64(total_text)
        if total is None:
            raise _Problem(number, f"mig: bad total= '{_cut(total_text)}'")
        if name_at is None:
            name = DEFAULT_MIG_NAME
        else:
            name = line[tokens[name_at][1] + 5 :].rstrip(" \t\r\v\f")
            size = len(name.encode("utf-8", "surrogateescape"))
            if size == 0:
                raise _Problem(number, "mig: bad name= ''")
            if size >= _TEXT:
                raise _Problem(number, f"mig: name= longer than {_TEXT - 1} bytes")
        if (gpu, instance) in self.mig_lines:
            raise _Problem(number, f"mig: instance {instance} of GPU {gpu} given twice")
        if sum(1 for g, _ in self.mig_lines if g == gpu) >= _MAX_GI_PER_GPU:
            raise _Problem(number, f"mig: GPU {gpu} has more than {_MAX_GI_PER_GPU} instances")
        if len(self.mig_lines) >= _MAX_MIGS:
            raise _Problem(number, f"mig: more than {_MAX_MIGS} instances")
        self.mig_lines[(gpu, instance)] = number
        self.state._migs[(gpu, instance)] = _Mig(uuid, total, name)

    def _fail(self, number: int, words: list[str]) -> None:
        if len(words) < 2:
            raise _Problem(number, "fail: missing CALL")
        if words[1] not in CALLS:
            raise _Problem(number, f"fail: bad CALL '{_cut(words[1])}'")
        if len(words) < 3:
            raise _Problem(number, "fail: missing ERROR")
        error = words[2]
        code = _u64(error)
        if code is None:
            code = NVML_ERRORS.get(error.removeprefix("NVML_ERROR_") if len(error) > 11 else error)
        elif code > 0x7FFFFFFF:
            code = None
        if code is None:
            raise _Problem(number, f"fail: bad ERROR '{_cut(error)}'")
        gpu = self._gpu_number(number, "fail", "GPU", words, 3) if len(words) > 3 else None
        if len(self.state._faults) >= _MAX_FAULTS:
            raise _Problem(number, f"fail: more than {_MAX_FAULTS} faults")
        self.state._faults.append((words[1], code, gpu))
        self.fail_lines.append(number)

    def _check(self) -> None:
        """What the lines cannot tell alone; the problem of the lowest line wins."""
        state, problems = self.state, []
        present = set(state._gpus)
        for index in sorted(present):
            missing = min(set(range(index)) - present, default=None)
            if missing is not None:
                problems.append(
                    _Problem(
                        self.gpu_lines[index],
                        f"gpu: GPU {index} without GPU {missing} (indices run 0, 1, 2 ...)",
                    )
                )
        for proc, line in zip(state._processes, self.proc_lines, strict=True):
            if proc.gpu not in present:
                problems.append(_Problem(line, f"proc: no GPU {proc.gpu}"))
            elif state._gpus[proc.gpu].mig and proc.mig is None:
                what = f"proc: GPU {proc.gpu} is in MIG mode: which instance (mig=GI)?"
                problems.append(_Problem(line, what))
            elif proc.mig is not None and (proc.gpu, proc.mig) not in state._migs:
                what = f"proc: no MIG instance {proc.mig} on GPU {proc.gpu}"
                problems.append(_Problem(line, what))
        for (gpu, _), line in self.mig_lines.items():
            if gpu not in present:
                problems.append(_Problem(line, f"mig: no GPU {gpu}"))
            elif not state._gpus[gpu].mig:
                problems.append(_Problem(line, f"mig: GPU {gpu} is not in MIG mode (mig=on)"))
        for index, line in self.lost_lines.items():
            if index not in present:
                problems.append(_Problem(line, f"lost: no GPU {index}"))
        for (_, _, gpu), line in zip(state._faults, self.fail_lines, strict=True):
            if gpu is not None and gpu not in present:
                problems.append(_Problem(line, f"fail: no GPU {gpu}"))
        seen: dict[tuple[int, int], tuple[int | None, set[bool]]] = {}
        for proc, line in zip(state._processes, self.proc_lines, strict=True):
            key = (proc.gpu, proc.pid)
            if key not in seen:
                seen[key] = (proc.used, {proc.graphics})
                continue
            used, kinds = seen[key]
            if proc.graphics in kinds:
                what = f"proc: PID {proc.pid} listed twice on GPU {proc.gpu}"
                problems.append(_Problem(line, what))
            elif proc.used != used:
                what = f"proc: PID {proc.pid} has two figures on GPU {proc.gpu}"
                problems.append(_Problem(line, what))
            kinds.add(proc.graphics)
        if problems:
            raise min(problems, key=lambda problem: problem.line or 0)
