"""jax_nbmem: see and control JAX's GPU memory from inside a Jupyter notebook.

In a notebook::

    %load_ext jax_nbmem
    %jaxalloc off        # before JAX first touches the GPU

Public names: `status`, `cells`, `load_ipython_extension`, `unload_ipython_extension`.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "cells", "load_ipython_extension", "status", "unload_ipython_extension"]


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

    Keys: ``nvml`` (``available``, ``reason``), ``gpus``, ``processes`` (``pid``, ``gpu``,
    ``used_bytes``, ``kind``, ``notebook``, ``preallocated``, ...), ``warnings`` (``kind``,
    ``gpu``, ``pid``, ``message``); with the extension loaded also ``allocator``. Works without
    a GPU (then ``nvml.available`` is False and ``reason`` says why). Never starts JAX.
    """
    from jax_nbmem.tenants.status import collect

    session = _session()
    return session.status() if session is not None else collect()


def cells():
    """One record per cell run since ``%load_ext jax_nbmem`` (``[]`` when it is not loaded).

    Each record has attributes (``execution_count``, ``gpu_self_before``/``peak``/``after``,
    ``jax_in_use_before``/``peak``/``after``, ``free_at_start``, ``free_min``, ``duration_s``,
    ``success``, ``oom``, ...) and ``to_dict()``. A value that could not be measured is None.
    """
    session = _session()
    return session.cells() if session is not None else []


def load_ipython_extension(ipython) -> None:
    """Called by ``%load_ext jax_nbmem`` (and by ``c.InteractiveShellApp.extensions``)."""
    from jax_nbmem.notebook.magics import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """Called by ``%unload_ext jax_nbmem``: removes callbacks and stops background threads."""
    from jax_nbmem.notebook.magics import unload

    unload(ipython)
