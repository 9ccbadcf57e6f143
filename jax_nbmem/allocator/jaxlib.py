"""What the installed jaxlib reads: its allocator variables, their values, and how it reads them.

JAX's GPU client reads its allocator settings from four environment variables, once, when the
backend starts (``jaxlib/xla_client.py``, ``generate_pjrt_gpu_plugin_options``, called when the
CUDA plugin registers; ``jax.extend.backend.clear_backends()`` — ``jax.clear_backends()`` before
jax 0.4.36 — makes a new client from the same options, never re-reading the environment; what
else changes the outcome is in :mod:`.extras`). This module knows
those variables, which names and values the *installed* jaxlib accepts, and what a set of variables
means. It never imports jax or jaxlib: reading the version and the source text is enough, and an
import could be the first step towards starting the backend in the wrong mode.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from jax_nbmem.allocator.extras import (
    FROM_ENVIRON,
    ClientOptions,
    Extras,
    client_options,
    read_extras,
)

__all__ = [
    "ALLOCATOR",
    "DEFAULT_FRACTION",
    "FRACTION",
    "FRACTION_DEPRECATED",
    "MANAGED_VARIABLES",
    "PREALLOCATE",
    "RETRY_FACTOR",
    "Effective",
    "JaxlibInfo",
    "effective",
    "installed_jaxlib",
]

PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
FRACTION = "XLA_CLIENT_MEM_FRACTION"
FRACTION_DEPRECATED = "XLA_PYTHON_CLIENT_MEM_FRACTION"
ALLOCATOR = "XLA_PYTHON_CLIENT_ALLOCATOR"
MANAGED_VARIABLES = (PREALLOCATE, FRACTION, FRACTION_DEPRECATED, ALLOCATOR)

DEFAULT_FRACTION = 0.75
# jaxlib turns preallocation off only for these exact spellings; "no" or "off" leave it on.
_PREALLOCATE_FALSE = ("false", "False", "0")
# When BFC cannot take the region it wants it asks again for 0.9 times as much, and again,
# until it gets it or the size falls below the allocation that asked (``BFCAllocator::Extend``,
# ``kBackpedalFactor = 0.9``, in XLA's tsl bfc_allocator.cc; only the first time it backs off):
# a late preallocator holds fraction x total x 0.9**k.
RETRY_FACTOR = 0.9

# Fallback when the installed xla_client.py cannot be read: values by the release that added
# them (checked against the xla_client.py of jaxlib 0.4.26, 0.4.30, 0.4.31, 0.4.33-0.4.35,
# 0.5.3, 0.6.2, 0.7.2, 0.8.3, 0.9.0, 0.9.2, 0.10.0, 0.10.2 and jax's main branch).
_ALLOCATORS_BY_VERSION = (
    ((0, 0), ("default", "platform", "bfc", "cuda_async")),
    ((0, 10), ("vmm",)),
    ((0, 11), ("address",)),
)
# XLA_CLIENT_MEM_FRACTION is read from jaxlib 0.4.32 on (yanked from PyPI, still installable
# by its exact version); from then on the deprecated name is still read, and both at once raise
# ValueError.
_NEW_FRACTION_SINCE = (0, 4, 32)

# What each allocator does with the pool (XLA's gpu_helpers.cc, bfc_allocator.cc,
# gpu_cudamallocasync_allocator.cc, se_gpu_pjrt_client.cc): whether it takes
# fraction x total up front when preallocation is on (BFC at its first allocation, cuda_async
# when the backend starts: CreateCudaAsyncAllocator calls SetStreamAndPreallocateMemory at
# client creation), and whether that fraction caps it. None: not modelled.
_POOLS = {
    "default": (True, True),  # BFC
    "bfc": (True, True),
    "cuda_async": (True, False),  # takes its pool when the backend starts and keeps it; no cap
    "platform": (False, False),  # cudaMalloc per buffer: no pool at all
    # A DeviceAddressAllocator (CudaDeviceAddressVmmAllocator::Create), not a
    # MultiDeviceAdapter: no preallocation, memory_fraction caps it, memory_stats() is None.
    "vmm": (False, True),
    # jaxlib 0.11: a synchronous passthrough (StreamExecutorAddressAllocator) that bypasses
    # BFC: each buffer allocated and freed directly, no pool (jax's gpu_memory_allocation.rst).
    "address": (False, False),
}


@dataclass(frozen=True)
class JaxlibInfo:
    """What the installed jaxlib accepts. ``version`` is None when jaxlib is not installed.

    ``fraction_variable`` is the name a mode sets; ``fraction_variables`` every name it reads,
    the first one winning (by default: both names when it knows the new one, which it refuses
    together, else the deprecated one alone).
    """

    version: str | None
    fraction_variable: str
    allocators: tuple[str, ...]
    learned_from: str
    fraction_variables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.fraction_variables:
            reads = (FRACTION, FRACTION_DEPRECATED)
            if self.fraction_variable != FRACTION:
                reads = (self.fraction_variable,)
            object.__setattr__(self, "fraction_variables", reads)

    @property
    def refuses_both_fractions(self) -> bool:
        """Whether jaxlib raises ValueError when both fraction names are set."""
        return (
            FRACTION in self.fraction_variables and FRACTION_DEPRECATED in self.fraction_variables
        )

    def describe(self) -> str:
        """One line: version, fraction variable, allocator values, and where we learned them."""
        version = f"jaxlib {self.version}" if self.version else "jaxlib not installed"
        reads = " or ".join(self.fraction_variables)
        return (
            f"{version}: fraction variable {self.fraction_variable} (reads {reads}), "
            f"allocators {', '.join(self.allocators)} (from {self.learned_from})"
        )


@dataclass(frozen=True)
class Effective:
    """What jaxlib will make of a set of variables, read the way ``xla_client.py`` reads them.

    ``error`` is set when jaxlib would refuse them (it raises ValueError, and JAX carries on
    without its GPU backend). ``extras`` are the settings beyond the allocator trio
    (:mod:`.extras`); ``options`` what ``jax_pjrt_client_create_options`` overrides;
    ``chosen_allocator`` the allocator the variables (or options) name when something else
    (``XLA_FLAGS``' command-buffer update mode) makes another one run.
    """

    allocator: str
    preallocate: bool
    fraction: float
    fraction_set: bool
    error: str | None = None
    extras: Extras = Extras()
    options: ClientOptions = ClientOptions(None)
    chosen_allocator: str | None = None

    @property
    def collective_bytes(self) -> int | None:
        """What the collective-memory allocator takes per GPU at start, outside memory_stats().

        None when none is asked for, and with ``platform`` (XLA warns and takes none) or
        ``vmm`` (its branch builds no collective allocator).
        """
        if self.error or self.allocator in ("platform", "vmm", "address"):
            return None
        return self.extras.collective_bytes

    @property
    def async_prealloc(self) -> bool:
        """Whether ``cuda_async`` takes memory up front with preallocation off (TF's variable)."""
        return self.allocator == "cuda_async" and bool(self.extras.async_prealloc)

    @property
    def mode_name(self) -> str:
        """The closest ``%jaxalloc`` mode: ``off``, ``fraction 0.3``, ``off, cuda_async``..."""
        parts = []
        if self.allocator == "platform":
            return "platform"
        if not self.preallocate:
            parts.append("off")
        elif self.fraction_set:
            parts.append(f"fraction {self.fraction:g}")
        if self.allocator not in ("default", "bfc") or not parts:
            parts.append(self.allocator if self.allocator != "default" else "on")
        return ", ".join(parts)

    @property
    def pool_fraction(self) -> float | None:
        """The share of the GPU's total taken at the first allocation and kept; 0 for none.

        None when jaxlib would refuse the settings or jax_nbmem does not model the allocator.
        """
        if self.error:
            return None
        takes_pool, _ = _POOLS.get(self.allocator, (None, None))
        if takes_pool is None:
            return None
        if self.allocator == "cuda_async" and not self.preallocate and self.extras.async_prealloc:
            # -1 takes the whole pool size; N > 0 takes N bytes, no share of the GPU.
            return self.fraction if self.extras.async_prealloc == -1 else None
        return self.fraction if takes_pool and self.preallocate else 0.0

    @property
    def capped(self) -> bool | None:
        """Whether the fraction caps what JAX may hold: BFC yes, cuda_async no; None: unknown."""
        return _POOLS.get(self.allocator, (None, None))[1]

    def describe(self) -> str:
        """A sentence saying what JAX does on a GPU with these settings."""
        if self.error:
            return f"invalid — jaxlib will refuse these settings: {self.error}"
        share = f"{self.fraction:.0%}"
        if self.allocator == "platform":
            return (
                "platform allocator: allocates exactly what arrays need and frees it (slow); "
                "no pool, and memory_stats() reports nothing"
            )
        if self.allocator == "vmm":
            forced = " (forced by XLA_FLAGS' command-buffer update mode)" if (
                self.chosen_allocator and self.chosen_allocator != "vmm") else ""  # fmt: skip
            return (
                f"vmm allocator{forced}: no preallocation, grows on demand up to {share} of "
                "GPU memory; memory_stats() reports nothing"
            )
        if self.allocator == "address":
            return (
                "address allocator: a synchronous passthrough that allocates and frees each "
                "buffer directly, bypassing BFC; no pool"
            )
        if self.allocator == "cuda_async":
            if self.preallocate or self.extras.async_prealloc == -1:
                return (
                    f"cuda_async allocator, takes a pool of {share} of GPU memory when the "
                    "backend starts and keeps it; the fraction is no cap: it grows past it"
                )
            if self.extras.async_prealloc:
                return (
                    f"cuda_async allocator, takes {self.extras.async_prealloc} bytes when the "
                    "backend starts (TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC); grows on demand"
                )
            return (
                "cuda_async allocator, no preallocation: takes nothing up front, grows on "
                "demand with no cap; what it keeps after freeing depends on the XLA version"
            )
        if self.preallocate:
            return (
                f"BFC allocator, preallocates {share} of GPU memory at the first allocation "
                f"(less when that much is not free: it retries at {RETRY_FACTOR:g}x steps)"
            )
        return f"BFC allocator, no preallocation (grows on demand up to {share})"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _xla_client_source() -> str | None:
    """The text of the installed ``jaxlib/xla_client.py``, found without importing jaxlib."""
    try:
        spec = importlib.util.find_spec("jaxlib")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            return (Path(folder) / "xla_client.py").read_text(encoding="utf-8")
        except OSError:
            continue
    return None


def _strings(node: ast.AST) -> tuple[str, ...] | None:
    """The strings of a literal tuple, list or set of strings; None for anything else."""
    if not isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return None
    values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
    if len(values) != len(node.elts) or not all(isinstance(v, str) for v in values):
        return None
    return tuple(values)


def _plugin_options_scope(source: str) -> ast.AST | None:
    """The function that reads the allocator variables (the whole module if it moved)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "generate_pjrt_gpu_plugin_options":
            return node
    return tree


def _allocators_in_source(source: str) -> tuple[str, ...] | None:
    """The values ``allocator not in ...`` accepts, in either shape jaxlib has written it.

    Up to jaxlib 0.10 the tuple is written in the test itself; from 0.11 it is a name
    (``allowed_allocators = (...)``) assigned before it.
    """
    scope = _plugin_options_scope(source)
    if scope is None:
        return None
    named: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, values = node.targets[0], _strings(node.value)
            if isinstance(target, ast.Name) and values is not None:
                named[target.id] = values
    for node in ast.walk(scope):
        if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name)):
            continue
        if node.left.id != "allocator" or not isinstance(node.ops[0], ast.NotIn):
            continue
        accepted = node.comparators[0]
        values = _strings(accepted)
        if values is None and isinstance(accepted, ast.Name):
            values = named.get(accepted.id)
        if values:
            return values
    return None


def _fractions_in_source(source: str) -> tuple[str, ...] | None:
    """The fraction variables jaxlib reads (``os.getenv`` of each), new name first."""
    scope = _plugin_options_scope(source)
    if scope is None:
        return None
    read = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            if isinstance(node.args[0].value, str) and node.args[0].value in (
                FRACTION,
                FRACTION_DEPRECATED,
            ):
                read.add(node.args[0].value)
    return tuple(name for name in (FRACTION, FRACTION_DEPRECATED) if name in read) or None


def _jaxlib_info(version: str | None, source: str | None) -> JaxlibInfo:
    if version is None:
        # Nothing to read: name what current jaxlib reads, so the variables are right once it is.
        allocators = tuple(v for _, values in _ALLOCATORS_BY_VERSION for v in values)
        return JaxlibInfo(None, FRACTION, allocators, "no jaxlib installed; newest known names")
    release = _version_tuple(version)
    table_allocators = tuple(
        value for since, values in _ALLOCATORS_BY_VERSION if release >= since for value in values
    )
    table_fractions = (
        (FRACTION, FRACTION_DEPRECATED)
        if release >= _NEW_FRACTION_SINCE
        else (FRACTION_DEPRECATED,)
    )
    allocators = _allocators_in_source(source) if source else None
    fractions = _fractions_in_source(source) if source else None
    # Each is decided on its own: a source whose allocator test moved still names its
    # fraction variables, and the other way round.
    from_source = [
        what for what, found in (("allocators", allocators), ("fraction names", fractions)) if found
    ]
    allocators = allocators or table_allocators
    fractions = fractions or table_fractions
    if len(from_source) == 2:
        learned_from = "installed jaxlib/xla_client.py"
    elif from_source:
        learned_from = (
            f"{from_source[0]} from the installed jaxlib/xla_client.py, the rest from the "
            f"version table for {version}"
        )
    else:
        learned_from = f"version table for {version}"
    return JaxlibInfo(version, fractions[0], allocators, learned_from, fractions)


@lru_cache(maxsize=1)
def installed_jaxlib() -> JaxlibInfo:
    """Describe the installed jaxlib (cached: it does not change inside a running kernel)."""
    try:
        version: str | None = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return _jaxlib_info(version, _xla_client_source() if version else None)


def effective(
    environ: Mapping[str, str], jaxlib: JaxlibInfo | None = None, options: Any = FROM_ENVIRON
) -> Effective:
    """Read ``environ`` exactly as jaxlib will when its GPU backend starts.

    *options*: ``jax_pjrt_client_create_options`` as the process's JAX holds it (see
    :func:`.extras.live_client_options`); by default what ``environ`` says of it.
    """
    jaxlib = jaxlib or installed_jaxlib()
    base = _from_variables(environ, jaxlib)
    release = _version_tuple(jaxlib.version) if jaxlib.version else None
    extras = read_extras(environ, release)
    if options is FROM_ENVIRON:
        options = environ.get("JAX_PJRT_CLIENT_CREATE_OPTIONS") or None
    merged = client_options(options, release)
    allocator = str(merged.overrides.get("allocator", base.allocator)).lower()
    preallocate = merged.overrides.get("preallocate", base.preallocate)
    fraction = merged.overrides.get("memory_fraction", base.fraction)
    fraction_set = base.fraction_set or "memory_fraction" in merged.overrides
    if "collective_memory_size" in merged.overrides:
        extras = replace(
            extras, collective_bytes=merged.overrides["collective_memory_size"] or None
        )
    error = base.error or merged.error or (extras.errors[0] if extras.errors else None)
    if "allocator" in merged.overrides and allocator not in jaxlib.allocators and not error:
        error = f"jax_pjrt_client_create_options' allocator {allocator!r} is unknown to the plugin"
    chosen = allocator
    if extras.vmm_forced and not error:
        allocator = "vmm"
    return Effective(
        allocator, preallocate, fraction, fraction_set, error, extras, merged,
        chosen if chosen != allocator else None,
    )  # fmt: skip


def _from_variables(environ: Mapping[str, str], jaxlib: JaxlibInfo) -> Effective:
    """The allocator trio as ``generate_pjrt_gpu_plugin_options`` reads it."""
    allocator = environ.get(ALLOCATOR, "default").lower()
    # A jaxlib that does not know a name simply ignores it.
    values = [environ.get(name, "") for name in jaxlib.fraction_variables]
    preallocate_text = environ.get(PREALLOCATE, "")
    preallocate = not preallocate_text or preallocate_text not in _PREALLOCATE_FALSE
    error = None
    if jaxlib.refuses_both_fractions and all(values):
        error = f"both {FRACTION} and {FRACTION_DEPRECATED} are set (jaxlib raises ValueError)"
    if allocator not in jaxlib.allocators:
        error = f"{ALLOCATOR}={allocator!r} is not one of {', '.join(jaxlib.allocators)}"
    text = next((value for value in values if value), "")
    fraction, fraction_set = DEFAULT_FRACTION, False
    if text:
        try:
            fraction, fraction_set = float(text), True
        except ValueError:
            error = f"memory fraction {text!r} is not a number"
    return Effective(allocator, preallocate, fraction, fraction_set, error)
