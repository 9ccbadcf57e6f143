"""What a kernel says of itself, in its beacon and in its own status row (issue 24, items 3, 7, 8).

Real kernels, started as a Jupyter server starts them, on the simulated GPU where NVML must
list them: a kernel knows itself from its session, never from a beacon file read back.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest
from jupyter_client.multikernelmanager import MultiKernelManager

from jax_nbmem.simgpu import GIB
from tests.ipython_session import clean_environ
from tests.kernels import execute
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


START_JAX = "import jax.numpy as jnp\njnp.ones(1).block_until_ready()\n"
UUID = "GPU-24242424-0303-0808-2424-030303030303"


def _execute(client, code: str) -> str:
    out, error = execute(client, code)
    assert error is None, out
    return out


_WATCH_LOOKS = (
    "print(get_ipython().magics_manager.registry['JaxNbMemMagics'].session.watcher._generation)"
)


def _watch_looks(client) -> int:
    """How many reports the kernel's status watch has made so far."""
    return int(_execute(client, _WATCH_LOOKS).strip())


def _own_row(text: str, pid: int) -> str:
    (row,) = [line for line in text.splitlines() if line.strip().startswith(f"pid {pid} ")]
    return row


def _own_process(client, pid: int) -> dict:
    report = json.loads(_execute(client, "%jaxmem status --json"))
    (own,) = [p for p in report["processes"] if p["pid"] == pid]
    return own


def test_this_kernels_own_row_is_what_it_knows_of_itself(simgpu_env, sim_state):
    with served_kernel(env=simgpu_env) as (kernels, kernel_id, client):
        pid = kernels.get_kernel(kernel_id).provisioner.process.pid
        sim_state.gpu(0, total=80 * GIB, uuid=UUID).process(0, pid, 300 << 20).write()
        _execute(client, "%load_ext jax_nbmem\n%jaxalloc off")
        # its beacon: not started, and the GPU its pool will go on (the server's red item)
        _says(pid, mode_requested="off", mode_in_effect=None, pool_gpus=[UUID])

        # JAX starts on the CPU in the cell that asks for the status.
        text = _execute(client, START_JAX + "%jaxmem status")
        row = _own_row(text, pid)
        assert "this kernel" in row and "(mode: off)" in row, text
        assert "[this kernel's own record]" in row, text
        assert "idle" not in row and "not started" not in row, text
        assert "This kernel's JAX started on cpu with: off" in text
        own = _own_process(client, pid)
        assert (own["source"], own["mode"], own["idle_s"], own["preallocated"]) == (
            "session", "off", None, False
        )  # fmt: skip
        # Others read its beacon: the mode it runs.
        _says(pid, mode_in_effect="off", pool_fraction=0.0, pool_gpus=None)


def test_a_kernel_names_its_notebook_only_from_what_it_knows_of_itself(
    simgpu_env, sim_state, tmp_path
):
    share = tmp_path / "share"
    mine = "/home/bob/mine.ipynb"
    env = {**simgpu_env, "JPY_SESSION_NAME": mine, "JAX_NBMEM_SHARE_DIR": str(share)}
    with served_kernel(env=env) as (kernels, kernel_id, client):
        pid = kernels.get_kernel(kernel_id).provisioner.process.pid
        sim_state.gpu(0, total=80 * GIB, uuid=UUID).process(0, pid, 300 << 20).write()
        _execute(client, "%config JaxNbMem.status_interval = 0.5\n%load_ext jax_nbmem")
        facts = _says(pid, share, notebook=mine)
        # Another kernel of this user (in a container of its own, with PIDs of its own) writes
        # its beacon to the shared folder under the same name, and newer.
        hog = "/home/hubalice/hog.ipynb"
        claim = {**facts, "notebook": hog, "written_at": time.time() + 3600}
        (share / f"jax_nbmem-beacon-{pid}.json").write_text(json.dumps(claim))
        assert mine in _own_row(_execute(client, "%jaxmem status"), pid)
        # Several looks of the status watch (each may rewrite the beacon) since the forgery:
        looked = _watch_looks(client)
        wait_for("three more looks of the status watch", lambda: _watch_looks(client) >= looked + 3)
        assert _own_process(client, pid)["notebook"] == mine
        (share / f"jax_nbmem-beacon-{pid}.json").unlink()
        _execute(client, "print('a cell')")  # the beacon is rewritten when it changes
        _says(pid, notebook=mine, cell_running=False)
        assert _beacon(pid)["notebook"] == mine

        # VS Code names the notebook in the namespace: that is this kernel's, and when it
        # goes, the name it gave goes too.
        _execute(client, "__vsc_ipynb_file__ = '/home/bob/code.ipynb'")
        assert _own_process(client, pid)["notebook"] == "/home/bob/code.ipynb"
        _says(pid, notebook="/home/bob/code.ipynb")
        _execute(client, "del __vsc_ipynb_file__")
        _says(pid, notebook=mine)
        assert _own_process(client, pid)["notebook"] == mine
