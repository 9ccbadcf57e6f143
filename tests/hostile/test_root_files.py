"""Issue 52 items 2 and 3: what mallory puts in a folder she can write never steers root.

Mallory is a real user; each attack is hers (a link or a FIFO she makes, as herself, through
plant.py), then root runs its own tool on that folder as an administrator would:

* the simulated GPU's ``shared-setup`` (run again) and its registrar, on ``DIR/state``
  (world-writable, not sticky, by design): her link at ``gpu.state.lock`` to a root-only file
  or to nothing yet, where root once chmodded the file 0666 or created a root-owned 0666 one;
* a writer under the state's lock (root's registrar changing the state) through her link;
* a FIFO over ``gpu.state`` or the culler's counts: root's readers say so at once, never hang;
* root's ``jax-nbmem shutdown --log`` into a folder of hers, its log a link of hers.

Root only. Each test fails on the code before issue 52 (a chmod, a file made, a hang).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from jax_nbmem.cli.command import main
from jax_nbmem.simgpu.registrar import Registrar, RegistrarError
from jax_nbmem.simgpu.shared import SharedSetupError, setup_shared
from jax_nbmem.simgpu.state import SimState, StateError
from tests.hostile.agents import as_user
from tests.jupyterlab import REPO_ROOT

pytestmark = pytest.mark.timeout(240)

PLANT = Path(__file__).with_name("plant.py")


def _plant(user, *args) -> None:
    subprocess.run(as_user(user, PLANT, *args), check=True, timeout=30, cwd=REPO_ROOT)


def _root_only(node, name: str) -> Path:
    """A folder only root can write, for what an attack would have root make or change."""
    folder = node.folder / f"root-only-{name}"
    folder.mkdir(mode=0o755)
    return folder


@pytest.fixture(scope="module")
def simulated(node):
    """Root's shared simulated GPU under the node's folder (DIR/state writable by all)."""
    folder = node.folder / "simgpu"
    setup_shared(folder)
    return folder / "state"


def test_shared_setup_run_again_never_chmods_through_her_link(node, simulated):
    secret = _root_only(node, "secret") / "shadow"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    lock = simulated / "gpu.state.lock"
    _plant(node.mallory, "link", secret, lock)
    setup_shared(simulated.parent)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600  # before: 0666
    info = os.lstat(lock)
    assert stat.S_ISREG(info.st_mode) and info.st_uid == 0  # her link replaced by root's file
    assert stat.S_IMODE(info.st_mode) == 0o666  # every writer takes it, as before
    assert secret.read_text() == "root's\n"


def test_the_registrar_never_creates_through_her_dangling_link(node, simulated):
    made = _root_only(node, "cron") / "jax-nbmem-made"
    lock = simulated / "gpu.state.lock"
    _plant(node.mallory, "link", made, lock)
    registrar = Registrar(simulated / "gpu.state").listen()
    try:
        assert not os.path.lexists(made)  # before: root's 0666 file there
        info = os.lstat(lock)
        assert stat.S_ISREG(info.st_mode) and info.st_uid == 0
        sock = os.lstat(registrar.socket_path)
        assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o666
    finally:
        registrar.close()


def test_a_writer_under_the_lock_refuses_her_link_and_says_so(node, simulated):
    made = _root_only(node, "preload") / "ld.so.preload"
    _plant(node.mallory, "link", made, simulated / "gpu.state.lock")
    with pytest.raises(StateError, match="gpu.state.lock is a symbolic link"):
        with SimState.update(simulated / "gpu.state") as state:
            state.process(0, 4242, 1 << 20)
    assert not os.path.lexists(made)  # before: made by root's open(lock, "a")
    setup_shared(simulated.parent)  # root's set-up puts its own lock back


def _root_reads(code: str) -> str:
    """What root's Python prints running ``code`` (this tree's package); a hang fails."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=30, env=env)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"root's reader hung on her FIFO: {code}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_fifo_over_the_state_is_said_by_root_s_python_readers_never_waited_on(node, simulated):
    state = simulated / "gpu.state"
    kept = state.read_bytes()
    _plant(node.mallory, "fifo", state)
    try:
        said = _root_reads(
            "from jax_nbmem.simgpu.state import SimState, StateError\n"
            f"try:\n    SimState.read({str(state)!r})\nexcept StateError as e:\n    print(e)"
        )
        assert said == f"{state} is not a regular file: not read"
        with pytest.raises(RegistrarError, match="is not a regular file"):
            Registrar(state).listen()
        with pytest.raises(SharedSetupError, match="is not a regular file"):
            setup_shared(simulated.parent)
    finally:
        state.unlink()
        state.write_bytes(kept)
        state.chmod(0o644)


def test_a_fifo_at_the_culler_s_counts_never_holds_the_exporter_s_refresh(node):
    _plant(node.mallory, "fifo", node.share / "jax_nbmem-culled.json")
    try:
        said = _root_reads("from jax_nbmem.node.notices import read_counts\n"
                           f"print(read_counts([{str(node.share)!r}]))")  # fmt: skip
        assert said == "None"
    finally:
        (node.share / "jax_nbmem-culled.json").unlink()


def test_root_s_shutdown_log_never_follows_her_link_nor_writes_in_her_folder(servers, capsys):
    hers = servers.server(servers.mallory, [{"id": "3a11-logged"}]).kernels["3a11-logged"]
    folder = servers.mallory.home / "logs"
    made = _root_only(servers, "log") / "made-by-root"
    folder.mkdir(exist_ok=True)
    os.chown(folder, servers.mallory.uid, servers.mallory.gid)
    _plant(servers.mallory, "link", made, folder / "admin.log")
    code = main(["shutdown", str(hers), "--yes", "--log", str(folder / "admin.log")])
    said = capsys.readouterr()
    said = said.out + said.err
    assert code == 0, said
    assert not os.path.lexists(made)  # before: root's log, wherever her link pointed
    assert f"belongs to uid {servers.mallory.uid}, not to root or this user" in said
    assert "Not logged" in said


def test_root_follows_its_own_link_only_and_judges_where_it_leads(node, tmp_path):
    # As /var/run -> /run: root's link in root's folder is followed; the folder it leads to is
    # judged all the same (the share folder: everyone's).
    from jax_nbmem.rootfiles import UnsafeFile, append_line

    os.symlink(node.share, tmp_path / "via")
    with pytest.raises(UnsafeFile, match="writable by others"):
        append_line(tmp_path / "via" / "ours.log", "x\n")
    os.symlink(tmp_path, tmp_path / "home")
    append_line(tmp_path / "home" / "ours.log", "x\n")
    assert (tmp_path / "ours.log").read_text() == "x\n"


def test_the_agent_refuses_a_share_folder_others_write_that_is_not_sticky(node):
    # There she could rename S/agent away between its making and its use, and put hers there.
    share = node.folder / "open-share"
    share.mkdir()
    share.chmod(0o777)
    from jax_nbmem.agent.server import AgentDirError, AgentServer, Registry

    agent = AgentServer(str(share), Registry())
    with pytest.raises(AgentDirError, match="not sticky"):
        agent.start()
    assert not (share / "agent").exists()
