"""This process's JAX arrays on the simulated GPU, held the way JAX's allocator would hold them.

In the demo (``scripts/quickstart.sh --simulated-gpu``) the kernel's JAX runs on the CPU, so
the simulated GPU would never see it. The mirror, a daemon thread in the kernel, closes that
gap: once JAX's backend has started (it never starts it), it writes this process's entry in
the state file as the real allocator would make it under the mode JAX started with, on every
GPU JAX would start a client on (every GPU ``CUDA_VISIBLE_DEVICES`` lets through, narrowed by
JAX's ``jax_cuda_visible_devices``; see :mod:`.placement`), each GPU by its own figures:

* preallocation (JAX's default, ``fraction F``, ``bfc``/``cuda_async`` with preallocation):
  the whole pool, ``F`` × the GPU's total, on each of those GPUs from the first operation on;
  when that much is not free on a GPU, 0.9 times as much there, again and again until it
  fits, as XLA's allocator retries;
* ``off`` (and ``vmm``): the pool grows with the arrays and keeps what they freed (the
  allocator returns freed blocks to its pool, not to the GPU): the high-water mark of the
  arrays on that GPU;
* ``platform``: exactly what the arrays on that GPU hold now.

The arrays are counted where they live: JAX's CPU device ``k`` stands for its ``k``-th GPU
(see :mod:`.placement`). On a MIG instance (``CUDA_VISIBLE_DEVICES`` names its ``MIG-`` UUID,
as CUDA would use it) the entry is on that instance, and the fraction is of the instance's
memory, as JAX's is.

Under a GPU sharing cap on a CUDA device the entry there is what the cap lets through,
modelled as the sharing system enforces it, not as jax_nbmem reads it (so a test can tell the
two apart), and kept minimal:

* MPS (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, its ``N=<n>M`` or ``N=<n>G`` entry for CUDA
  device ``N``): CUDA's total stays the card's, allocations past the cap fail, so the pool,
  ``F`` x the card, shrinks in its 0.9x steps until it fits under the cap;
* HAMi (``CUDA_DEVICE_MEMORY_LIMIT_N``, else ``CUDA_DEVICE_MEMORY_LIMIT``, read as HAMi-core
  reads them: a number ``strtoul`` accepts, then ``k``/``m``/``g``; 0 is none): CUDA's total
  is the cap, so the pool is ``F`` x the cap.

Plus a CUDA context's worth on each of those GPUs (counted under the cap), and what other
frameworks in the process hold there (PyTorch, CuPy, TensorFlow; see :func:`beside_jax_bytes`),
as a real driver counts a kernel's bytes whoever allocated them. The figures are labelled
simulated wherever they show (the GPU's name says so). The entry lasts as long as the process
(``ends=exit`` in the state file), as a real driver forgets a process that exited, however it
ended.

In a container (a PID namespace of its own) a real driver lists the process by its host PID.
When the state file's registrar runs (``STATE.sock``, see :mod:`.registrar`) the mirror
registers before it writes anything, and writes its entry under the host PID the registrar
read off the socket, with the host's namespace (``pidns=``); the registrar removes it when the
process ends. Without a registrar it writes its own PID, as on a plain host. A registrar's
socket that does not answer (one that was killed) is said once, and the mirror waits.

On a real GPU, NVML sees an allocation the moment it is made; the thread looks only every
0.25 s. So that a cell that allocates and returns at once is charged with its own bytes, in a
kernel the mirror also looks when each cell has run: from IPython's ``post_execute`` event,
which IPython fires before ``post_run_cell``, where jax_nbmem reads the cell's end, whatever
order the two were registered in. That look counts the live arrays (about 1 µs each: 10 ms a
cell with 10,000 of them, here), brings JAX's counters (:meth:`Mirror.gpu_counters`) up to them
and writes the state file only when their bytes changed and no preallocated pool hides them (as
a real allocation is on the cell's path too); it runs only in a kernel the demo's startup file
started: nothing else runs it (the overhead benchmark checks that its kernels do not).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jax_nbmem.simgpu.liveness import process_start
from jax_nbmem.simgpu.placement import Place, cuda_places, jax_places, live_bytes_by_device
from jax_nbmem.simgpu.registration import RegistrarError, Registration, register, socket_path
from jax_nbmem.simgpu.simulator import STATE_ENV_VAR, SimState, StateError

__all__ = [
    "CONTEXT_BYTES",
    "beside_jax_bytes",
    "Mirror",
    "gpu_counters",
    "held_bytes",
    "memory_cap",
    "pool_bytes",
    "preallocates",
    "running",
    "start_from_environment",
    "started_mode",
]

CONTEXT_BYTES = 300 * 1024**2  # what a CUDA context takes on a large GPU, before any array
_INTERVAL_S = 0.25
_DEFAULT_FRACTION = 0.75
_RETRY_FACTOR, _RETRIES = 0.9, 60
_REGISTER_RETRY_S = 2.0


@dataclass(frozen=True)
class StartedMode:
    """How JAX's GPU allocator would behave, as the environment said when the backend started."""

    preallocate: bool
    fraction: float
    allocator: str

    @property
    def name(self) -> str:
        """A short name: ``on``, ``fraction 0.3``, ``off``, ``platform``, ``vmm``..."""
        if self.allocator == "platform":
            return "platform"
        if not self.preallocate or self.allocator == "vmm":
            return "off" if self.allocator in ("default", "bfc") else self.allocator
        return "on" if self.fraction == _DEFAULT_FRACTION else f"fraction {self.fraction:g}"


def started_mode(environ: dict[str, str] | os._Environ) -> StartedMode:
    """Read JAX's allocator variables the way jaxlib does when its backend starts."""
    preallocate = environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() not in (
        "false",
        "0",
    )
    raw = environ.get("XLA_CLIENT_MEM_FRACTION") or environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    try:
        fraction = float(raw) if raw else _DEFAULT_FRACTION
    except ValueError:
        fraction = _DEFAULT_FRACTION
    allocator = environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower() or "default"
    return StartedMode(preallocate, fraction, allocator)


def preallocates(mode: StartedMode) -> bool:
    """Whether the allocator takes its whole pool at the first allocation."""
    return mode.preallocate and mode.allocator not in ("platform", "vmm")


def pool_bytes(mode: StartedMode, total: int, free: int | None) -> int:
    """The pool a preallocating allocator takes: ``fraction`` × *total*, shrunk to fit *free*."""
    pool = int(mode.fraction * total)
    if free is None:
        return pool
    room = free - CONTEXT_BYTES
    for _ in range(_RETRIES):
        if pool <= room:
            return pool
        pool = int(pool * _RETRY_FACTOR)
    return 0


def held_bytes(
    mode: StartedMode, total: int, live: int, high_water: int, free: int | None = None
) -> int:
    """What the process would hold on a GPU of *total* bytes, *free* of them free for it.

    See the module's docstring; *free* is what the GPU had free without this process.
    """
    room = None if free is None else max(0, free - CONTEXT_BYTES)
    if mode.allocator == "platform":
        return CONTEXT_BYTES + (live if room is None else min(live, room))
    if not preallocates(mode):
        return CONTEXT_BYTES + (high_water if room is None else min(high_water, room))
    return CONTEXT_BYTES + pool_bytes(mode, total, free)


_HAMI_NUMBER = re.compile(r"\s*[+]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


def _hami_limit(text: str) -> int:
    """HAMi-core's ``get_limit_from_env``: a unit from the last character, ``strtoul(.., 0)``."""
    scale = {"g": 1024**3, "m": 1024**2, "k": 1024}.get(text[-1:].lower(), 1)
    number = _HAMI_NUMBER.match(text[:-1] if scale > 1 else text)
    if number is None:
        return 0
    digits = number[1]
    base = 16 if digits[:2] in ("0x", "0X") else 8 if digits[:1] == "0" and digits[1:] else 10
    return int(digits, base) * scale


def memory_cap(environ: dict[str, str] | os._Environ, ordinal: int = 0) -> tuple[str, int] | None:
    """The cap MPS or HAMi enforces on CUDA device *ordinal*: ``("mps" | "hami", bytes)``.

    None where neither caps it.
    """
    caps = []
    for entry in environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "").split(","):
        named, _, limit = entry.strip().partition("=")
        unit = {"M": 1024**2, "G": 1024**3}.get(limit.upper().removesuffix("B")[-1:])
        digits = limit.upper().removesuffix("B")[:-1]
        if named == str(ordinal) and unit and digits.isdigit() and int(digits):
            caps.append(("mps", int(digits) * unit))
    hami = _hami_limit(environ.get(f"CUDA_DEVICE_MEMORY_LIMIT_{ordinal}", "")) or _hami_limit(
        environ.get("CUDA_DEVICE_MEMORY_LIMIT", "")
    )
    if hami:
        caps.append(("hami", hami))
    return min(caps, key=lambda cap: cap[1]) if caps else None


def beside_jax_bytes(ordinal: int = 0) -> int:
    """What other frameworks in this process hold on CUDA device *ordinal*, beside JAX's pool.

    A kernel that also runs PyTorch, CuPy or TensorFlow holds their memory too, and a real
    driver counts it in the process's bytes. Their counters are read by jax_nbmem's own
    reader when it is loaded (looked up in ``sys.modules``, never imported: the simulated GPU
    stands alone); 0 without it. TensorFlow tells only what its tensors use.
    """
    reader = sys.modules.get("jax_nbmem.gpu.frameworks")
    if reader is None:
        return 0
    try:
        found = reader.read_frameworks(cuda_running=True)
    except Exception:
        return 0
    total = 0
    for framework in found:
        if framework.started:
            held = framework.held.get(ordinal)
            total += held if held is not None else (framework.in_use.get(ordinal) or 0)
    return total


def _backend_started() -> bool:
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None:
        return False  # JAX not even imported: nothing to mirror, and we never import it
    check = getattr(bridge, "backends_are_initialized", None)
    if callable(check):
        return bool(check())
    return bool(getattr(bridge, "_backends", None))


def _live_bytes_by_device() -> dict[int, int]:
    return live_bytes_by_device()


def _spread(live: dict[int, int], places: list[Place]) -> dict[Place, int]:
    """The live bytes on each GPU: JAX's device ``k`` stands for ``places[k % len(places)]``."""
    live_on = dict.fromkeys(places, 0)
    for device, nbytes in live.items():
        live_on[places[device % len(places)]] += nbytes
    return live_on


class Mirror:
    """The thread that keeps this process's entry in the state file (see the module)."""

    def __init__(self, state_path: str | os.PathLike[str], gpu: int | None = None) -> None:
        self.state_path = Path(state_path)
        self.gpu = gpu  # None: every GPU JAX sees (see .placement); a number: that GPU alone
        self.pid = os.getpid()  # the PID the GPU lists: the host's, once registered
        self.pidns: int | None = None  # the namespace of self.pid, once registered
        self.started_at = process_start()  # when self.pid started: its lines' start= (see liveness)
        self.registration: Registration | None = None
        self._next_registration = 0.0
        self._old: tuple[int, int | None] | None = None  # lines written under another PID
        self.mode: StartedMode | None = None
        self.written: dict[Place, int] | None = None  # what each GPU lists for this process
        self._high_water: dict[Place, int] = {}
        self._pools: dict[Place, int] = {}  # preallocated pools' sizes, fixed when taken
        self._said: str | None = None  # the state file's problem, said once
        self._looked_at: dict[int, int] | None = None  # live bytes by JAX device at a cell's end
        self._counters: dict[str, dict[str, int | None]] = {}  # see gpu_counters
        self._jax_places: list[Place] = []  # the GPUs JAX holds memory on, JAX's device 0 first
        self._uuids: list[str | None] = []  # theirs
        self._lock = threading.Lock()  # the thread and the cells' hook take turns
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jax_nbmem-simgpu", daemon=True)

    def start(self, shell: Any = None) -> Mirror:
        """Start the thread; at exit the entry is removed.

        *shell*: an IPython shell, whose ``post_execute`` event then calls
        :meth:`after_cell` (see the module's docstring).
        """
        self._thread.start()
        atexit.register(self.stop)
        if shell is not None:
            shell.events.register("post_execute", self.after_cell)
        return self

    def after_cell(self) -> None:
        """A cell has run: publish what it changed now, as NVML would see it. Never raises.

        Cheap when nothing changed: the file is read and written only when the live arrays'
        bytes did, and never once the pools are preallocated (they never change); JAX's
        counters (:meth:`gpu_counters`: the live arrays, their high-water mark) follow the
        arrays either way, so that a cell's end reads them as of that end.
        """
        try:
            if not _backend_started():  # counting JAX's arrays would start it
                return
            live = _live_bytes_by_device()
            if live == self._looked_at and self.written is not None:
                return
            if self._pools and self.written is not None and set(self._pools) == set(self.written):
                self._note_live(live)
            else:
                self.step(live)
            if self.written is not None:
                self._looked_at = live
        except Exception:  # a demo aid: it must never disturb a cell
            return

    def stop(self) -> None:
        """Stop the thread and take this process off the simulated GPU."""
        self._stop.set()
        if self.written is not None:
            with contextlib.suppress(Exception), SimState.update(self.state_path) as state:
                state.remove_process(self.pid, self.pidns)
            self.written = None
        if self.registration is not None:
            self.registration.close()
            self.registration = None

    def _registered(self) -> bool:
        """Learn this process's host PID from the registrar when one runs; False: wait."""
        if self.registration is not None:
            if self.registration.alive():
                return True
            self.registration.close()  # the registrar stopped: register again when it is back
            self.registration = None
        if not os.path.lexists(socket_path(self.state_path)):
            self._identify(os.getpid(), None, process_start())  # no registrar: a plain host
            return True
        if time.monotonic() < self._next_registration:
            return False
        try:
            registration = register(self.state_path)
        except RegistrarError as error:
            self._next_registration = time.monotonic() + _REGISTER_RETRY_S
            self._say(f"{error}; processes are listed by host PID only through it")
            return False
        if registration is None:  # gone in between
            self._identify(os.getpid(), None, process_start())
            return True
        self.registration = registration
        self._identify(registration.pid, registration.pidns, registration.start)
        return True

    def _identify(self, pid: int, pidns: int | None, start: int | None) -> None:
        self.started_at = start
        if (pid, pidns) != (self.pid, self.pidns):
            if self.written is not None and self._old is None:
                self._old = (self.pid, self.pidns)  # removed with the next write
            self.pid, self.pidns = pid, pidns

    def _say(self, problem: str) -> None:
        """Say a problem once on stderr (until another one, or none)."""
        if problem != self._said:
            self._said = problem
            print(f"jax_nbmem simulated GPU: the mirror waits: {problem}", file=sys.stderr)

    def step(self, live: dict[int, int] | None = None) -> None:
        """One look: write the entry if what the process would hold changed.

        *live*: the live arrays' bytes by JAX device, when the caller has just counted them.
        Under the state file's lock (:meth:`SimState.update`), so that the mirrors of several
        kernels, and the tenant, never lose each other's lines. A state file with a problem
        (edited by hand) is said once on stderr and left as it is until it is good again.
        """
        if not _backend_started():
            return
        with self._lock:  # the thread's look and the after-cell look register once between them
            if not self._registered():
                return
            if self.mode is None:
                self.mode = started_mode(os.environ)  # as JAX read them, give or take a moment
            live = _live_bytes_by_device() if live is None else live
            try:
                with SimState.update(self.state_path) as state:
                    self._hold(state, live)
            except StateError as error:
                self._say(str(error))
                return
            self._said = None

    def _places(self, state: SimState) -> tuple[list[Place], list[Place]]:
        """The devices this process's CUDA sees, and those of them JAX holds a pool on."""
        if self.gpu is not None:
            return [(self.gpu, None)], [(self.gpu, None)]
        cuda = cuda_places(state, os.environ)
        return cuda, jax_places(cuda)

    def _note_live(self, live: dict[int, int]) -> None:
        """Bring JAX's counters up to *live* (bytes by JAX device) without a look at the file."""
        with self._lock:
            places, counters = self._jax_places, dict(self._counters)
            if not places:
                return
            live_on = _spread(live, places)
            for place, uuid in zip(places, self._uuids, strict=True):
                high_water = self._high_water[place] = max(self._high_water.get(place, 0),
                                                           live_on[place])  # fmt: skip
                if uuid in counters:
                    counters[uuid] = {**counters[uuid], "bytes_in_use": live_on[place],
                                      "peak_bytes_in_use": high_water}  # fmt: skip
            self._counters = counters

    def _hold(self, state: SimState, live: dict[int, int]) -> None:
        cuda, places = self._places(state)
        if not places or self.mode is None:
            return
        live_on = _spread(live, places)
        self._jax_places, self._uuids = places, [state.uuid_of(*place) for place in places]
        wanted: dict[Place, int] = {}
        counters: dict[str, dict[str, int | None]] = {}
        for place in places:
            held = self._held_on(state, place, cuda.index(place), live_on[place])
            if held is None:
                continue
            wanted[place], jax_held = held
            uuid = state.uuid_of(*place)
            if uuid is not None:
                pool = max(0, jax_held - CONTEXT_BYTES)
                counters[uuid] = {
                    "bytes_in_use": live_on[place], "pool_bytes": pool,
                    "bytes_limit": pool if place in self._pools else None,
                    "peak_bytes_in_use": self._high_water[place],
                }  # fmt: skip
        if not wanted:
            return
        if self._old is not None:
            state.remove_process(*self._old)
            self._old = None
        listed = {(p.gpu, p.mig): p.used for p in state.processes() if p.pid == self.pid}
        if wanted != self.written or listed != wanted:
            state.remove_process(self.pid)
            for (gpu, mig), held_here in wanted.items():
                state.process(
                    gpu, self.pid, held_here, ends_with_process=True, mig=mig, pidns=self.pidns,
                    start=self.started_at,
                )  # fmt: skip
            self.written = wanted
        self._counters = counters

    def _held_on(
        self, state: SimState, place: Place, ordinal: int, live: int
    ) -> tuple[int, int] | None:
        """(what the process holds on *place*, JAX's part of it); None: no such device.

        *ordinal*: the device's CUDA number (MPS's and HAMi's caps and the other frameworks'
        counters go by it); *live*: JAX's live arrays there.
        """
        gpu, mig = place
        total = state.total_bytes(gpu, mig)
        if total is None or self.mode is None:
            return None
        free = state.free_bytes(gpu, leaving_out=self.pid, mig=mig)
        cap = memory_cap(os.environ, ordinal) if mig is None else None
        if cap is not None:  # see the module's docstring
            free = cap[1] if free is None else min(free, cap[1])
            total = min(total, cap[1]) if cap[0] == "hami" else total
        beside = beside_jax_bytes(ordinal)
        free = None if free is None else max(0, free - beside)
        high_water = self._high_water[place] = max(self._high_water.get(place, 0), live)
        if preallocates(self.mode):
            if place not in self._pools:  # taken once, at the first allocation, and kept
                self._pools[place] = held_bytes(self.mode, total, live, high_water, free)
            jax_held = self._pools[place]
        else:
            jax_held = held_bytes(self.mode, total, live, high_water, free)
        return jax_held + beside, jax_held

    def gpu_counters(self) -> dict[str, dict[str, int | None]]:
        """JAX's counters on the simulated GPU, by its UUID, as a kernel on a real GPU reports them.

        ``bytes_in_use`` (the live arrays), ``pool_bytes`` (what the allocator holds, less the
        CUDA context), ``bytes_limit`` (a preallocated pool's size; None: it grows) and
        ``peak_bytes_in_use``; empty until the entry is written. A kernel's beacon carries
        them where JAX, on the CPU here, has none (see :func:`gpu_counters`).
        """
        return {uuid: dict(counters) for uuid, counters in self._counters.items()}

    def _run(self) -> None:
        while not self._stop.wait(_INTERVAL_S):
            try:
                self.step()
            except Exception:  # a demo aid: it must never disturb the kernel
                continue


_started: Mirror | None = None


def _running_shell() -> Any:
    """The IPython shell this code runs in, if any: looked up, never imported."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    return get_ipython() if callable(get_ipython) else None


def running() -> bool:
    """Whether this process's mirror runs (:func:`start_from_environment` started it)."""
    return _started is not None


def gpu_counters() -> dict[str, dict[str, int | None]]:
    """This process's mirror's :meth:`Mirror.gpu_counters`; empty when no mirror runs.

    What a kernel's beacon says of its GPU memory on the simulated GPU, as a real GPU
    kernel's says it (JAX's own counters, which JAX on the CPU does not have), so that what
    reads beacons (inference in a container without the node agent) meets the same facts.
    """
    return _started.gpu_counters() if _started is not None else {}


def start_from_environment() -> Mirror | None:
    """Start this process's mirror (once) when ``$JAX_NBMEM_SIMGPU_STATE`` names a state file.

    What the IPython startup file of the demo calls (``shell-env --kernels``); in an IPython
    shell, the mirror also looks after every cell (:meth:`Mirror.after_cell`).
    """
    global _started
    path = os.environ.get(STATE_ENV_VAR)
    if _started is None and path:
        _started = Mirror(path).start(_running_shell())
    return _started
