"""jax_nbmem: see and control JAX's GPU memory from inside a Jupyter notebook.

In a notebook::

    %load_ext jax_nbmem
    %jaxalloc off        # before JAX first touches the GPU

Public names: `status`, `cells`, `track`, `fit`, `load_ipython_extension`,
`unload_ipython_extension`.
"""

from jax_nbmem._version import __version__

__all__ = [
    "__version__",
    "cells",
    "fit",
    "load_ipython_extension",
    "status",
    "track",
    "unload_ipython_extension",
]


def _session():
    """The loaded extension's session in the running IPython shell, or None."""
    import sys

    magics = sys.modules.get("jax_nbmem.notebook.magics")
    if magics is None:
        return None
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return magics.session_of(shell) if shell is not None else None


def status():
    """GPUs, who holds their memory, and warnings, as a dict (also readable as attributes).

    Keys: ``nvml`` (``available``, ``reason``), ``gpus`` (``used_bytes`` as nvidia-smi shows
    it, the driver's ``reserved_bytes`` apart, ``free_bytes``, ...), ``processes`` (``pid``,
    ``gpu``, ``used_bytes``, ``kind``, ``notebook``, ``preallocated``, ...), ``warnings`` (``kind``,
    ``gpu``, ``pid``, ``message``); with the extension loaded also ``allocator``, ``own_split``
    (this kernel's GPU memory by holder: JAX's pool, JAX's collective allocator, PyTorch, CuPy,
    TensorFlow, and ``other_bytes``: CUDA's contexts and the rest) and ``frameworks`` (each
    other framework imported, whether it started on the GPU, and why not). Works without a GPU
    (then ``nvml.available`` is False and ``reason`` says why). Never starts JAX, and never
    imports or starts PyTorch, CuPy or TensorFlow.
    """
    from jax_nbmem.tenants.status import collect

    session = _session()
    return session.status() if session is not None else collect()


def cells(frame: bool = False):
    """One record per cell run since ``%load_ext jax_nbmem`` (``[]`` when it is not loaded).

    Each record has attributes (``execution_count``, ``gpu_self_before``/``peak``/``after``,
    ``jax_in_use_before``/``peak``/``after``, ``free_at_start``, ``free_min``, ``duration_s``,
    ``success``, ``oom``, ...) and ``to_dict()``. A value that could not be measured is None.
    Each "after" is read after its cell and before the next one; ``span_start`` (None for a
    cell alone) marks the rare record that covers several cells with no reading between them.
    With ``frame=True``: a pandas DataFrame, one row per cell and one column per key of
    ``to_dict()`` (byte counts as nullable integers); ImportError saying so without pandas.
    """
    session = _session()
    records = session.cells() if session is not None else []
    if not frame:
        return records
    from jax_nbmem.record.export import records_frame

    return records_frame(records)


def fit(fn, /, *args, **kwargs):
    """Will ``fn(*args, **kwargs)`` fit in GPU memory? Compiles it, never runs it.

    Returns a report: ``fits`` (True, False, or None when it cannot be told), ``verdict`` (one
    line), ``advice`` (the cheapest change when it does not fit), ``spare`` per device, and
    ``to_dict()``; printing it shows the verdict and the table. Arguments may be arrays (those
    already on a device need no new memory) or ``jax.ShapeDtypeStruct``. Compiling needs JAX's
    backend: ``fit`` raises ``FitError`` (a ValueError) rather than start it, as it does for a
    call that cannot be traced or compiled. Start it on purpose first (``jax.devices()``, after
    choosing the allocator mode) or use ``%jaxmem fit --start``.
    """
    from jax_nbmem.tools.fit import FitError, not_started_reason
    from jax_nbmem.tools.fit_report import check_fit

    reason = not_started_reason()
    if reason is not None:
        raise FitError(
            f"jax_nbmem.fit: {reason}. Starting it takes the allocator mode for good: choose "
            "the mode, start it on purpose (e.g. jax.devices()), then ask again"
        )
    session = _session()
    return check_fit(
        fn,
        args,
        kwargs,
        call=f"{getattr(fn, '__name__', type(fn).__name__)}(...)",
        **(session.fit_context() if session is not None else {}),
    )


def track(*, sampler=None, source=None):
    """Peak and retained memory of a block: ``with jax_nbmem.track() as t:`` or ``@track()``.

    Works in a plain script too. Uses the loaded extension's sampler when there is one, else
    starts its own for the block. ``t.peak`` and ``t.retained`` are dicts per device
    (``"gpu:0"``, ... by NVML index; ``"host"`` without a GPU) of bytes, None when unknown;
    ``t.to_dict()`` has every figure and its source; ``print(t)`` gives one line. *sampler* or
    *source* (for tests) replace the sampler used. Never starts JAX.
    """
    from jax_nbmem.tools.track import Tracker

    def shared_sampler():
        return getattr(_session(), "sampler", None)

    return Tracker(sampler=sampler, source=source, find_sampler=shared_sampler)


def load_ipython_extension(ipython) -> None:
    """Called by ``%load_ext jax_nbmem`` (and by ``c.InteractiveShellApp.extensions``)."""
    from jax_nbmem.notebook.magics import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """Called by ``%unload_ext jax_nbmem``: removes callbacks and stops background threads."""
    from jax_nbmem.notebook.magics import unload

    unload(ipython)
