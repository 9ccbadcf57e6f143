"""Shared fixtures. Keep each fixture small, documented, and grouped by what it serves."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys

import pytest

from jax_nbmem import simgpu
from jax_nbmem.gpu import nvml
from tests.skips import SkipLedger

# --- Skips under CI (tests/skips.py) ------------------------------------------------------------


def pytest_configure(config):
    """Under CI, a skip that tests/skips.py does not expect fails the run."""
    config.pluginmanager.register(SkipLedger(), "jax_nbmem_skips")


# --- The simulated GPU (jax_nbmem.simgpu) ------------------------------------------------------

#
# Subprocess tests put the stand-in libnvidia-ml.so.1 on LD_LIBRARY_PATH through `simgpu_env`.
# In-process tests use `simgpu_in_process`, which loads the stub into pytest itself: once loaded
# it stays for the rest of the session, so "no NVML library" can only be tested in a subprocess
# started without it.


def _build_or_skip(tmp_path_factory: pytest.TempPathFactory, old_driver: bool):
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler to build the simulated GPU library")
    return simgpu.build(tmp_path_factory.getbasetemp() / "simgpu", old_driver=old_driver)


@pytest.fixture(scope="session")
def simgpu_lib(tmp_path_factory):
    """Path of the stand-in libnvidia-ml.so.1 (current driver), built once per session."""
    return _build_or_skip(tmp_path_factory, old_driver=False)


@pytest.fixture(scope="session")
def simgpu_old_driver_lib(tmp_path_factory):
    """Path of a stand-in library without the newer NVML functions, like an old driver."""
    return _build_or_skip(tmp_path_factory, old_driver=True)


@pytest.fixture
def sim_state(tmp_path):
    """An empty simulated-GPU state; add GPUs and processes, then `.write()` it."""
    return simgpu.SimState(tmp_path / "simgpu.state")


@pytest.fixture
def simgpu_env(simgpu_lib, sim_state):
    """Environment for a subprocess that should see the simulated GPU described by sim_state."""
    return simgpu.env_for_subprocess(simgpu_lib.parent, sim_state.path)


@pytest.fixture
def simgpu_in_process(simgpu_lib, sim_state, monkeypatch):
    """Make this process's NVML the simulated GPU of `sim_state`; yields the state.

    jax_nbmem.gpu.nvml starts fresh (no cached handles, no retry pause) and is reset afterwards.
    """
    simgpu.preload(simgpu_lib)
    monkeypatch.setenv(simgpu.STATE_ENV_VAR, str(sim_state.path))
    nvml._reset_for_tests(retry_first_s=0.0)
    yield sim_state
    nvml._reset_for_tests()


# --- Jupyter's runtime directory ----------------------------------------------------------------
#
# Kernels write their connection files and jax_nbmem beacons there, and every status reads the
# beacons found there: the suite gets a directory of its own, so that it neither reads the
# beacons of whatever else runs on the machine nor leaves any behind.


@pytest.fixture(scope="session", autouse=True)
def _own_runtime_dir(tmp_path_factory):
    import os

    runtime = tmp_path_factory.mktemp("jupyter-runtime")
    before = os.environ.get("JUPYTER_RUNTIME_DIR")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(runtime)
    yield runtime
    if before is None:
        os.environ.pop("JUPYTER_RUNTIME_DIR", None)
    else:
        os.environ["JUPYTER_RUNTIME_DIR"] = before


# --- The allocator's variables -----------------------------------------------------------------
#
# Every kernel, shell and CLI a test starts inherits this process's environment, and the mode JAX
# will start with is read from it: one test that leaves XLA_PYTHON_CLIENT_ALLOCATOR=platform in
# os.environ turns every later kernel's "on" into "platform". So each test must leave the managed
# variables as it found them; one that does not is told so (and they are put back).


@pytest.fixture(autouse=True)
def _allocator_variables_left_as_found():
    from jax_nbmem.allocator.jaxlib import MANAGED_VARIABLES

    before = {name: os.environ.get(name) for name in MANAGED_VARIABLES}
    yield
    after = {name: os.environ.get(name) for name in MANAGED_VARIABLES}
    if after != before:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        changed = f"{before} -> {after}"
        pytest.fail(f"the test changed the allocator's variables in os.environ: {changed}")


# --- Another user (as root only, as CI runs) --------------------------------------------------


@pytest.fixture(scope="session")
def other_user():
    """A throwaway account (name, uid, gid), removed afterwards; only as root, as CI runs."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create another user")
    name = f"jnm{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        entry = pwd.getpwnam(name)
        yield name, entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True)


# --- A process that is no kernel ----------------------------------------------------------------


@pytest.fixture
def sleeper():
    """The PID of a plain Python child that only sleeps (a process, not a kernel); killed after."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    yield process.pid
    process.kill()
    process.wait()
