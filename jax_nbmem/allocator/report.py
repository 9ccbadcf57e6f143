"""Human-readable text for allocator reports and mode changes (pure: strings in, strings out)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jax_nbmem.allocator.caps import MemoryCap, caps_by_gpu, has_caps, pool_under_cap
from jax_nbmem.allocator.control import AllocatorReport, ApplyResult
from jax_nbmem.allocator.extras import (
    ABORT_COLLECTIVES,
    ASYNC_PREALLOC,
    CLIENT_OPTIONS_ENV,
    COLLECTIVE_MEM,
    USE_TFRT,
)
from jax_nbmem.allocator.jaxlib import Effective
from jax_nbmem.allocator.modes import AllocatorMode
from jax_nbmem.units import format_bytes

__all__ = [
    "cap_lines",
    "cap_report",
    "extra_lines",
    "format_applied",
    "format_report",
    "kernel_display_name",
    "overridden_lines",
    "kernel_name",
    "too_late",
]


def kernel_name(mode: AllocatorMode) -> str:
    """A kernelspec name for ``mode``, e.g. ``jax-nbmem-off`` or ``jax-nbmem-fraction-0.3``."""
    return "jax-nbmem-" + str(mode).replace(" ", "-")


def kernel_display_name(mode: AllocatorMode) -> str:
    """What the launcher shows, e.g. ``Python 3 (JAX, no preallocation)``."""
    if mode.name == "off":
        what = "no preallocation"
    elif mode.name == "on":
        what = "preallocate 75%"
    elif mode.name == "fraction":
        what = f"preallocate {mode.fraction:.0%}"
    elif mode.name == "auto":
        what = "mode chosen at start"
    else:
        what = f"{mode.name} allocator"
    return f"Python 3 (JAX, {what})"


def _started_line(report: AllocatorReport) -> str:
    start = report.backend
    if start is None:
        return "started (before jax_nbmem could see how)"
    platforms = ", ".join(start.platforms) or "unknown platform"
    when = f"in cell [{start.cell}]" if start.cell is not None else "before jax_nbmem loaded"
    line = f"started {when} on {platforms} with: {start.effective.mode_name} — "
    line += start.effective.describe()
    if not start.exact and start.seen == "before":
        line += (
            " (read from the variables as they were before; they were changed in the cell "
            "that started it, so JAX may have read others)"
        )
    elif not start.exact:
        line += " (read from the variables as they are now; they may have changed since)"
    if start.without_gpu:
        line += "\n               no GPU backend: allocator settings do not apply to the CPU"
    if report.backends_cleared:
        line += (
            "\n               then torn down by jax.extend.backend.clear_backends() "
            "(jax.clear_backends() before jax 0.4.36): a new client gets the options the CUDA "
            "plugin took when it registered, never the environment again (only jax config "
            "options are read anew), so a new mode still needs a restart"
        )
    return line


# What each extra variable does, in one line (see allocator.extras for the source lines).
_EXTRA_MEANING = {
    COLLECTIVE_MEM: "a separate collective-memory allocator takes this many MiB per GPU at "
    "start, outside memory_stats() (none with platform or vmm)",
    ABORT_COLLECTIVES: "abort collectives when a peer fails (jaxlib 0.7.0+); not a memory "
    "setting, but a value other than an integer stops the GPU backend",
    USE_TFRT: "use the TFRT GPU client (jaxlib 0.7.1+); a value other than an integer stops the "
    "GPU backend",
    ASYNC_PREALLOC: "cuda_async takes memory when the backend starts even with preallocation "
    "off (-1: its whole pool size; N: N bytes)",
    CLIENT_OPTIONS_ENV: "jax_pjrt_client_create_options at JAX's import: merged after the "
    "variables, so it wins",
}


def overridden_lines(report: AllocatorReport) -> list[str]:
    """What will make JAX start otherwise than the variables say (empty: nothing)."""
    settings = report.pending
    lines = []
    options = settings.options
    if options.error:
        lines.append(f"jax_pjrt_client_create_options breaks the GPU backend: {options.error}")
    elif options.overrides:
        said = ", ".join(f"{k}={v!r}" for k, v in options.overrides.items())
        lines.append(f"jax_pjrt_client_create_options overrides {said}, and JAX merges it last")
    if settings.chosen_allocator is not None:
        lines.append(
            f"XLA_FLAGS sets --xla_gpu_command_buffer_update_mode={settings.extras.update_mode}, "
            f"so the CUDA plugin will run vmm, not {settings.chosen_allocator}"
        )
    return lines


def extra_lines(report: AllocatorReport) -> list[str]:
    """What else decides the pool: the extra variables, JAX's client options, its GPU list."""
    settings: Effective = report.backend.effective if report.backend is not None else report.pending
    lines = [
        f"{v.name}={v.value}: {_EXTRA_MEANING[v.name]}"
        for v in report.extra_variables
        if v.name in _EXTRA_MEANING
    ]
    collective = settings.collective_bytes
    if collective:
        lines.append(
            f"collective memory: {format_bytes(collective)} per GPU beside the pool, counted "
            "in what this kernel holds"
        )
    options = settings.options
    if options.error:
        lines.append(f"jax_pjrt_client_create_options breaks the GPU backend: {options.error}")
    elif options.overrides:
        said = ", ".join(f"{k}={v!r}" for k, v in options.overrides.items())
        lines.append(
            f"jax_pjrt_client_create_options ({options.form}) overrides {said}: JAX merges "
            "it after the variables, so it wins over what %jaxalloc set"
        )
    if settings.chosen_allocator is not None:
        lines.append(
            f"XLA_FLAGS sets --xla_gpu_command_buffer_update_mode={settings.extras.update_mode}, "
            f"so the CUDA plugin runs vmm, not the chosen {settings.chosen_allocator}"
        )
    if report.cuda_visible_devices is not None:
        devices = ", ".join(map(str, report.cuda_visible_devices))
        lines.append(
            f"jax_cuda_visible_devices={devices}: JAX makes a client, and a pool, only on "
            "these CUDA devices"
        )
    return lines


def cap_lines(
    report: AllocatorReport, caps: Mapping[int, MemoryCap], gpus: Sequence[Any]
) -> list[str]:
    """What the mode takes against each GPU's MPS or HAMi cap (*gpus*: NVML's readings).

    Before JAX starts: the pool its next start asks for and ends with under the cap; after: the
    cap alone (the status shows what it holds).
    """
    lines = []
    for gpu in gpus:
        cap = caps.get(gpu.index)
        if cap is None:
            continue
        line = f"{gpu.label}: {cap.system} caps this process at {format_bytes(cap.bytes)}"
        line += f" ({cap.variable})"
        pending = report.pending
        fraction = pending.pool_fraction if not report.backend_started else None
        if fraction and gpu.total_bytes is not None:
            taken = pool_under_cap(fraction, gpu.total_bytes, cap)
            of = "of the cap" if cap.cuda_total_is_cap else "of the whole GPU, as CUDA reports it"
            asked = format_bytes(taken.asked)
            line += f"; '{pending.mode_name}' asks for {fraction:.0%} {of} ({asked})"
            if taken.fits:
                line += ", which fits"
            elif taken.pool:
                line += (
                    f", over the cap: its 0.9x retries end at {format_bytes(taken.pool)}, "
                    "nearly all of the cap"
                )
            else:
                line += ", over the cap: no pool fits"
        elif not report.backend_started and fraction == 0.0:
            line += f"; '{pending.mode_name}' takes memory as arrays need it, up to the cap"
        lines.append(line)
    return lines


def cap_report(
    report: AllocatorReport, environ: Mapping[str, str], read_gpus: Callable[[], Sequence[Any]]
) -> list[str]:
    """:func:`cap_lines` for this process, then each problem with its cap variables.

    *read_gpus* (NVML's readings of every GPU) is called only when a cap variable is set.
    """
    if not has_caps(environ):
        return []
    gpus = read_gpus()
    if not gpus:
        return ["cap variables are set, but NVML lists no GPU to place them on"]
    caps, problems = caps_by_gpu(environ, gpus)
    return cap_lines(report, caps, [g for g in gpus if g.index in caps]) + list(problems)


def format_report(report: AllocatorReport, caps: Sequence[str] = ()) -> str:
    """The ``%jaxalloc`` report: requested mode, variables, backend state, jaxlib facts.

    *caps*: :func:`cap_lines`, shown after the next start (or the backend's line).
    """
    lines = ["jax_nbmem allocator"]
    if report.requested is None:
        lines.append("  requested:   nothing (JAX's own defaults unless variables say otherwise)")
    else:
        lines.append(
            f"  requested:   {report.requested} — {report.requested.describe()}"
            f"  [from {report.requested_from}]"
        )
    if report.variables:
        width = max(len(f"{v.name}={v.value}") for v in report.variables)
        for i, v in enumerate(report.variables):
            label = "  variables:   " if i == 0 else " " * 15
            origin = "set by jax_nbmem" if v.origin == "jax_nbmem" else "set outside jax_nbmem"
            lines.append(f"{label}{f'{v.name}={v.value}':<{width}}  ({origin})")
    else:
        lines.append("  variables:   none set")
    if report.backend_started:
        lines.append(f"  backend:     {_started_line(report)}")
        pending = report.pending
        if report.backend and pending.mode_name != report.backend.effective.mode_name:
            lines.append(
                f"  note:        the variables now say '{pending.mode_name}', which only a new "
                "kernel will use"
            )
    else:
        lines.append("  backend:     not started — JAX will start with the mode below")
        lines.append(f"  next start:  {report.pending.mode_name} — {report.pending.describe()}")
    for i, line in enumerate(caps):
        lines.append(("  cap:         " if i == 0 else " " * 15) + line)
    for i, line in enumerate(extra_lines(report)):
        lines.append(("  also read:   " if i == 0 else " " * 15) + line)
    lines.append(f"  jaxlib:      {report.jaxlib.describe()}")
    return "\n".join(lines)


def format_applied(result: ApplyResult, in_kernel: bool = True) -> str:
    """One short paragraph saying what a mode change did to the environment.

    ``in_kernel=False``: said to a terminal IPython session, not a notebook's kernel.
    """
    lines = [f"jax_nbmem: allocator mode '{result.mode}' — {result.mode.describe()}."]
    changes = [f"{name}={value}" for name, value in result.set.items()]
    changes += [f"unset {name}" for name in result.unset]
    if changes:
        lines.append("  " + ", ".join(changes))
    for name, value in result.replaced_outside.items():
        lines.append(f"  replaced {name}={value}, which was set outside jax_nbmem")
    where = "this kernel" if in_kernel else "this IPython session"
    lines.append(f"  Takes effect when JAX first uses the GPU in {where}.")
    return "\n".join(lines)


def too_late(mode: AllocatorMode, report: AllocatorReport, in_kernel: bool = True) -> str:
    """Why ``mode`` cannot take effect here, what is in effect, and how to get it.

    ``in_kernel=False``: said to a terminal IPython session, which has no notebook cells and
    no kernelspec to choose.
    """
    in_effect = _started_line(report)
    where = "this kernel" if in_kernel else "this IPython session"
    lines = [
        f"jax_nbmem: '{mode}' cannot take effect in {where}: JAX's backend has already "
        "started, and it reads the allocator settings only once.",
        f"  In effect: {in_effect}",
        "  Nothing was changed. To run with this mode:",
    ]
    config = f'`c.JaxNbMem.allocator = "{mode}"`'
    if not in_kernel:
        lines += [
            f"  start IPython again and run `%load_ext jax_nbmem` and `%jaxalloc {mode}` before "
            f"any JAX code (or set {config} in ipython_config.py, or start it as "
            f"`JAX_NBMEM_ALLOCATOR='{mode}' ipython`)."
        ]
        return "\n".join(lines)
    lines += [
        f"  1. put `%load_ext jax_nbmem` and `%jaxalloc {mode}` in the notebook's first cell "
        f"(or set {config} in ipython_kernel_config.py), then restart the kernel; or",
        f"  2. install a kernel that starts in this mode: `jax-nbmem kernel install "
        f"--allocator {str(mode).replace(' ', '=')} --user`, and pick "
        f'"{kernel_display_name(mode)}" as this notebook\'s kernel.',
    ]
    return "\n".join(lines)
