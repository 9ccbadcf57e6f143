"""What NVML's errors mean for users, in one line each; part of :mod:`jax_nbmem.gpu.nvml`.

Imports no pynvml: the functions that read a pynvml error take the pynvml module as ``nv``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DEVICE_GONE_ERRORS",
    "GLOBAL_ERRORS",
    "SESSION_ENDING",
    "device_problem",
    "error_name",
    "error_text",
    "gpu_problem",
    "unlisted",
]

# NVML errors (names after NVML_ERROR_) that stop NVML as a whole, and what to tell users.
GLOBAL_ERRORS = {
    "LIBRARY_NOT_FOUND": (
        "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine"
    ),
    "DRIVER_NOT_LOADED": "the NVIDIA driver is not loaded, so NVML cannot read the GPUs",
    "NO_PERMISSION": "no permission to read the GPUs through NVML",
    "LIB_RM_VERSION_MISMATCH": (
        "the NVML library and the NVIDIA kernel driver differ in version "
        "(driver updated without a reboot?)"
    ),
    "UNINITIALIZED": "NVML was shut down underneath jax_nbmem; reconnecting",
}
# Of those, the ones that end a running session (a device call refused for lack of permission,
# say, does not: the other calls still work).
SESSION_ENDING = frozenset(GLOBAL_ERRORS) - {"NO_PERMISSION"}
# Errors on one device after which its handle is no good until NVML is set up again.
DEVICE_GONE_ERRORS = {
    "GPU_IS_LOST": (
        "GPU {index} is lost (fell off the bus or needs a reset); its memory cannot be read"
    ),
    "RESET_REQUIRED": "GPU {index} needs a reset before NVML can read it",
    "GPU_NOT_FOUND": "GPU {index} is no longer there",
    "INVALID_ARGUMENT": "GPU {index} is no longer known to NVML",
}
# Errors the callers act on that are neither of those.
_OTHER_ERRORS = ("FUNCTION_NOT_FOUND", "NOT_SUPPORTED", "INSUFFICIENT_SIZE")
_UNLISTED = "process list unreadable"


def error_name(nv: Any, error: BaseException) -> str | None:
    """Return the NVML_ERROR_ name (without prefix) of a pynvml error, if it is one."""
    value = getattr(error, "value", None)
    for name in (*GLOBAL_ERRORS, *DEVICE_GONE_ERRORS, *_OTHER_ERRORS):
        if value is not None and getattr(nv, f"NVML_ERROR_{name}", object()) == value:
            return name
    return None


def error_text(error: BaseException) -> str:
    """The error's text; never raises."""
    try:
        return str(error)
    except Exception:  # pynvml formats some codes by calling into the library again
        return f"NVML error {getattr(error, 'value', '?')}"


def device_problem(nv: Any, index: int, error: BaseException) -> str:
    """What a failed call on GPU ``index`` means, in one line."""
    name = error_name(nv, error)
    if name in DEVICE_GONE_ERRORS:
        return DEVICE_GONE_ERRORS[name].format(index=index)
    if name in SESSION_ENDING:
        return GLOBAL_ERRORS[name]
    return f"GPU {index}: NVML says {error_text(error)}"


def unlisted(problem: str | None) -> str:
    """The problem of a process list that could not be read, for this cause."""
    return f"{_UNLISTED}: {problem}" if problem else _UNLISTED


def gpu_problem(memory_problem: str | None, list_problem: str | None) -> str | None:
    """One GPU's problem in one line, from its memory reading's and its process list's.

    A cause both share (a lost GPU fails both) is said once: "GPU 1 is lost ...; process list
    unreadable". ``None`` when neither has a problem.
    """
    if memory_problem and list_problem and memory_problem in list_problem:
        list_problem = list_problem.replace(memory_problem, "").strip(" :;") or None
    return "; ".join(dict.fromkeys(filter(None, [memory_problem, list_problem]))) or None
