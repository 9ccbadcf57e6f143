"""Other frameworks' GPU memory in this process: PyTorch, CuPy, TensorFlow, read by their counters.

Many notebooks import one of them beside JAX, and JAX's 75% pool then starves it inside the same
kernel. Each is read only through ``sys.modules`` (never imported here) and only once it has
started on the GPU by itself, because asking can start it:

* PyTorch: ``torch.cuda.is_initialized()`` first (it starts nothing), then, per device,
  ``torch.cuda.memory_reserved(i)`` (what its caching allocator holds) and
  ``memory_allocated(i)`` (what its tensors use): both return 0 without touching CUDA while
  CUDA is not initialized, and read the allocator's counters otherwise.
* CuPy: its default memory pool's ``total_bytes()`` (held) and ``used_bytes()`` (in use), for
  the current device only (asking another device would make it current, creating a context
  there). The pool creates its per-device pools on first use, and a CUDA call may create a
  context; so it is read only when CUDA already runs in this process (the caller says so:
  NVML lists the process on a GPU), where CuPy shares the process's primary context.
* TensorFlow: ``get_memory_info`` starts TensorFlow's GPU runtime (which takes most of the GPU
  by default) when it has not started; so only when its eager context is already initialised
  (``context._context._context_handle`` set, its logical devices listed), and then its
  ``current`` bytes (in use; TensorFlow tells nothing of the pool it holds, so that part stays
  in "the rest").

No function here raises; a value that cannot be read is None with the reason.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from jax_nbmem.units import format_bytes

__all__ = [
    "FRAMEWORKS",
    "FrameworkMemory",
    "framework_of_oom",
    "imported_frameworks",
    "read_frameworks",
    "split_lines",
    "split_own_memory",
]

FRAMEWORKS = ("torch", "cupy", "tensorflow")
# The out-of-memory error each raises, by class name and the module it comes from.
_OOM_CLASSES = {
    "torch": ("OutOfMemoryError",),  # torch.OutOfMemoryError (torch.cuda.OutOfMemoryError)
    "cupy": ("OutOfMemoryError",),  # cupy.cuda.memory.OutOfMemoryError
    "tensorflow": ("ResourceExhaustedError",),  # tf.errors.ResourceExhaustedError
}
_MAX_CHAIN = 50


@dataclass(frozen=True)
class FrameworkMemory:
    """One framework's GPU memory in this process, by CUDA device ordinal (the process's order).

    ``started`` is False when it is imported but has not started on the GPU (then nothing is
    read, and ``reason`` says why). ``held`` is what its allocator holds from the GPU
    (None where the framework does not tell it: TensorFlow), ``in_use`` what its arrays use.
    """

    name: str
    started: bool
    held: dict[int, int | None] = field(default_factory=dict)
    in_use: dict[int, int | None] = field(default_factory=dict)
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly, devices as strings of their ordinals."""
        return {
            "name": self.name,
            "started": self.started,
            "held_bytes": {str(k): v for k, v in self.held.items()},
            "in_use_bytes": {str(k): v for k, v in self.in_use.items()},
            "reason": self.reason,
        }


def imported_frameworks(modules: Mapping[str, ModuleType] | None = None) -> list[str]:
    """The frameworks the user has imported in this process, in :data:`FRAMEWORKS` order."""
    modules = sys.modules if modules is None else modules
    return [name for name in FRAMEWORKS if modules.get(name) is not None]


def read_frameworks(
    *, cuda_running: bool | None, modules: Mapping[str, ModuleType] | None = None
) -> list[FrameworkMemory]:
    """Each imported framework's counters, where reading them starts nothing.

    *cuda_running*: whether this process already has CUDA running on a GPU (NVML lists it;
    None: not known), which CuPy's reading needs (see the module).
    """
    modules = sys.modules if modules is None else modules
    readers = {"torch": _torch, "cupy": _cupy, "tensorflow": _tensorflow}
    found = []
    for name in imported_frameworks(modules):
        try:
            found.append(readers[name](modules[name], cuda_running, modules))
        except Exception as exc:  # a framework's internals moved: said, never raised
            found.append(FrameworkMemory(name, False, reason=f"cannot be read: {exc!r}"[:200]))
    return found


def _torch(torch: Any, _cuda_running: bool | None, _modules: Mapping) -> FrameworkMemory:
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return FrameworkMemory("torch", False, reason="imported; CUDA not initialized by it")
    held, in_use = {}, {}
    for device in range(int(cuda.device_count())):
        held[device] = int(cuda.memory_reserved(device))
        in_use[device] = int(cuda.memory_allocated(device))
    return FrameworkMemory("torch", True, held, in_use)


def _cupy(cupy: Any, cuda_running: bool | None, _modules: Mapping) -> FrameworkMemory:
    if not cuda_running:
        return FrameworkMemory(
            "cupy", False, reason="imported; CUDA not seen running in this process, and "
            "asking CuPy's pool could start it",
        )  # fmt: skip
    pool = cupy.get_default_memory_pool()
    device = int(cupy.cuda.runtime.getDevice())
    held = int(pool.total_bytes())
    if held == 0:
        return FrameworkMemory("cupy", False, reason="imported; its pool holds nothing")
    return FrameworkMemory("cupy", True, {device: held}, {device: int(pool.used_bytes())})


def _tensorflow(tf: Any, _cuda_running: bool | None, modules: Mapping) -> FrameworkMemory:
    eager = modules.get("tensorflow.python.eager.context")
    context = getattr(eager, "_context", None)
    if context is None or getattr(context, "_context_handle", None) is None:
        return FrameworkMemory(
            "tensorflow", False, reason="imported; its runtime has not started (asking would "
            "start it and take most of the GPU)",
        )  # fmt: skip
    devices = [d for d in (getattr(context, "_logical_devices", None) or ())
               if getattr(d, "device_type", None) == "GPU"]  # fmt: skip
    if not devices:
        return FrameworkMemory("tensorflow", False, reason="started without a GPU")
    held: dict[int, int | None] = {}
    in_use: dict[int, int | None] = {}
    for number, device in enumerate(devices):
        info = context.get_memory_info(f"GPU:{number}")
        held[number] = None  # TensorFlow does not report the pool its allocator holds
        in_use[number] = int(info["current"])
        del device
    return FrameworkMemory("tensorflow", True, held, in_use)


def framework_of_oom(exc: BaseException | None) -> str | None:
    """The framework whose out-of-memory error *exc* is (or was raised from), else None.

    Matched by class name and the top module of its class (never imported): torch's
    ``OutOfMemoryError``, CuPy's ``OutOfMemoryError``, TensorFlow's ``ResourceExhaustedError``.
    """
    seen: set[int] = set()
    pending = [exc]
    while pending and len(seen) < _MAX_CHAIN:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        for cls in type(current).__mro__:
            top = (getattr(cls, "__module__", "") or "").split(".")[0]
            if cls.__name__ in _OOM_CLASSES.get(top, ()):
                return top
        pending.append(current.__cause__)
        pending.append(current.__context__)
    return None


def split_own_memory(
    nvml_bytes: Mapping[int, int | None],
    order: list[int],
    jax_held: Mapping[int, int | None],
    frameworks: list[FrameworkMemory],
    collective_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """This process's GPU memory on each GPU, split into JAX, each framework, and the rest.

    *nvml_bytes*: what NVML says the process holds, by GPU index; *order*: the GPU indices in
    CUDA's device order (ordinal i is ``order[i]``); *jax_held*: JAX's pool by ordinal (None:
    not known, e.g. vmm, which reports nothing); *collective_bytes*: what JAX's collective
    allocator took per GPU (outside its pool's counters). ``other_bytes`` is CUDA's contexts
    (one per GPU per process: every framework here shares CUDA's primary context, and no API
    tells its size) and everything no counter reports (libraries' workspaces, TensorFlow's
    pool); None when a part is unknown. Only GPUs where the process holds memory or a
    framework does.
    """
    rows = []
    for ordinal, index in enumerate(order):
        used = nvml_bytes.get(index)
        parts: dict[str, int | None] = {}
        if ordinal in jax_held:
            parts["jax_pool"] = jax_held[ordinal]
            if collective_bytes:
                parts["jax_collective"] = collective_bytes
        for framework in frameworks:
            if framework.started and ordinal in framework.held:
                held = framework.held[ordinal]
                # TensorFlow tells only what its tensors use: its pool is in the rest.
                parts[framework.name] = held if held is not None else framework.in_use[ordinal]
        if not used and not parts:
            continue
        known = [v for v in parts.values() if v is not None]
        other = None
        if used is not None and len(known) == len(parts):
            other = used - sum(known)
        rows.append({
            "gpu": index,
            "ordinal": ordinal,
            "nvml_bytes": used,
            "parts": parts,
            # Counters and NVML are read a moment apart: a negative rest is that moment.
            "other_bytes": max(0, other) if other is not None else None,
        })  # fmt: skip
    return rows


def split_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per GPU: ``GPU 0: 61.0 GiB = JAX pool 45.0 GiB + torch 12.0 GiB + ...``."""
    names = {"jax_pool": "JAX pool", "jax_collective": "JAX collectives",
             "torch": "PyTorch", "cupy": "CuPy", "tensorflow": "TensorFlow (in use)"}  # fmt: skip
    lines = []
    for row in rows:

        def said(value: int | None) -> str:
            return format_bytes(value, missing="unknown")

        pieces = [f"{names.get(k, k)} {said(v)}" for k, v in row["parts"].items()]
        pieces.append(f"CUDA contexts and the rest {said(row['other_bytes'])}")
        lines.append(f"GPU {row['gpu']}: {said(row['nvml_bytes'])} = " + " + ".join(pieces))
    return lines
