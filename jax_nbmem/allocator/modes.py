"""Allocator modes as a user names them (``off``, ``fraction 0.3``...): parse, describe, set.

A mode is what ``%jaxalloc``, the config and a kernelspec ask for; :func:`mode_variables` turns
it into the value of every variable the installed jaxlib reads (see :mod:`.jaxlib`).
"""

from __future__ import annotations

from dataclasses import dataclass

from jax_nbmem.allocator.jaxlib import (
    ALLOCATOR,
    DEFAULT_FRACTION,
    MANAGED_VARIABLES,
    PREALLOCATE,
    JaxlibInfo,
    installed_jaxlib,
)
from jax_nbmem.text import parse_number, printable

__all__ = ["AllocatorMode", "ModeError", "mode_forms", "mode_variables", "parse_mode", "usage"]

_ALLOCATOR_HELP = {
    "default": "jaxlib's default allocator (BFC), preallocation as configured",
    "bfc": "XLA's best-fit-with-coalescing allocator (the default), preallocation as configured",
    "platform": "CUDA malloc/free for every buffer: no pool, frees memory, slow",
    "cuda_async": "CUDA's stream-ordered allocator (cudaMallocAsync): with preallocation on it "
    "takes its pool when the backend starts and keeps it, and the fraction is no cap",
    "vmm": "CUDA virtual-memory-management allocator (jaxlib 0.10+): no preallocation, grows "
    "on demand up to the fraction; memory_stats() reports nothing",
    "address": "a synchronous passthrough (jaxlib 0.11+): each buffer allocated and freed "
    "directly, bypassing BFC; no pool",
}


class ModeError(ValueError):
    """A mode string that is not one of the valid forms; the message names the valid forms."""


@dataclass(frozen=True)
class AllocatorMode:
    """A mode a user asks for: ``on``, ``off``, ``fraction`` (with ``fraction``) or an allocator."""

    name: str
    fraction: float | None = None

    def __str__(self) -> str:
        return f"fraction {self.fraction:g}" if self.name == "fraction" else self.name

    def describe(self) -> str:
        """A short phrase saying what JAX will do in this mode."""
        if self.name == "auto":
            return "chosen when applied, from what the GPU holds (see the reason)"
        if self.name == "on":
            return (
                f"JAX's default: preallocate {DEFAULT_FRACTION:.0%} of GPU memory at the first "
                "allocation"
            )
        if self.name == "off":
            return "no preallocation: allocate on demand"
        if self.name == "fraction":
            return f"preallocate {self.fraction:.0%} of GPU memory at the first allocation"
        return f"{self.name} allocator: {_ALLOCATOR_HELP.get(self.name, 'as jaxlib defines it')}"


def mode_forms(jaxlib: JaxlibInfo | None = None) -> list[str]:
    """Every form a mode may take with the installed jaxlib, written one way everywhere.

    ``on``, ``off``, ``fraction F``, ``auto``, then the allocators this jaxlib accepts. The
    magic, the CLI, their help texts and every error message name modes with this list.
    """
    jaxlib = jaxlib or installed_jaxlib()
    return ["on", "off", "fraction F", "auto", *jaxlib.allocators]


def usage(jaxlib: JaxlibInfo | None = None) -> str:
    """The valid forms of a mode, for error messages and help."""
    return f"valid modes: {', '.join(mode_forms(jaxlib))} (F: 0 < F <= 1)"


def parse_mode(text: str, jaxlib: JaxlibInfo | None = None) -> AllocatorMode:
    """Parse ``"off"``, ``"fraction 0.3"`` (also ``fraction=0.3``) or an allocator name.

    Raises ModeError naming the valid forms for anything else, including values the installed
    jaxlib would reject (an unknown allocator makes jaxlib raise, and JAX carries on without
    its GPU backend).
    """
    jaxlib = jaxlib or installed_jaxlib()
    words = text.replace("=", " ").split()
    if not words:
        raise ModeError(f"no mode given; {usage(jaxlib)}")
    name, rest = words[0].lower(), words[1:]
    if name == "fraction":
        if len(rest) != 1:
            raise ModeError(f"'fraction' takes exactly one number; {usage(jaxlib)}")
        try:
            fraction = parse_number(rest[0], "fraction", low=0.0, high=1.0)
        except ValueError as exc:
            raise ModeError(f"{exc}; {usage(jaxlib)}") from None
        return AllocatorMode("fraction", fraction)
    if rest:
        extra = printable(" ".join(rest))
        raise ModeError(f"unexpected arguments after {name!r}: {extra}; {usage(jaxlib)}")
    if name in ("on", "off", "auto") or name in jaxlib.allocators:
        return AllocatorMode(name)
    if name in _ALLOCATOR_HELP:
        raise ModeError(
            f"allocator {name!r} is not accepted by the installed jaxlib {jaxlib.version} "
            f"(JAX would start without its GPU backend); {usage(jaxlib)}"
        )
    raise ModeError(f"unknown mode {name!r}; {usage(jaxlib)}")


def mode_variables(mode: AllocatorMode, jaxlib: JaxlibInfo | None = None) -> dict[str, str | None]:
    """The value of every managed variable in ``mode``; None means the variable must be unset.

    Each mode says something about every variable, so switching modes never leaves a stale one
    behind — in particular never both fraction names at once, which jaxlib refuses.
    """
    jaxlib = jaxlib or installed_jaxlib()
    values: dict[str, str | None] = dict.fromkeys(MANAGED_VARIABLES)
    # "auto" is resolved to one of the others before it is applied; as a kernelspec's mode it
    # sets nothing, and the extension decides when it loads.
    if mode.name == "off":
        values[PREALLOCATE] = "false"
    elif mode.name == "fraction":
        values[jaxlib.fraction_variable] = f"{mode.fraction:g}"
    elif mode.name != "on":
        values[ALLOCATOR] = mode.name
    return values
