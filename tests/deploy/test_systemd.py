"""The exporter's systemd unit: it verifies, it is locked down, it says a missing share dir.

It is also the node agent: uid 0 with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH, /proc read-only,
the share directory writable.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.prometheus import REPO

UNIT = REPO / "deploy" / "jax-nbmem-exporter.service"


def analyze(*args):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is missing")
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def unit(tmp_path):
    """The unit, its ExecStart pointed at this environment's jax-nbmem (verify checks it)."""
    command = shutil.which("jax-nbmem") or str(Path(sys.executable).with_name("jax-nbmem"))
    if not Path(command).exists():
        pytest.skip("no jax-nbmem command in this environment")
    text = UNIT.read_text().replace("/opt/jax_nbmem/bin/jax-nbmem", command)
    path = tmp_path / UNIT.name
    path.write_text(text)
    return path


def test_the_unit_verifies_clean(unit):
    done = analyze("verify", str(unit))
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr


def test_the_unit_is_locked_down_to_medium_or_better(unit):
    done = analyze("security", "--offline=true", str(unit))
    assert done.returncode == 0, done.stderr
    level = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", done.stdout)
    assert level, done.stdout[-2000:]
    assert float(level.group(1)) <= 6.9 and level.group(2) in ("OK", "MEDIUM", "SAFE")
    print(level.group(0))


def test_the_unit_s_shape():
    text = UNIT.read_text()
    assert "After=network-online.target" in text and "Wants=network-online.target" in text
    assert "EnvironmentFile=-/etc/default/jax-nbmem-exporter" in text
    # The node agent: uid 0 (its directory is root's, which kernels trust) with two
    # capabilities, each one it keeps said in a comment, and /proc read-only so that neither
    # writes any process's memory; the share directory writable (the agent's own folder, and
    # the files of dead kernels), nothing else. tests/deploy/test_agent_privileges.py runs the
    # agent under exactly these.
    assert "DynamicUser" not in text and re.search(r"^User=root$", text, re.M)
    settings = dict(re.findall(r"^(\w+)=(.*)$", text, re.M))
    caps = "CAP_SYS_PTRACE CAP_DAC_READ_SEARCH"
    assert settings["CapabilityBoundingSet"] == settings["AmbientCapabilities"] == caps
    comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert "- CAP_SYS_PTRACE: " in comments and "/proc/PID/ns/pid" in comments
    assert "- CAP_DAC_READ_SEARCH: " in comments and "/proc/PID/fd" in comments
    assert "- ReadOnlyPaths=/proc: " in comments and "/proc/PID/mem" in comments
    assert settings["ReadWritePaths"] == "/var/tmp/jax_nbmem"
    assert settings["ReadOnlyPaths"] == "/proc"
    filters = re.findall(r"^SystemCallFilter=(.*)$", text, re.M)
    assert "@system-service" in filters and any("@debug" in f for f in filters if f[0] == "~")
    assert (
        settings["ProtectSystem"] == "strict" and "AF_UNIX" in settings["RestrictAddressFamilies"]
    )
    env = (REPO / "deploy" / "jax-nbmem-exporter.env").read_text()
    assert "--listen 127.0.0.1:9840" in env and "--share-dir /var/tmp/jax_nbmem" in env
    tmpfiles = (REPO / "deploy" / "jax-nbmem-exporter.tmpfiles").read_text()
    assert re.search(r"^d /var/tmp/jax_nbmem 1777 root root -$", tmpfiles, re.M)
    # The agent's directory, root's and 0755, made at boot before any user could make it.
    assert re.search(r"^d /var/tmp/jax_nbmem/agent 0755 root root -$", tmpfiles, re.M)


def test_tmpfiles_makes_the_agent_directory_the_agent_accepts(tmp_path):
    """The tmpfiles lines, applied under another root, make what prepare_agent_dir accepts."""
    from jax_nbmem.agent.server import prepare_agent_dir

    if shutil.which("systemd-tmpfiles") is None:
        pytest.skip("systemd-tmpfiles is missing")
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles gives the directories to root: that needs root")
    config = tmp_path / "jax_nbmem.conf"
    config.write_text((REPO / "deploy" / "jax-nbmem-exporter.tmpfiles").read_text())
    done = subprocess.run(
        ["systemd-tmpfiles", "--create", f"--root={tmp_path}", str(config)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    share = tmp_path / "var" / "tmp" / "jax_nbmem"
    assert share.stat().st_mode & 0o7777 == 0o1777
    assert (share / "agent").stat().st_mode & 0o7777 == 0o755
    assert prepare_agent_dir(str(share)) == str(share / "agent")


@pytest.mark.parametrize("share", [None, "/nonexistent/jax_nbmem"])
def test_a_missing_share_directory_is_logged(share, sim_state, simgpu_env):
    from tests.cli.test_exporter import running_exporter

    pytest.importorskip("prometheus_client")
    sim_state.write()
    env = {k: v for k, v in simgpu_env.items() if k != "JAX_NBMEM_SHARE_DIR"}
    args = ["--share-dir", share] if share else []
    proc_stderr = []
    with running_exporter(env, *args, stderr_to=proc_stderr):
        pass
    said = "".join(proc_stderr)
    assert ("missing or unreadable" if share else "no --share-dir") in said, said
