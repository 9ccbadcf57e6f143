"""The exporter's systemd unit: it verifies, it is locked down, it says a missing share dir."""

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
    assert "DynamicUser=yes" in text and "User=root" not in text
    env = (REPO / "deploy" / "jax-nbmem-exporter.env").read_text()
    assert "--listen 127.0.0.1:9840" in env
    tmpfiles = (REPO / "deploy" / "jax-nbmem-exporter.tmpfiles").read_text()
    assert re.search(r"^d /var/tmp/jax_nbmem 1777 root root -$", tmpfiles, re.M)


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
