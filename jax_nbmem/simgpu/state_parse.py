"""How a state file's text is read: line by line, as ``parse_state`` in nvml_state.c reads it.

The rules are :data:`~jax_nbmem.simgpu.state_format.STATE_FORMAT`'s; a problem names its line
(:class:`~jax_nbmem.simgpu.state_format.StateError`) and the lowest line's problem wins, as in
the stand-in, which the tests feed the same lines (``jaxNbmemSimCheck``). This is
:class:`~jax_nbmem.simgpu.state.SimState`'s own reader, kept apart for its size: it fills the
state's fields directly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jax_nbmem.rootfiles import UnsafeFile, read_regular
from jax_nbmem.simgpu.state_format import (
    CALLS,
    DEFAULT_MIG_NAME,
    DEFAULT_NAME,
    DEFAULT_RESERVED_BYTES,
    MAX_GPUS,
    NVML_ERRORS,
    TEXT_BYTES,
    GpuLine,
    MigLine,
    StateError,
)

__all__ = ["MAX_STATE_BYTES", "parse_into", "read_stable"]

MAX_STATE_BYTES = 64 << 20  # thousands of processes' lines fit many times over

_MAX_GI, _MAX_GI_PER_GPU, _MAX_MIGS = 32, 7, 64
_DRIVER_TEXT = 80
_MAX_FAULTS = 32
_NOT_AVAILABLE = 2**64 - 1
_STABLE_READS = 50


# A SimState; not imported, as state.py imports this module.
_SimState = Any


def parse_into(state: _SimState, text: str) -> _SimState:
    """Fill the empty ``state`` (a SimState) with what ``text`` says; StateError names the line."""
    return _Parser(state).parse(text)


def read_stable(path: Path) -> str:
    """The file's text once two reads in a row agree (a writer may be rewriting it in place).

    Any user may put anything at the state file's name: a link, a FIFO, a device or a file over
    :data:`MAX_STATE_BYTES` is a StateError that says so, never followed, never a hang.
    FileNotFoundError when there is none.
    """
    first = _read_once(path)
    for _ in range(_STABLE_READS):
        second = _read_once(path)
        if second == first:
            return first.decode("utf-8", errors="surrogateescape")
        first = second
    raise StateError(f"{path}: it kept changing while it was read")


def _read_once(path: Path) -> bytes:
    try:
        return read_regular(path, MAX_STATE_BYTES)
    except UnsafeFile as error:
        raise StateError(str(error)) from None


_TOKEN = re.compile(r"[^ \t\r\v\f]+")
_COMMENT = re.compile(r"(?:^|(?<=[ \t\r\v\f]))#")
_DIGITS = re.compile(r"[0-9]{1,20}")
_INCOMPLETE = "no end line: the file is incomplete"
_PROC_KEYS = frozenset(("used", "kind", "ends", "mig", "pidns", "start"))


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

    def __init__(self, state: _SimState) -> None:
        self.state = state
        self.gpu_lines: dict[int, int] = {}
        self.mig_lines: dict[tuple[int, int], int] = {}
        self.proc_lines: list[int] = []
        self.lost_lines: dict[int, int] = {}
        self.fail_lines: list[int] = []

    def parse(self, text: str) -> _SimState:
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

    # The state file's grammar, one branch per keyword or check: read as a table, not split.
    def _line(self, number: int, line: str, ended: bool) -> bool:  # noqa: C901
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
            self._call(number, "slow", words, "MS")
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

    def _gpu(self, number: int, line: str, tokens: list[tuple[str, int]]) -> None:  # noqa: C901
        words = [word for word, _ in tokens]
        index = self._gpu_number(number, "gpu", "INDEX", words, 1)
        if len(words) < 3 or words[2].startswith("name="):
            raise _Problem(number, "gpu: missing UUID")
        if len(words[2].encode("utf-8", "surrogateescape")) >= TEXT_BYTES:
            raise _Problem(number, f"gpu: UUID longer than {TEXT_BYTES - 1} bytes")
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
            if len(hex_name) % 2 or not name or len(name) >= TEXT_BYTES or b"\0" in name:
                raise _Problem(number, f"gpu: bad namehex= '{_cut(hex_name)}'")
        elif name_at is not None:
            name = self._name(number, "gpu", line, tokens[name_at][1])
            if any("\udc80" <= c <= "\udcff" for c in name):
                name = name.encode("utf-8", "surrogateescape")
        else:
            name = DEFAULT_NAME
        if index in self.gpu_lines:
            raise _Problem(number, f"gpu: GPU {index} given twice")
        self.gpu_lines[index] = number
        self.state._gpus[index] = GpuLine(
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
        pidns = None if "pidns=" not in keys else _u64(keys["pidns="])
        if "pidns=" in keys and (not pidns or pidns == _NOT_AVAILABLE):
            raise _Problem(number, f"proc: bad pidns= '{_cut(keys['pidns='])}'")
        start = None if "start=" not in keys else _u64(keys["start="])
        if "start=" in keys and (start is None or start == _NOT_AVAILABLE):
            raise _Problem(number, f"proc: bad start= '{_cut(keys['start='])}'")
        self.state.process(
            gpu,
            pid,
            used,
            kind == "graphics",
            ends_with_process=ends == "exit",
            mig=mig,
            pidns=pidns,
            start=start,
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
        if size >= TEXT_BYTES or size < 5 or not uuid.startswith("MIG-"):
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
            name = self._name(number, "mig", line, tokens[name_at][1])
        if (gpu, instance) in self.mig_lines:
            raise _Problem(number, f"mig: instance {instance} of GPU {gpu} given twice")
        if sum(1 for g, _ in self.mig_lines if g == gpu) >= _MAX_GI_PER_GPU:
            raise _Problem(number, f"mig: GPU {gpu} has more than {_MAX_GI_PER_GPU} instances")
        if len(self.mig_lines) >= _MAX_MIGS:
            raise _Problem(number, f"mig: more than {_MAX_MIGS} instances")
        self.mig_lines[(gpu, instance)] = number
        self.state._migs[(gpu, instance)] = MigLine(uuid, total, name)

    @staticmethod
    def _name(number: int, kind: str, line: str, at: int) -> str:
        """The ``name=`` that starts at ``at``: the rest of the line, 1 to 95 bytes."""
        name = line[at + 5 :].rstrip(" \t\r\v\f")
        size = len(name.encode("utf-8", "surrogateescape"))
        if size == 0:
            raise _Problem(number, f"{kind}: bad name= ''")
        if size >= TEXT_BYTES:
            raise _Problem(number, f"{kind}: name= longer than {TEXT_BYTES - 1} bytes")
        return name

    @staticmethod
    def _call(number: int, kind: str, words: list[str], then: str) -> None:
        """Check a `slow` or `fail` line's CALL, and that the word after it (``then``) is there."""
        if len(words) < 2:
            raise _Problem(number, f"{kind}: missing CALL")
        if words[1] not in CALLS:
            raise _Problem(number, f"{kind}: bad CALL '{_cut(words[1])}'")
        if len(words) < 3:
            raise _Problem(number, f"{kind}: missing {then}")

    def _fail(self, number: int, words: list[str]) -> None:
        self._call(number, "fail", words, "ERROR")
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

    def _check(self) -> None:  # noqa: C901 (one branch per cross-line rule)
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
