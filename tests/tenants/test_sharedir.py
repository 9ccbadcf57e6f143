"""Where every face finds the share directory, and root's host commands the node agent in it.

One order in every face: ``--share-dir``, ``$JAX_NBMEM_SHARE_DIR``, the face's setting, the
face's default (none for kernels and servers; for root's commands ``/var/tmp/jax_nbmem`` where
it is a real directory: docs/containers.md; deploy/jax-nbmem-exporter.tmpfiles). The
commands run in a mount namespace of their own whose ``/var/tmp`` is a fresh tmpfs (root, as
CI runs), so the documented folder is there or not whatever this machine has.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from jax_nbmem.node.sharedir import (
    DEFAULT_SHARE_DIR,
    ShareDir,
    agent_not_consulted,
    find_share_dir,
)
from tests.jupyterlab import REPO_ROOT


def test_the_flag_then_the_variable_then_the_documented_folder(tmp_path):
    default = tmp_path / "jax_nbmem"
    env = {"JAX_NBMEM_SHARE_DIR": "/from/env"}
    assert find_share_dir("/given", env, str(default)) == ShareDir("/given", "--share-dir")
    assert find_share_dir(None, env, str(default)).path == "/from/env"
    assert find_share_dir(None, {}, str(default)).path is None  # not there: none
    (tmp_path / "elsewhere").mkdir()
    default.symlink_to(tmp_path / "elsewhere")
    assert find_share_dir(None, {}, str(default)).path is None  # a symlink is not the setup
    default.unlink()
    default.mkdir()
    assert find_share_dir(None, {}, str(default)) == ShareDir(str(default), "the default")


def test_the_setting_comes_after_the_variable_and_before_the_default(tmp_path):
    default = tmp_path / "jax_nbmem"
    default.mkdir()
    env = {"JAX_NBMEM_SHARE_DIR": "/from/env"}
    found = find_share_dir("/given", env, str(default), setting="/setting")
    assert found == ShareDir("/given", "--share-dir")
    found = find_share_dir(None, env, str(default), setting="/setting")
    assert found == ShareDir("/from/env", "$JAX_NBMEM_SHARE_DIR")
    found = find_share_dir(None, {}, str(default), setting="/setting")
    assert found == ShareDir("/setting", "the setting")
    assert find_share_dir(None, {}, str(default), setting="").how == "the default"
    assert find_share_dir(None, {}, None, setting="") == ShareDir(None, "none")


def test_a_kernel_a_server_and_a_reader_take_the_same_order(monkeypatch):
    from jax_nbmem.node.beacons import beacon_dirs
    from jax_nbmem.notebook.beacon import share_dir
    from jax_nbmem.server.extension import JaxNbMemServer, share_dir_of

    kernel = SimpleNamespace(settings=SimpleNamespace(share_dir="/setting"))
    server = JaxNbMemServer(share_dir="/setting")
    monkeypatch.setenv("JAX_NBMEM_SHARE_DIR", "/from/env")
    # The variable wins over the setting in both (the server's setting used to win).
    assert share_dir(kernel) == share_dir_of(server) == "/from/env"
    assert beacon_dirs(None)[-1] == "/from/env"
    assert beacon_dirs("/found")[-1] == "/found"  # what a face found is taken as found
    monkeypatch.delenv("JAX_NBMEM_SHARE_DIR")
    assert share_dir(kernel) == share_dir_of(server) == "/setting"
    # Neither: no default for a kernel or a server, whatever this machine's /var/tmp holds.
    bare = SimpleNamespace(settings=SimpleNamespace(share_dir=""))
    assert share_dir(bare) == ""
    assert share_dir_of(JaxNbMemServer()) is None
    assert "/setting" not in beacon_dirs(None)


def test_the_note_says_what_is_lost_and_how_to_point_to_the_agent():
    at_shell = agent_not_consulted("no share directory: no node agent", at_shell=True)
    for said in ("Node agent not consulted (no share directory", "mode they started with",
                 "no idle time", "--share-dir DIR", "JAX_NBMEM_SHARE_DIR=DIR",
                 DEFAULT_SHARE_DIR):  # fmt: skip
        assert said in at_shell, at_shell
    assert "--share-dir DIR or" not in agent_not_consulted(None, at_shell=False)


def _in_fresh_var_tmp(make_default: bool) -> list[str]:
    script = "mount -t tmpfs tmpfs /var/tmp"
    if make_default:
        script += f" && install -d -m 1777 {DEFAULT_SHARE_DIR}"
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            script + ' && exec "$@"', "sh"]  # fmt: skip


@pytest.fixture
def root_env(simgpu_env):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: a mount namespace of its own")
    env = {**os.environ, **simgpu_env, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("JAX_NBMEM_SHARE_DIR", None)  # nothing given: the documented folder or none
    return env


def test_the_exporter_is_the_node_agent_in_the_documented_folder_with_no_flag(root_env):
    exporter = subprocess.Popen(
        [*_in_fresh_var_tmp(True), sys.executable, "-m", "jax_nbmem.cli", "exporter",
         "--listen", "127.0.0.1:0", "--interval", "0.2"],
        env=root_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = exporter.stdout.readline()
        assert line.startswith("jax-nbmem exporter: serving"), line + exporter.stderr.read()
        said = [exporter.stderr.readline() for _ in range(2)]  # the socket, the first count
    finally:
        exporter.send_signal(signal.SIGTERM)
        exporter.wait(15)
    assert f"socket {DEFAULT_SHARE_DIR}/agent/agent.sock" in said[0], said
    assert "acting as the node agent" in said[0] and "the node agent proves 0 kernels" in said[1]


def test_the_culler_takes_the_documented_folder_and_says_it_when_it_is_missing(root_env):
    command = [sys.executable, "-m", "jax_nbmem.cli", "cull", "--dry-run", "--once"]
    done = subprocess.run([*_in_fresh_var_tmp(False), *command], env=root_env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and DEFAULT_SHARE_DIR in done.stderr, done.stderr
    done = subprocess.run([*_in_fresh_var_tmp(True), *command], env=root_env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
