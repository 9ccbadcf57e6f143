"""The version of jax_nbmem: its one source, read by the build (``[tool.hatch.version]``).

Every part may import it (``jax_nbmem.__version__``, the server extension's ``__version__``
that ``jupyter server extension list`` shows); it imports nothing.
"""

__version__ = "0.1.0"
