"""Issue 52 item 3: what a user puts over the simulated GPU's state never hangs or misleads root.

The docs offer the simulated GPU for a hub without one, its state in a folder every user can
write (not sticky). Mallory, a real Unix user, replaces ``gpu.state`` there; root then runs
``jax-nbmem status``, whose NVML is the stand-in library reading that file inside root's
process. A FIFO made root's status hang for good (it opened the file blocking); a symbolic link
made root read a root-only file and quote its first line in the stand-in's complaint. Now
anything but a regular file of bounded size is refused, said once on stderr, and status says
NVML is unavailable: a said fault, never a hang.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from jax_nbmem import simgpu
from tests.users import add_user, remove_user

# Root's status answers in a second or two on this stand-in; a hang is cut here.
STATUS_DEADLINE_S = 30


@pytest.fixture(scope="module")
def mallory():
    if os.geteuid() != 0:
        pytest.fail("the hostile-user tests run as root (they create Unix users): run them so")
    user = add_user("jnmmal")
    try:
        yield user
    finally:
        remove_user(user)


@pytest.fixture
def shared_state():
    """The state folder as the docs' set-up leaves it (anyone may write), with a good state."""
    # Not under pytest's own temporary folder (0700 root's): mallory reaches this one.
    top = Path(tempfile.mkdtemp(prefix="jnm-simgpu-"))
    top.chmod(0o755)
    folder = top / "state"
    folder.mkdir()
    folder.chmod(0o777)
    state = simgpu.SimState(folder / "gpu.state").gpu(0, total=80 * simgpu.GIB)
    state.process(0, 4242, 2 * simgpu.GIB).write()
    try:
        yield state.path
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_mallory(user, *command):
    subprocess.run(
        ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", *command],
        check=True,
        capture_output=True,
        timeout=30,
    )


def roots_status(simgpu_lib: Path, state: Path) -> subprocess.CompletedProcess:
    env = simgpu.env_for_subprocess(simgpu_lib.parent, state)
    try:
        return subprocess.run(
            [sys.executable, "-m", "jax_nbmem.cli", "status"],
            env=env,
            capture_output=True,
            text=True,
            timeout=STATUS_DEADLINE_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"root's jax-nbmem status hung on what mallory put at {state}")


def test_a_fifo_over_the_state_is_refused_and_said_not_waited_on(mallory, shared_state, simgpu_lib):
    as_mallory(mallory, "rm", "-f", str(shared_state))
    as_mallory(mallory, "mkfifo", "-m", "0666", str(shared_state))
    done = roots_status(simgpu_lib, shared_state)
    assert done.returncode == 0, done.stderr
    assert "a FIFO, not a regular file; refused" in done.stderr
    assert "no permission to read the GPUs through NVML" in done.stdout, done.stdout


def test_a_link_over_the_state_is_not_followed_by_root(mallory, shared_state, simgpu_lib, tmp_path):
    secret = tmp_path / "root-only"
    secret.write_text("gpu 0 GPU-SECRET-TOKEN total=1\n")
    secret.chmod(0o600)
    as_mallory(mallory, "rm", "-f", str(shared_state))
    as_mallory(mallory, "ln", "-s", str(secret), str(shared_state))
    done = roots_status(simgpu_lib, shared_state)
    assert done.returncode == 0, done.stderr
    assert "a symbolic link; refused" in done.stderr
    assert "SECRET" not in done.stdout + done.stderr
    assert "GPU 0" not in done.stdout


def test_a_regular_state_put_back_is_read_again(mallory, shared_state, simgpu_lib):
    as_mallory(mallory, "rm", "-f", str(shared_state))
    as_mallory(mallory, "mkfifo", "-m", "0666", str(shared_state))
    roots_status(simgpu_lib, shared_state)
    shared_state.unlink()
    simgpu.SimState(shared_state).gpu(0, total=80 * simgpu.GIB).write()
    done = roots_status(simgpu_lib, shared_state)
    assert done.returncode == 0 and "GPU 0" in done.stdout, done.stdout + done.stderr
