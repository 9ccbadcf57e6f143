"""jax_nbmem: see and control JAX's GPU memory from inside a Jupyter notebook.

In a notebook::

    %load_ext jax_nbmem
    %jaxalloc off        # before JAX first touches the GPU

Public names: `load_ipython_extension`, `unload_ipython_extension`.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension"]


def load_ipython_extension(ipython) -> None:
    """Called by ``%load_ext jax_nbmem`` (and by ``c.InteractiveShellApp.extensions``)."""
    from .magics import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """Called by ``%unload_ext jax_nbmem``: removes callbacks and stops background threads."""
    from .magics import unload

    unload(ipython)
