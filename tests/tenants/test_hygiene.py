"""Other people's text reaches a terminal inert, tokens never leave, only kernels are kernels.

Real processes on the simulated GPU, seen through ``jax-nbmem status`` (text and JSON) as
another user of the machine would see them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jax_nbmem.gpu.nvml import GpuMemory, GpuProcess
from jax_nbmem.node.servers import shutdown_kernel
from jax_nbmem.simgpu import GIB
from jax_nbmem.tenants.attribution import attribute
from jax_nbmem.text import mask_secrets, printable
from tests.ipython_session import clean_environ

EVIL_NOTEBOOK = "\x1b]0;PWNED\x07\x1b[2J\u202eevil.ipynb"
SECRET = "4f3c2b1a0d9e8f7a6b5c4d3e2f1a0b9c"


@pytest.fixture
def neighbour():
    """A process whose command line carries a token and whose notebook name is hostile."""
    env = clean_environ()
    env["JPY_SESSION_NAME"] = EVIL_NOTEBOOK
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(120)",
            f"--IdentityProvider.token={SECRET}",
            "--ServerApp.password",
            SECRET,
        ],
        env=env,
    )
    yield process
    process.kill()
    process.wait(30)


def _cli(*args, env):
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_status_shows_hostile_names_inert_and_no_token(neighbour, sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).process(0, neighbour.pid, 3 * GIB).write()
    text = _cli("status", env=simgpu_env)
    assert f"pid {neighbour.pid}" in text
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b]0;PWNED\\x07\\x1b[2J\\u202eevil.ipynb" in text  # there, but shown inert
    assert SECRET not in text
    raw = _cli("status", "--json", env=simgpu_env)
    assert SECRET not in raw
    (process,) = json.loads(raw)["processes"]
    assert process["notebook"] == EVIL_NOTEBOOK  # the data is exact; JSON escapes it itself
    assert "--IdentityProvider.token=***" in process["cmdline"]


def test_a_process_that_only_names_a_connection_file_is_no_kernel(tmp_path):
    connection = tmp_path / "kernel-0a1b2c3d.json"
    connection.write_text("{}")
    tail = subprocess.Popen(["tail", "-f", str(connection)])
    try:
        gpus = [GpuMemory(0, "GPU-0", "Simulated", 80 * GIB, 4 * GIB, 76 * GIB)]
        (tenant,) = attribute([GpuProcess(tail.pid, 0, 2 * GIB)], gpus, sessions={})
        assert tenant.kind == "process" and tenant.kernel_id is None
        refused = shutdown_kernel(tail.pid, [tenant], confirm=True)
        assert refused.done is False and "not a Jupyter kernel" in refused.message
        assert tail.poll() is None  # still running: nothing was sent to it
    finally:
        tail.kill()
        tail.wait(30)


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["jupyter-lab", "--IdentityProvider.token=abc"], "--IdentityProvider.token=***"),
        (["jupyter-notebook", "--NotebookApp.token", "abc"], "--NotebookApp.token ***"),
        (["python", "-m", "ipykernel_launcher", "--Session.key=b'abc'"], "--Session.key=***"),
        (["curl", "http://127.0.0.1:8888/api?token=abc&x=1"], "?token=***&x=1"),
        (["app", "--api-key=abc", "password=abc"], "--api-key=*** password=***"),
    ],
)
def test_token_like_arguments_are_masked(args, shown):
    text = " ".join(mask_secrets(args))
    assert shown in text and "abc" not in text


def test_printable_keeps_ordinary_text_and_escapes_controls():
    assert printable("naïve — 日本語.ipynb") == "naïve — 日本語.ipynb"
    assert printable("a\nb\tc\x1b[31m\u200b") == "a\\x0ab\\x09c\\x1b[31m\\u200b"
