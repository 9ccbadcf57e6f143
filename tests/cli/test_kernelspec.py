"""`jax-nbmem kernel install/list/remove`: kernelspecs that start a real kernel in their mode."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from jax_nbmem.allocator.jaxlib import installed_jaxlib
from tests.ipython_session import clean_environ
from tests.kernels import execute, running_kernel

# The fraction variable the installed jaxlib reads (the deprecated name before 0.4.33).
FRACTION_NAME = installed_jaxlib().fraction_variable

pytestmark = pytest.mark.kernel

ENV_DUMP = (
    "import os, json; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith('XLA_')}))"
)


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", *args],
        capture_output=True,
        text=True,
        env=env or clean_environ(),
        timeout=60,
    )


def test_kernelspec_in_a_prefix_is_found_and_starts_in_its_mode(tmp_path):
    installed = _cli("kernel", "install", "--allocator", "off", "--prefix", str(tmp_path))
    assert installed.returncode == 0, installed.stderr
    kernels_dir = tmp_path / "share" / "jupyter" / "kernels"
    found = KernelSpecManager(kernel_dirs=[str(kernels_dir)]).get_all_specs()
    spec = found["jax-nbmem-off"]["spec"]
    assert spec["display_name"] == "Python 3 (JAX, no preallocation)"
    assert spec["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"

    with running_kernel("jax-nbmem-off", kernel_dirs=[str(kernels_dir)]) as (_, client):
        env_text, error = execute(client, ENV_DUMP)
        assert error is None
        assert json.loads(env_text) == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        report, error = execute(client, "%jaxalloc")
        assert error is None, report
        assert "requested:   off" in report
        assert "[from $JAX_NBMEM_ALLOCATOR]" in report
        assert "backend:     not started" in report
        execute(client, "import jax.numpy as jnp; jnp.ones(2)")
        report, _ = execute(client, "%jaxalloc")
        assert "started in cell" in report and "with: off" in report
        late, _ = execute(client, "%jaxalloc on")
        assert "'on' cannot take effect in this kernel" in late
        assert "notebook's first cell" in late and "restart the kernel" in late


def test_install_refuses_to_overwrite_and_the_spec_enables_the_debugger(tmp_path):
    first = _cli("kernel", "install", "--allocator", "fraction=0.3", "--prefix", str(tmp_path))
    assert first.returncode == 0, first.stderr
    again = _cli("kernel", "install", "--allocator", "fraction 0.3", "--prefix", str(tmp_path))
    assert again.returncode == 1
    assert "already installed" in again.stderr and "--replace" in again.stderr
    replaced = _cli(
        "kernel", "install", "--allocator", "fraction 0.3", "--prefix", str(tmp_path),
        "--display-name", "mine", "--replace",
    )  # fmt: skip
    assert replaced.returncode == 0, replaced.stderr
    spec_path = (
        tmp_path / "share" / "jupyter" / "kernels" / "jax-nbmem-fraction-0.3" / "kernel.json"
    )
    spec = json.loads(spec_path.read_text())
    assert spec["display_name"] == "mine"
    assert spec["metadata"]["debugger"] is True  # JupyterLab's debugger is on for it


def test_cli_help_and_errors_name_the_modes_as_the_magic_does():
    from jupyter_core.paths import SYSTEM_JUPYTER_PATH

    forms = ", ".join(["on", "off", "fraction F", "auto", *installed_jaxlib().allocators])
    helped = _cli("kernel", "install", "--help")
    text = " ".join(helped.stdout.split())  # argparse wraps lines
    assert f"one of {forms}" in text
    assert f"{SYSTEM_JUPYTER_PATH[0]}/kernels" in text and "may need root" in text
    if "address" not in installed_jaxlib().allocators:
        assert "address" not in text
    bad = _cli(
        "kernel", "install", "--allocator", "fraction 1.7", "--prefix", str(Path("/nonexistent"))
    )
    assert bad.returncode == 2
    assert f"valid modes: {forms} (F: 0 < F <= 1)" in bad.stderr


def test_status_without_a_gpu_reports_no_host_memory_of_the_cli_itself():
    env = {**clean_environ(), "LD_LIBRARY_PATH": ""}
    status = _cli("status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["gpus"] == [] and report["host"] is None  # the key stays, the value says
    text = _cli("status", env=env).stdout
    assert "RSS" not in text


def test_fraction_kernel_clears_a_contradicting_variable_from_the_server(tmp_path):
    _cli("kernel", "install", "--allocator", "fraction=0.25", "--prefix", str(tmp_path))
    kernels_dir = str(tmp_path / "share" / "jupyter" / "kernels")
    # The server was started with the deprecated name; jaxlib raises if both are set.
    server_env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}
    with running_kernel("jax-nbmem-fraction-0.25", env=server_env, kernel_dirs=[kernels_dir]) as (
        _,
        client,
    ):
        env_text, _ = execute(client, ENV_DUMP)
        assert json.loads(env_text) == {FRACTION_NAME: "0.25"}


def test_kernel_list_and_remove_through_the_cli(tmp_path):
    _cli(
        "kernel",
        "install",
        "--allocator",
        "platform",
        "--name",
        "gpu-small",
        "--prefix",
        str(tmp_path),
        "--display-name",
        "Small GPU footprint",
    )
    env = clean_environ()
    env["JUPYTER_PATH"] = str(tmp_path / "share" / "jupyter")
    listed = json.loads(_cli("kernel", "list", "--json", env=env).stdout)
    assert [(k["name"], k["allocator"], k["display_name"]) for k in listed] == [
        ("gpu-small", "platform", "Small GPU footprint")
    ]
    refused = _cli("kernel", "remove", "python3", env=env)
    assert refused.returncode == 1 and "not made by jax_nbmem" in refused.stderr
    removed = _cli("kernel", "remove", "gpu-small", env=env)
    assert removed.returncode == 0, removed.stderr
    assert json.loads(_cli("kernel", "list", "--json", env=env).stdout) == []
    bad = _cli("kernel", "install", "--allocator", "fraction=2", "--prefix", str(tmp_path))
    assert bad.returncode == 2 and "fraction must be in (0, 1]" in bad.stderr
