"""NVML's lists of the processes on one GPU, for :mod:`jax_nbmem.gpu.nvml`.

Imports no pynvml (the functions take it as ``nv``). Each driver offers some of the process-list
calls (``_v3``, ``_v2``); the session remembers which, stepping down once. A list that cannot
be read is unknown, never empty; bytes no GPU could hold are left out and said.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from jax_nbmem.gpu.nvml_errors import error_name
from jax_nbmem.gpu.nvml_memory import plausible
from jax_nbmem.gpu.nvml_session import Device, Session

__all__ = [
    "GpuProcess",
    "GpuProcesses",
    "NoProcessList",
    "ProcessTable",
    "merged_list",
    "newest_process_call",
    "one_process_list",
]

_PROCESS_VERSIONS = ("_v3", "_v2")


class GpuProcess(NamedTuple):
    """A process holding memory on GPU ``gpu`` (NVML index); ``used_bytes`` None if unknown.

    ``pid`` is as NVML sees it: the host's pid, which differs from the pid inside a container.
    A named tuple: a node's lists make thousands a reading, where a frozen dataclass costs
    about three times more to make.
    """

    pid: int
    gpu: int
    used_bytes: int | None


class ProcessTable(Sequence[GpuProcess]):
    """One GPU's processes as two columns, each PID once with its bytes; a tuple to its readers.

    A node's lists are read every fraction of a second, hundreds of processes a GPU: an object
    an entry made the interpreter's garbage collector walk the kernel's whole heap (a reading of
    8 GPUs x 200 processes cost 13 ms in a kernel, 1.7 ms in a loop). The columns are two lists
    of ints, which the collector does not follow; a :class:`GpuProcess` is made when one is
    read. Equal to the tuple of its processes.
    """

    __slots__ = ("gpu", "pids", "used")

    def __init__(self, gpu: int, pids: list[int], used: list[int]) -> None:
        self.gpu, self.pids, self.used = gpu, pids, used

    def __len__(self) -> int:
        return len(self.pids)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self)[index]
        return GpuProcess(self.pids[index], self.gpu, self.used[index])

    def __iter__(self) -> Iterator[GpuProcess]:
        gpu = self.gpu
        for pid, used in zip(self.pids, self.used, strict=True):
            yield GpuProcess(pid, gpu, used)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, ProcessTable)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"ProcessTable({tuple(self)!r})"


@dataclass(frozen=True)
class GpuProcesses:
    """NVML's process list for GPU ``gpu``: ``processes``, or None with ``problem`` saying why.

    A list that could not be read is not an empty list: who holds memory there is unknown.
    ``problem`` may also be set beside a list, for entries whose bytes made no sense.
    ``processes`` is a tuple, or a :class:`ProcessTable` (which equals one).
    """

    gpu: int
    processes: Sequence[GpuProcess] | None
    problem: str | None = None


def merged_list(gpu: int, entries: Iterable[tuple[int, int | None]]) -> GpuProcesses:
    """GPU ``gpu``'s list from NVML's entries (PID, bytes; None where NVML cannot say them).

    A PID on both lists appears once, with the first figure known; bytes no GPU could hold
    are left out and said in ``problem``. What every reader of the lists makes of them.
    """
    seen: dict[int, int | None] = {}
    odd: list[str] = []
    for pid, raw in entries:
        used = plausible(raw)
        if raw is not None and used is None:
            odd.append(f"PID {pid} {raw!r}")
        if pid not in seen or (seen[pid] is None and used is not None):
            seen[pid] = used
    problem = None
    if odd:
        problem = f"GPU {gpu}: impossible process bytes, not shown: {', '.join(odd)}"
    return GpuProcesses(
        gpu, tuple(GpuProcess(pid, gpu, used) for pid, used in seen.items()), problem
    )


class NoProcessList(Exception):
    """Neither the driver nor pynvml offers a process-list call both of them know."""


def newest_process_call(
    nv: Any, session: Session, kind: str, log_once: Callable[[str, str], None],
    use: Callable[[str], Any],
) -> Any:  # fmt: skip
    """``use(name)`` of the newest ``kind`` process-list call the driver and pynvml share.

    ``use`` returns None, or raises NVML's FUNCTION_NOT_FOUND, for a call that is missing:
    the session then steps down to the next older one, once for good, and says so once.
    Raises NoProcessList when none is left: an old driver (no _v3) with an nvidia-ml-py that
    has no _v2 call. That is "cannot tell", never "no processes".
    """
    while session.process_version[kind] < len(_PROCESS_VERSIONS):
        suffix = _PROCESS_VERSIONS[session.process_version[kind]]
        try:
            found = use(f"nvmlDeviceGet{kind}RunningProcesses{suffix}")
            if found is not None:
                return found
        except nv.NVMLError as error:
            if error_name(nv, error) != "FUNCTION_NOT_FOUND":
                raise
        session.process_version[kind] += 1
        log_once(f"{kind}{suffix}", f"NVML has no {kind.lower()} process list {suffix}")
    raise NoProcessList


def _read_processes(
    nv: Any, session: Session, device: Device, kind: str, log_once: Callable[[str, str], None]
) -> list[Any]:
    """Return NVML's process list of one kind through pynvml's call for it."""

    def use(name: str) -> list[Any] | None:
        function = getattr(nv, name, None)
        return None if function is None else function(device.handle)

    return newest_process_call(nv, session, kind, log_once, use)


def one_process_list(
    nv: Any, session: Session, device: Device, log_once: Callable[[str, str], None]
) -> GpuProcesses:
    """One GPU's list; a list that changed size between NVML's two calls is asked once more.

    Raises pynvml's errors, and NoProcessList; ``log_once(key, message)`` tells of a step down.
    """
    for attempt in range(2):
        try:
            entries = [
                (info.pid, info.usedGpuMemory)
                for kind in ("Compute", "Graphics")
                for info in _read_processes(nv, session, device, kind, log_once)
            ]
        except nv.NVMLError as error:
            if attempt == 0 and error_name(nv, error) == "INSUFFICIENT_SIZE":
                continue
            raise
        return merged_list(device.index, entries)
    raise AssertionError("unreachable")  # pragma: no cover
