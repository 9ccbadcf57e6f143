"""What the installed jaxlib reads: its allocator variables, their values, and how it reads them.

JAX's GPU client reads its allocator settings from four environment variables, once, when the
backend starts (``jaxlib/xla_client.py``, ``generate_pjrt_gpu_plugin_options``). This module knows
those variables, which names and values the *installed* jaxlib accepts, and what a set of variables
means. It never imports jax or jaxlib: reading the version and the source text is enough, and an
import could be the first step towards starting the backend in the wrong mode.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = [
    "ALLOCATOR",
    "DEFAULT_FRACTION",
    "FRACTION",
    "FRACTION_DEPRECATED",
    "MANAGED_VARIABLES",
    "PREALLOCATE",
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

# Fallback when the installed xla_client.py cannot be read: values by the release that added them.
_ALLOCATORS_BY_VERSION = (
    ((0, 0), ("default", "platform", "bfc", "cuda_async")),
    ((0, 10), ("vmm",)),
    ((0, 11), ("address",)),
)


@dataclass(frozen=True)
class JaxlibInfo:
    """What the installed jaxlib accepts. ``version`` is None when jaxlib is not installed."""

    version: str | None
    fraction_variable: str
    allocators: tuple[str, ...]
    learned_from: str

    def describe(self) -> str:
        """One line: version, fraction variable, allocator values, and where we learned them."""
        version = f"jaxlib {self.version}" if self.version else "jaxlib not installed"
        return (
            f"{version}: fraction variable {self.fraction_variable}, "
            f"allocators {', '.join(self.allocators)} (from {self.learned_from})"
        )


@dataclass(frozen=True)
class Effective:
    """What jaxlib will make of a set of variables, read the way ``xla_client.py`` reads them.

    ``error`` is set when jaxlib would refuse them (it raises, and the CUDA backend is dropped).
    """

    allocator: str
    preallocate: bool
    fraction: float
    fraction_set: bool
    error: str | None = None

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

    def describe(self) -> str:
        """A sentence saying what JAX does on a GPU with these settings."""
        if self.error:
            return f"invalid — jaxlib will refuse these settings: {self.error}"
        if self.allocator == "platform":
            return "platform allocator: allocates exactly what arrays need and frees it (slow)"
        allocator = "BFC allocator" if self.allocator in ("default", "bfc") else self.allocator
        if self.preallocate:
            return f"{allocator}, preallocates {self.fraction:.0%} of GPU memory at start"
        return f"{allocator}, no preallocation (grows on demand up to {self.fraction:.0%})"


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


def _allocators_in_source(source: str) -> tuple[str, ...] | None:
    match = re.search(r"if\s+allocator\s+not\s+in\s*\(([^)]*)\)", source)
    if not match:
        return None
    values = tuple(re.findall(r"['\"]([A-Za-z0-9_]+)['\"]", match.group(1)))
    return values or None


def _jaxlib_info(version: str | None, source: str | None) -> JaxlibInfo:
    if version is None:
        # Nothing to read: name what current jaxlib reads, so the variables are right once it is.
        allocators = tuple(v for _, values in _ALLOCATORS_BY_VERSION for v in values)
        return JaxlibInfo(None, FRACTION, allocators, "no jaxlib installed; newest known names")
    allocators = _allocators_in_source(source) if source else None
    if allocators and source is not None:
        fraction = FRACTION if FRACTION in source else FRACTION_DEPRECATED
        return JaxlibInfo(version, fraction, allocators, "installed jaxlib/xla_client.py")
    release = _version_tuple(version)
    allocators = tuple(
        value for since, values in _ALLOCATORS_BY_VERSION if release >= since for value in values
    )
    # The deprecated name is read by every jaxlib so far; the new one only by recent ones.
    return JaxlibInfo(version, FRACTION_DEPRECATED, allocators, f"version table for {version}")


@lru_cache(maxsize=1)
def installed_jaxlib() -> JaxlibInfo:
    """Describe the installed jaxlib (cached: it does not change inside a running kernel)."""
    try:
        version: str | None = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return _jaxlib_info(version, _xla_client_source() if version else None)


def effective(environ: Mapping[str, str], jaxlib: JaxlibInfo | None = None) -> Effective:
    """Read ``environ`` exactly as jaxlib will when its GPU backend starts."""
    jaxlib = jaxlib or installed_jaxlib()
    allocator = environ.get(ALLOCATOR, "default").lower()
    new, old = environ.get(FRACTION, ""), environ.get(FRACTION_DEPRECATED, "")
    preallocate_text = environ.get(PREALLOCATE, "")
    preallocate = not preallocate_text or preallocate_text not in _PREALLOCATE_FALSE
    error = None
    if new and old and jaxlib.fraction_variable == FRACTION:
        error = f"both {FRACTION} and {FRACTION_DEPRECATED} are set (jaxlib raises ValueError)"
    if allocator not in jaxlib.allocators:
        error = f"{ALLOCATOR}={allocator!r} is not one of {', '.join(jaxlib.allocators)}"
    # An old jaxlib that does not know the new name simply ignores it.
    text = (new or old) if jaxlib.fraction_variable == FRACTION else old
    fraction, fraction_set = DEFAULT_FRACTION, False
    if text:
        try:
            fraction, fraction_set = float(text), True
        except ValueError:
            error = f"memory fraction {text!r} is not a number"
    return Effective(allocator, preallocate, fraction, fraction_set, error)
