"""Small stand-ins for PyTorch, CuPy and TensorFlow: only the counters jax_nbmem reads.

These are NOT the frameworks. No GPU is on the machines the suite runs on, so a test that needs
"torch is imported and holds 2 GiB on CUDA device 0" places one of these in ``sys.modules``
under the framework's name (``install``) and takes it out afterwards. Each offers exactly the
calls :mod:`jax_nbmem.gpu.frameworks` makes, with the meaning the real one documents, and
records every call, so that a test can check that nothing was asked of a framework that had
not started (asking could start it). The real frameworks are checked on a real GPU by
``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager

GiB = 1024**3


class _Calls(list):
    """The names of the calls made on a stand-in, in order."""


def torch_standin(initialized: bool, reserved: dict[int, int], allocated: dict[int, int]):
    """``torch`` whose ``torch.cuda`` says what ``is_initialized()`` and the counters return."""
    calls = _Calls()
    cuda = types.SimpleNamespace()

    def is_initialized():
        calls.append("is_initialized")
        return initialized

    def device_count():
        calls.append("device_count")
        return len(reserved)

    def memory_reserved(device):
        calls.append(f"memory_reserved({device})")
        return reserved[device] if initialized else 0

    def memory_allocated(device):
        calls.append(f"memory_allocated({device})")
        return allocated[device] if initialized else 0

    cuda.is_initialized, cuda.device_count = is_initialized, device_count
    cuda.memory_reserved, cuda.memory_allocated = memory_reserved, memory_allocated
    module = types.ModuleType("torch")
    module.cuda, module.calls = cuda, calls

    class OutOfMemoryError(RuntimeError):
        """Stands for ``torch.OutOfMemoryError``."""

    OutOfMemoryError.__module__ = "torch"
    module.OutOfMemoryError = OutOfMemoryError
    return module


def cupy_standin(device: int, total: int, used: int):
    """``cupy`` whose default memory pool holds *total* bytes on *device*, *used* of them."""
    calls = _Calls()
    pool = types.SimpleNamespace(
        total_bytes=lambda: calls.append("total_bytes") or total,
        used_bytes=lambda: calls.append("used_bytes") or used,
    )
    module = types.ModuleType("cupy")
    module.calls = calls
    module.get_default_memory_pool = lambda: calls.append("get_default_memory_pool") or pool
    runtime = types.SimpleNamespace(getDevice=lambda: calls.append("getDevice") or device)
    module.cuda = types.SimpleNamespace(runtime=runtime)

    class OutOfMemoryError(MemoryError):
        """Stands for ``cupy.cuda.memory.OutOfMemoryError``."""

    OutOfMemoryError.__module__ = "cupy.cuda.memory"
    module.OutOfMemoryError = OutOfMemoryError
    return module


def tensorflow_standins(started: bool, current: dict[int, int]):
    """``tensorflow`` and its ``tensorflow.python.eager.context`` (whose ``_context`` it reads)."""
    calls = _Calls()
    module = types.ModuleType("tensorflow")
    module.calls = calls
    eager = types.ModuleType("tensorflow.python.eager.context")
    context = types.SimpleNamespace(_context_handle=object() if started else None)
    context._logical_devices = [
        types.SimpleNamespace(device_type="GPU", name=f"/device:GPU:{i}") for i in current
    ]

    def get_memory_info(device):
        calls.append(f"get_memory_info({device})")
        return {"current": current[int(device.split(":")[1])], "peak": 0}

    context.get_memory_info = get_memory_info
    eager._context = context

    class ResourceExhaustedError(Exception):
        """Stands for ``tf.errors.ResourceExhaustedError``."""

    ResourceExhaustedError.__module__ = "tensorflow.python.framework.errors_impl"
    module.ResourceExhaustedError = ResourceExhaustedError
    return {"tensorflow": module, "tensorflow.python.eager.context": eager}


@contextmanager
def installed(**modules):
    """Place stand-ins in ``sys.modules`` under their names, and take them out afterwards."""
    before = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, old in before.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
