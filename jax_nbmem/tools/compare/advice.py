"""Which allocator mode ``%%jaxalloc compare`` recommends, and why, in one line.

Read from `ModeResult`s by their attributes only, so `compare` can call it on the results it
has just gathered and nothing here needs `compare` back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from jax_nbmem.units import format_bytes, format_duration

if TYPE_CHECKING:
    from jax_nbmem.tools.compare.results import ModeResult

__all__ = ["recommend"]

# A mode this much slower than the fastest still wins if it holds clearly less GPU memory.
_SLOWER_OK = 0.10
_LEANER = 0.8


def _footprint(result: ModeResult) -> int | None:
    """GPU memory the mode held at its peak, preallocation included (NVML's view)."""
    return result.gpu_peak_bytes


def recommend(results: Sequence[ModeResult]) -> str:
    """One line: which mode to use and why, or why there is nothing to recommend."""
    finished = [r for r in results if r.state == "ok" and r.wall_s is not None]
    hints = [r.hint for r in results if r.hint]
    if not finished:
        if hints:
            return f"Nothing to compare: {hints[0]}."
        if results and all(r.oom for r in results):
            return "Every mode ran out of GPU memory: the cell needs more than this GPU has free."
        return "Nothing to compare: no mode ran the cell to the end (see the errors above)."
    if not any(r.on_gpu for r in results):
        return (
            "No GPU: allocator modes do not apply on the CPU; times are shown, "
            "memory figures are host RSS."
        )
    failed = [r for r in results if r not in finished]
    also = "; " + ", ".join(f"{r.mode} {r.state_text}" for r in failed) if failed else ""
    fastest = min(finished, key=lambda r: r.wall_s or 0.0)
    if len(finished) == 1:
        return f"Use {fastest.mode}: the only mode that finished the cell{also}."
    if any(_footprint(r) is None for r in finished):
        return (
            f"Use {fastest.mode}: fastest ({format_duration(fastest.wall_s)}); memory "
            f"footprints not compared, NVML could not measure them all{also}."
        )
    fast_bytes = _footprint(fastest) or 0
    # Among modes nearly as fast as the fastest, the one holding the least memory wins...
    near = [r for r in finished if (r.wall_s or 0.0) <= (fastest.wall_s or 0.0) * (1 + _SLOWER_OK)]
    lean = min(near, key=lambda r: (_footprint(r), r.wall_s))
    if lean is not fastest and (_footprint(lean) or 0) < _LEANER * fast_bytes:
        return (
            f"Use {lean.mode}: {_slower(lean, fastest)} than {fastest.mode} but peaks at "
            f"{format_bytes(_footprint(lean))} instead of holding {format_bytes(fast_bytes)}"
            f"{_gpu_share(fastest)}{also}."
        )
    # ...otherwise the fastest, with the leaner but slower choice named.
    lean = min(finished, key=lambda r: (_footprint(r), r.wall_s))
    if lean is fastest or (_footprint(lean) or 0) >= _LEANER * fast_bytes:
        return (
            f"Use {fastest.mode}: fastest ({format_duration(fastest.wall_s)}) and it holds "
            f"no more GPU memory than the others ({format_bytes(fast_bytes)}){also}."
        )
    return (
        f"Use {fastest.mode}: fastest; {lean.mode} peaks at {format_bytes(_footprint(lean))} "
        f"instead of {format_bytes(fast_bytes)}{_gpu_share(fastest)} but is "
        f"{_slower(lean, fastest)}{also}."
    )


def _slower(result: ModeResult, fastest: ModeResult) -> str:
    ratio = (result.wall_s or 0.0) / (fastest.wall_s or 1e-9) - 1
    return f"{ratio:.0%} slower"


def _gpu_share(result: ModeResult) -> str:
    held, total = _footprint(result), result.gpu_total_bytes
    return f" ({held / total:.0%} of the GPU)" if held is not None and total else ""
