"""The simulated GPU's state file format: its words, its limits, its help text, its records.

What a state file may say (:data:`STATE_FORMAT`, which ``python -m jax_nbmem.simgpu --help``
shows), the NVML error codes and calls its ``fail`` and ``slow`` lines name, the limits it
shares with the C stand-in (``nvml_state.c``), and what one ``gpu``, ``mig`` or ``proc`` line
holds once read. :mod:`.state_parse` reads the text by these rules, :mod:`.state` edits and
writes it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CALLS",
    "DEFAULT_DRIVER",
    "DEFAULT_MIG_NAME",
    "DEFAULT_NAME",
    "DEFAULT_RESERVED_BYTES",
    "GIB",
    "MAX_GPUS",
    "NVML_ERRORS",
    "STATE_FORMAT",
    "TEXT_BYTES",
    "GpuLine",
    "MigLine",
    "ProcLine",
    "StateError",
]

GIB = 1024**3
# What an R510+ driver keeps back on an idle GPU, outside "used" (NVML's v2 `reserved`).
DEFAULT_RESERVED_BYTES = 500 * 1024**2
DEFAULT_NAME = "NVIDIA H200 (simulated)"
DEFAULT_MIG_NAME = "NVIDIA H200 MIG (simulated)"
DEFAULT_DRIVER = "550.54.15"
MAX_GPUS = 64
TEXT_BYTES = 96  # NVML's name and UUID buffers, the terminating NUL included

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
  proc GPU PID used=BYTES|na [kind=compute|graphics] [mig=GI] [ends=exit] [start=TICKS]
       [pidns=INODE]
  lost GPU | nodriver | unprivileged | slow CALL MS | fail CALL ERROR [GPU]
  end
Keys come in any order, but name= takes the rest of its line. GPU indices run 0, 1, 2 ...
As an R510+ driver counts: a GPU's used memory is what its processes hold (a process's
figure includes its CUDA context) unless `used=` pins it, and 500 MiB is reserved for the
driver unless `reserved=` says otherwise. `ends=exit`: the process is listed only while it
runs, and never counts as holding memory once it ended (nor in the free memory a new process
finds); with `start=TICKS` (field 22 of /proc/PID/stat, ticks since boot) only while the
process PID that runs is the one that started then, not a later one that reused its PID.
CALL: init, count, name, uuid, memory, processes, driver, info (the rest: utilization,
temperature, PCI...) or any; ERROR: a code or a name (GPU_IS_LOST). `util=`: the GPU's
utilization, which its temperature, power and clocks follow, shared evenly by its processes
(compute or graphics) in their utilization samples. MIG: a GPU with `mig=on` is
split into GPU instances (`mig` lines: GI is the instance's id, UUID its MIG-... UUID, each
a device of its own to NVML); each of its processes runs in one (`mig=GI`). Users other than
root get NO_PERMISSION for the memory and processes of a GPU in MIG mode, as from a real
driver, and answers from its instances; `unprivileged` treats root so too. Lines of any other
kind are ignored (a later format's), and so are unknown keys.
Containers (PID namespaces): a real driver lists host PIDs, whoever asks. With the
`registrar` running on the host (root: `registrar --state FILE`, socket FILE.sock), each
kernel's mirror learns its host PID from it and writes `pidns=INODE` on its lines: PID is a
PID of that namespace (the inode of /proc/PID/ns/pid, the host's). Only a caller in that
namespace judges `ends=exit` by the PID; elsewhere (inside a container) the line stays until
the registrar removes it, which it does when the process's connection to it closes, however
the process ended. Without a registrar a mirror writes its own PID, as on a plain host.
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
class GpuLine:
    """What a ``gpu`` line says (or :meth:`SimState.gpu` was given)."""

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
class MigLine:
    """What a ``mig`` line says: one GPU instance of a GPU in MIG mode."""

    uuid: str
    total: int
    name: str


@dataclass
class ProcLine:
    """What a ``proc`` line says: a process's figure on one GPU, on one of its lists."""

    gpu: int
    pid: int
    used: int | None
    graphics: bool
    ends_with_process: bool = False
    mig: int | None = None
    pidns: int | None = None  # the PID namespace PID belongs to (its inode); None: the reader's
    start: int | None = None  # when PID started (/proc/PID/stat's field 22); None: not said
