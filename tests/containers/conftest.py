"""Fixtures of the container tests: one ``jovyan`` for the session, a node per test."""

from __future__ import annotations

import pytest

from tests.containers import jovyan, missing, node


@pytest.fixture(scope="session")
def jovyan_user():
    """The throwaway user every container runs as, and a Python it can run (made once)."""
    why = missing()
    if why:
        pytest.skip(why)
    with jovyan() as made:
        yield made


@pytest.fixture
def container_node(simgpu_lib, jovyan_user):
    """A node with its registrar running: containers start from it (``.container(name)``)."""
    with node(simgpu_lib, jovyan_user) as made:
        yield made
