"""What ``%%jaxalloc compare`` measured: one `ModeResult` per mode, in a `CompareResult`.

Plain data shared by the runner (`run`), the recommendation (`advice`) and the report
(`report`); it imports none of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from jax_nbmem.units import format_bytes

__all__ = ["CompareResult", "ModeResult"]

_STATE_TEXT = {
    "ok": "ok",
    "oom": "out of memory",
    "error": "error",
    "timeout": "timed out",
    "crashed": "crashed",
    "stopped": "stopped",
}


@dataclass(frozen=True)
class ModeResult:
    """How the cell did in one mode. Any figure is ``None`` when it could not be measured.

    ``state`` is one of ``ok``, ``oom``, ``error``, ``timeout``, ``crashed`` (the subprocess
    died without reporting) or ``stopped`` (someone else sent it SIGTERM). ``wall_s`` is the
    cell's own time (JAX import left out); ``total_s`` the whole subprocess. JAX figures are
    summed over the GPUs; ``jax_pool_bytes`` is what the allocator's pool holds
    (``pool_bytes``; the limit for cuda_async); ``jax_free_bytes`` (free space inside the
    pool: pool minus in use) and ``largest_free_block_bytes`` are those of the device where
    free memory is most
    fragmented. ``gpu_peak_bytes`` is what NVML saw this subprocess hold, sampled;
    ``host_peak_rss_bytes`` the peak resident memory of the whole subprocess. ``notes`` say
    what could not be measured and why.
    """

    mode: str
    state: str
    wall_s: float | None = None
    total_s: float | None = None
    on_gpu: bool = False
    jax_peak_bytes: int | None = None
    jax_in_use_bytes: int | None = None
    jax_limit_bytes: int | None = None
    jax_pool_bytes: int | None = None
    jax_free_bytes: int | None = None
    largest_free_block_bytes: int | None = None
    gpu_peak_bytes: int | None = None
    gpu_total_bytes: int | None = None
    host_peak_rss_bytes: int | None = None
    error: str | None = None
    traceback: str | None = None
    hint: str | None = None
    notes: tuple[str, ...] = ()
    stdout_tail: str = ""
    stderr_tail: str = ""
    returncode: int | None = None
    devices: tuple[dict[str, Any], ...] = ()

    @property
    def oom(self) -> bool:
        """Whether the cell ran out of memory (JAX's RESOURCE_EXHAUSTED)."""
        return self.state == "oom"

    @property
    def state_text(self) -> str:
        """The state in words (``out of memory``, ``timed out``...)."""
        return _STATE_TEXT.get(self.state, self.state)

    @property
    def fragmentation(self) -> str | None:
        """``largest free block 1.2 GiB of 3.4 GiB free in the pool (35%)``, or None."""
        block, free = self.largest_free_block_bytes, self.jax_free_bytes
        if block is None or free is None:
            return None
        share = f" ({block / free:.0%})" if free > 0 else ""
        return (
            f"largest free block {format_bytes(block)} of {format_bytes(free)} free in the "
            f"pool{share}"
        )


@dataclass(frozen=True)
class CompareResult:
    """All modes, in the order run; ``notes`` concern the comparison as a whole."""

    modes: tuple[ModeResult, ...]
    recommendation: str
    notes: tuple[str, ...] = ()

    @property
    def on_gpu(self) -> bool:
        """Whether any mode ran JAX on a GPU."""
        return any(result.on_gpu for result in self.modes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for JSON)."""
        return asdict(self)
