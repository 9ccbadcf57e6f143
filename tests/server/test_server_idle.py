"""Issue 24, item 10: the server's status says how idle each of its kernels is, beacon or not.

The server knows every kernel's last activity. A kernel whose process its command line does
not reveal as a Jupyter kernel (a kernel of another language, a wrapper script) and a kernel
whose beacon has no finished cell yet (the extension loaded by the kernel's configuration,
nothing run) still get their idleness from the server: ``idle_source: server``.
"""

import json
import sys

import pytest

from jax_nbmem.simgpu import GIB, SimState
from tests.server.test_extension import call, kernel_pids, start_session
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel
pytest_plugins = ("tests.jupyterlab",)


def test_every_kernel_on_the_gpu_has_its_servers_idle_time(
    start_lab_server, sim_state, simgpu_env, tmp_path
):
    # A kernel that is no ipykernel (its command line names no connection file as ipykernel
    # does), and the python3 kernel with jax_nbmem loaded at its start by its configuration.
    jupyter = tmp_path / "share" / "jupyter"
    spec = jupyter / "kernels" / "sleeper"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", "import time; time.sleep(600)", "{connection_file}"],
        "display_name": "sleeper", "language": "python",
    }))  # fmt: skip
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text(
        'c.InteractiveShellApp.extensions = ["jax_nbmem"]\n'
    )
    sim_state.gpu(0, total=80 * GIB).write()
    env = {
        **simgpu_env,
        "JAX_PLATFORMS": "cpu",
        "JUPYTER_PATH": str(jupyter),
        "IPYTHONDIR": str(tmp_path / "ipython"),
    }
    server = start_lab_server(env=env)
    status, sleeper = call(server, "api/kernels", "POST", {"name": "sleeper"})
    assert status == 201, sleeper
    # As JupyterLab opens it: its kernel (and so its beacon) has the full path.
    loaded = start_session(server, "train.ipynb", name="train.ipynb")["kernel"]
    ids = (sleeper["id"], loaded["id"])
    pids = wait_for(
        "both kernels' PIDs", lambda: (p := kernel_pids(server)) and all(i in p for i in ids) and p
    )
    state = SimState(sim_state.path).gpu(0, total=80 * GIB)
    state.process(0, pids[ids[0]], 2 * GIB).process(0, pids[ids[1]], 3 * GIB).write()

    def seen():
        status, report = call(server, "jax-nbmem/api/status")
        processes = {p["pid"]: p for p in report.get("processes", [])}
        if not all(pids[i] in processes for i in ids):
            return None
        if processes[pids[ids[1]]]["source"] != "beacon":
            return None  # its beacon not written yet
        return processes

    processes = wait_for("both kernels on the GPU, one by its beacon", seen, 60)
    other, with_beacon = processes[pids[ids[0]]], processes[pids[ids[1]]]
    assert other["kind"] == "kernel" and other["kernel_id"] == ids[0]
    assert other["idle_s"] is not None and other["idle_s"] >= 0
    assert other["idle_source"] == "server"
    assert with_beacon["notebook_shown"] == "train.ipynb"  # as the server names it
    assert with_beacon["notebook"] == str(server.root_dir / "train.ipynb")
    assert with_beacon["idle_s"] is not None and with_beacon["idle_source"] == "server"
