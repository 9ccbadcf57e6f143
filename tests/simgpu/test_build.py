"""Building the stand-in library: without a C compiler, the demo says what to install."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jax_nbmem import simgpu
from jax_nbmem.simgpu import simulator

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_compiler(tmp_path, monkeypatch):
    """A PATH with python and nothing else on it, and no $CC."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CC", raising=False)
    return bin_dir


def test_without_a_compiler_build_says_what_to_install_and_leaves_nothing(no_compiler, tmp_path):
    dest = tmp_path / "sim"
    dest.mkdir()
    with pytest.raises(RuntimeError) as caught:
        simgpu.build(dest)
    message = str(caught.value)
    assert message == simulator.NO_COMPILER
    assert "C compiler" in message and "apt-get install gcc" in message and "set CC" in message
    assert list(dest.iterdir()) == []


def test_a_cc_that_cannot_run_is_said_not_raised_as_oserror(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(RuntimeError, match="could not run .*set CC to a C compiler"):
        simgpu.build(tmp_path / "sim")
    assert not any(path.is_file() for path in (tmp_path / "sim").rglob("*"))


def test_the_demo_script_stops_with_that_message_before_jupyterlab(no_compiler, tmp_path):
    for tool in ("dirname", "mkdir", "cp", "id", "cat"):
        (no_compiler / tool).symlink_to(shutil.which(tool, path=os.defpath))
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_NBMEM_NO_INSTALL="1", TMPDIR=str(tmp_path))
    done = subprocess.run(
        ["/bin/bash", ROOT / "scripts/quickstart.sh", "--simulated-gpu", "--no-browser"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode != 0
    assert simulator.NO_COMPILER in done.stderr
    assert "Running a copy" not in done.stdout  # JupyterLab was never started
