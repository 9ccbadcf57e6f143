"""One simulated GPU shared by several users, set up by root with one command.

Root runs `python -m jax_nbmem.simgpu shared-setup DIR --startup FOLDER`; two throwaway users
each start a real IPython shell with the printed environment and make a JAX array (JAX on
the CPU); their mirrors write their lines into the one state file, and root's
`jax-nbmem status --json` shows both users' processes on the one GPU with their bytes.
"""

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from jax_nbmem.simgpu import GIB, SimState
from jax_nbmem.simgpu.mirror import CONTEXT_BYTES
from jax_nbmem.simgpu.shared import STARTUP_NAME
from tests.users import add_user, python_for, remove_user

ARRAY = 64 * 2**20  # each user's one JAX array, in bytes
SETUP = [sys.executable, "-m", "jax_nbmem.simgpu", "shared-setup"]


def _setup(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SETUP, *args], capture_output=True, text=True, timeout=120)


def _spawner_env(out: str) -> dict[str, str]:
    """The dict the command prints for c.Spawner.environment."""
    start = out.index("c.Spawner.environment.update(") + len("c.Spawner.environment.update(")
    return ast.literal_eval(out[start : out.index("})", start) + 1])


def _snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
        for p in sorted(folder.rglob("*"))
    }


def test_bad_input_is_refused_and_changes_nothing(tmp_path):
    folder = tmp_path / "sim"
    for args in (["relative/dir"], [str(folder), "--gpus", "0"], [str(folder), "--total", "lots"]):
        done = _setup(*args)
        assert done.returncode == 1 and "nothing was changed" in done.stderr, args
    assert not folder.exists()
    startup = tmp_path / "startup"
    startup.mkdir()
    (startup / STARTUP_NAME).write_text("print('someone else')\n")
    done = _setup(str(folder), "--startup", str(startup))
    assert done.returncode == 1 and "is not ours" in done.stderr and not folder.exists()


def test_running_it_again_changes_nothing(tmp_path):
    folder = tmp_path / "sim"
    first = _setup(str(folder), "--gpus", "2", "--total", "80GiB")
    assert first.returncode == 0, first.stderr
    env = _spawner_env(first.stdout)
    assert env["JAX_PLATFORMS"] == "cpu"
    state = SimState.read(env["JAX_NBMEM_SIMGPU_STATE"])
    assert state.total_bytes(0) == state.total_bytes(1) == 80 * GIB
    assert state.total_bytes(2) is None
    state_dir = folder / "state"
    assert state_dir.stat().st_mode & 0o7777 == 0o777  # world-writable, not sticky
    assert Path(f"{state.path}.lock").stat().st_mode & 0o777 == 0o666
    before = _snapshot(folder)
    again = _setup(str(folder), "--gpus", "2", "--total", "80GiB")
    assert again.returncode == 0 and _spawner_env(again.stdout) == env
    assert _snapshot(folder) == before


@pytest.fixture
def two_users():
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("needs root and useradd to create two other users")
    users = []
    try:
        users = [add_user("jnms"), add_user("jnms")]
        yield users
    finally:
        for user in users:
            remove_user(user)


def _held(state_path: str, pid: int) -> int | None:
    try:
        return SimState.read(state_path).process_bytes(pid)
    except Exception:  # being rewritten: look again
        return None


def test_two_users_kernels_share_one_simulated_gpu(two_users):
    folder = Path(tempfile.mkdtemp(prefix="jnm-shared-", dir="/var/tmp"))
    shells = []
    try:
        folder.chmod(0o755)
        # A copy even where the users could run ours: shared-setup writes into its startup folder.
        python, user_env = python_for(two_users[0], folder, {"PATH": os.environ["PATH"]},
                                      "jax_nbmem, IPython, jax", copy=True)  # fmt: skip
        startup = Path(python).parent.parent / "etc" / "ipython" / "startup"  # the copy's
        done = _setup(str(folder / "sim"), "--total", "80GiB", "--startup", str(startup))
        assert done.returncode == 0, done.stderr
        spawner = _spawner_env(done.stdout)
        state_path = spawner["JAX_NBMEM_SIMGPU_STATE"]
        for user in two_users:
            env = {**user_env, **spawner, "HOME": str(user.home), "USER": user.name}
            env["LD_LIBRARY_PATH"] += ":" + user_env["LD_LIBRARY_PATH"]  # the copy's libpython
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # the pool follows the array
            shell = subprocess.Popen(
                [python, "-m", "IPython", "--no-banner", "--colors=NoColor"],
                user=user.uid, group=user.gid, extra_groups=[], env=env, cwd=user.home,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
            shell.stdin.write(f"import jax.numpy as jnp\nx = jnp.ones({ARRAY}, jnp.uint8)\n")
            shell.stdin.write("x.block_until_ready(); print('made')\n")
            shell.stdin.flush()
            shells.append(shell)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all((_held(state_path, s.pid) or 0) >= CONTEXT_BYTES + ARRAY for s in shells):
                break
            assert all(s.poll() is None for s in shells), [s.stdout.read() for s in shells]
            time.sleep(0.3)
        held = {s.pid: _held(state_path, s.pid) for s in shells}
        assert all(b == CONTEXT_BYTES + ARRAY for b in held.values()), held
        root_env = {**os.environ, **spawner}
        status = subprocess.run(
            [sys.executable, "-m", "jax_nbmem.cli", "status", "--json"],
            env=root_env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        rows = {p["pid"]: p for p in report["processes"] if p["pid"] in held}
        assert {pid: row["used_bytes"] for pid, row in rows.items()} == held
        assert {row.get("user") for row in rows.values()} == {u.name for u in two_users}
        assert len(report["gpus"]) == 1
    finally:
        for shell in shells:
            shell.kill()
            shell.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
