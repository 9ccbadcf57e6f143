"""What a kernel's beacon says of the kernel itself (issue 24, items 7 and 8), in real kernels."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from jupyter_client.multikernelmanager import MultiKernelManager

from tests.ipython_session import clean_environ
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel


def _beacon(pid: int, folder: str | Path | None = None) -> dict | None:
    path = Path(folder or os.environ["JUPYTER_RUNTIME_DIR"]) / f"jax_nbmem-beacon-{pid}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet, or replaced while read
        return None


def _says(pid: int, folder=None, **expect) -> dict:
    def check():
        facts = _beacon(pid, folder)
        return facts if facts and all(facts.get(k) == v for k, v in expect.items()) else None

    try:
        return wait_for(f"the beacon of {pid} saying {expect}", check, 20)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it says {_beacon(pid, folder)}") from None


@contextlib.contextmanager
def served_kernel(extra_arguments=(), env=None):
    """A kernel started as a Jupyter server starts one (``kernel-<id>.json``), and its client."""
    kernels = MultiKernelManager(connection_dir=os.environ["JUPYTER_RUNTIME_DIR"])
    full_env = clean_environ()
    full_env.update(env or {})
    kernel_id = kernels.start_kernel(
        kernel_name="python3", env=full_env, extra_arguments=list(extra_arguments)
    )
    manager = kernels.get_kernel(kernel_id)
    client = manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield kernels, kernel_id, client
    finally:
        client.stop_channels()
        kernels.shutdown_all(now=True)


def test_a_kernel_that_loads_jax_nbmem_in_a_startup_file_names_its_kernel_id(tmp_path):
    # A site's startup file loads the extension, then goes on setting up: while it runs,
    # IPython has swapped sys.argv for the file's own.
    startup = tmp_path / "00-jax.py"
    startup.write_text(
        "get_ipython().run_line_magic('load_ext', 'jax_nbmem')\n"
        "import time\n"
        "time.sleep(1.5)  # the rest of the site's set-up\n"
    )
    arguments = [f"--IPKernelApp.exec_files={[str(startup)]!r}"]
    with served_kernel(arguments) as (kernels, kernel_id, client):
        assert kernels.get_kernel(kernel_id).connection_file.endswith(f"kernel-{kernel_id}.json")
        for _ in range(3):  # at its start, and after each restart (the same kernel id)
            pid = kernels.get_kernel(kernel_id).provisioner.process.pid
            _says(pid, kernel_id=kernel_id)
            kernels.restart_kernel(kernel_id, now=False)
            client.wait_for_ready(timeout=60)
