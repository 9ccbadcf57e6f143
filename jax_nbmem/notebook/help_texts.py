"""What ``%jaxalloc?`` and ``%jaxmem?`` show: written once here, when first asked for.

The magics' own docstrings would come with magic_arguments' "::" line and a usage that mixes
the line and the cell magic's options; these say the forms, then what each does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from jax_nbmem.allocator.modes import mode_forms
from jax_nbmem.tenants.owners import SHUTDOWN_DRY_RUN, SHUTDOWN_YES
from jax_nbmem.tools.compare import DEFAULT_TIMEOUT_S

__all__ = ["HelpedMagic", "help_texts", "written_on_demand"]


class HelpedMagic:
    """A registered magic whose help (its ``__doc__``: ``%name?``) is written when read.

    The help names the modes the installed jaxlib accepts, and finding them reads its package
    metadata and its source (some 18 ms): a ``?`` needs that, ``%load_ext`` does not.
    Everything else is the bound method's.
    """

    def __init__(self, method: Callable[..., Any], write: Callable[[], str]) -> None:
        self.__wrapped__ = method  # inspect.signature, and so IPython, shows the method's
        self._write = write

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the magic."""
        return self.__wrapped__(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # what IPython asks of a magic: the method's
        return getattr(self.__wrapped__, name)

    def _help(self) -> str:
        return self._write()

    __doc__ = property(_help)  # type: ignore[assignment]  # the instance's, written when read


def written_on_demand(in_kernel: bool) -> Callable[[str], Callable[[], str]]:
    """For each magic's name, a function that writes its help (both at the first, once)."""
    texts = functools.cache(lambda: help_texts(in_kernel))
    return lambda name: lambda: texts()[name]


def help_texts(in_kernel: bool) -> dict[str, str]:
    """What ``%jaxalloc?`` and ``%jaxmem?`` show: the forms, then what each does."""
    here = "this kernel" if in_kernel else "this IPython session"
    first = (
        "Put it in the notebook's first cell" if in_kernel else "Run it at the start of the session"
    )
    forms = mode_forms()  # jaxlib's metadata and source, read once
    allocators = ", ".join(m for m in forms[3:] if m != "platform")
    jaxalloc = f"""\
%jaxalloc [MODE]: choose JAX's GPU allocator mode before its backend starts.
%%jaxalloc compare [MODES...] [--timeout S]: run the cell once per mode and compare.

{first}, right after `%load_ext jax_nbmem`: JAX reads these settings
once, when it first uses the device.

MODE, one of {", ".join(forms)}:
  on           JAX's default: preallocate 75% of GPU memory at the first allocation
  off          no preallocation: allocate on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false)
  fraction F   preallocate F of the GPU's total memory, 0 < F <= 1
  platform     allocate exactly what arrays need and free it again (slow)
  {allocators}
               other values of XLA_PYTHON_CLIENT_ALLOCATOR the installed jaxlib accepts

With no mode: report the mode requested, the variables in effect, whether JAX's backend has
started and with which mode. Once it has started, a new mode cannot take effect in {here};
you are told how to get it.

%%jaxalloc compare [MODES...] [--timeout S] (a cell magic): run the cell once per mode
(default: on off platform), each in a fresh Python process on the same GPU(s), one at a time,
and report per mode the wall time, JAX's peak bytes in use, the peak GPU memory the process
held (NVML), out-of-memory, and the largest free block against free memory; a bar chart and a
one-line recommendation follow. The cell must be self-contained. --timeout S: seconds each
mode may run (default {DEFAULT_TIMEOUT_S:g}).
"""
    jaxmem = f"""\
%jaxmem [COMMAND]: GPU memory of {here} and of everyone else on its GPUs.

  (none), panel [KIND]
                    a panel under the cell: this process's GPU memory, JAX's bytes in use
                    and its pool, other processes, each cell's span and its record. KIND:
                    widget (live, and sent again after each cell), cells (the widget,
                    updated only after each cell), static (a picture replaced after each
                    cell), text, or auto (c.JaxNbMem.panel; by default static in Colab,
                    widget in other kernels, text in a terminal)
  status [--json]   GPUs, who holds their memory, warnings (as `jax-nbmem status`)
  cells [--json | --csv PATH]
                    one row per cell run since the extension loaded: GPU memory before, at
                    the peak and after, JAX bytes in use, duration, errors; --csv writes
                    them to PATH (jax_nbmem.cells(frame=True) gives a pandas DataFrame)
  top [N]           the N (10) largest live JAX arrays: shape, dtype, device, bytes, and the
                    names that hold them, also the locals of the last error's frames that
                    keep arrays alive; the total nobody names
  free NAME...      delete these names and their arrays' device buffers (only arrays no other
                    name holds); --clear-caches also clears JAX's caches; reports the bytes
                    returned to JAX's pool and, where NVML shows it, to the GPU
  free --last-error release what the last error keeps alive (its frames' locals; after a
                    failed cell Python keeps them until the next error) and report what came
                    back; %debug and %tb have no error to show afterwards
  fit [--shapes] [--start] [--json] CALL
                    will CALL (e.g. train_step(state, batch)) fit? Compiles it without running
                    it and sets XLA's figures (arguments, outputs, temporaries, code, peak)
                    against the room JAX's pool and the GPU have left for {here}, less the
                    arguments already on the device; says the cheapest change if it does not
                    fit. --shapes: allocate nothing for the arguments (expressions are
                    evaluated with jax.eval_shape, arrays become ShapeDtypeStructs).
                    Compiling starts JAX's backend: before it has started, --start is needed.
                    --json: every figure as JSON (fits, verdict, advice, spare, program, devices)
  shutdown PID [--yes | --dry-run]
                    shut down another Jupyter kernel of yours that holds GPU memory. Refuses
                    other users' processes and processes that are not kernels. PID is the
                    (host) PID status shows; in a container it is stopped under its PID there,
                    and another container's kernel is refused.
                    --yes: {SHUTDOWN_YES}
                    --dry-run: {SHUTDOWN_DRY_RUN}
"""
    return {"jaxalloc": jaxalloc, "jaxmem": jaxmem}
