"""Fixtures of the simulated GPU's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def mirror_module(monkeypatch):
    """The mirror's module, as in a kernel whose JAX started in its default mode (75%)."""
    from jax_nbmem.simgpu import mirror as module

    monkeypatch.setattr(module, "_backend_started", lambda: True)
    monkeypatch.setattr(module, "_live_bytes_by_device", dict)
    for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                 "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    return module
