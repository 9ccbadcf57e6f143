"""A simulated NVIDIA GPU, for the tests and for the demo on a machine without one.

A C stand-in for ``libnvidia-ml.so.1`` (``nvml_stub.c``) that the real ``pynvml`` loads like
the real library, reporting whatever a state file says; :mod:`.simulator` builds it, and
:mod:`.state` writes and reads those files by the same rules as the stand-in. It stands apart
from the rest of jax_nbmem: it imports nothing of the package but `rootfiles` (how root opens
files; never pynvml), and nothing in the package imports it.
"""

from jax_nbmem.simgpu.simulator import (
    GIB,
    LIBRARY_NAME,
    NVML_ERRORS,
    STATE_ENV_VAR,
    SimState,
    StateError,
    build,
    demo_state,
    env_for_subprocess,
    preload,
)

__all__ = [
    "GIB",
    "LIBRARY_NAME",
    "NVML_ERRORS",
    "STATE_ENV_VAR",
    "SimState",
    "StateError",
    "build",
    "demo_state",
    "env_for_subprocess",
    "preload",
]
