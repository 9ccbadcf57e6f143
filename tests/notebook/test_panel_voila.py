"""The panel in Voilà (``voila nb.ipynb``, standalone: no JupyterLab shell, no jax_nbmem server
extension): the plot draws, follows the GPU, and the page logs no error of ours.

Voilà loads every installed JupyterLab extension into a page that shares only some of
JupyterLab's modules; jax_nbmem's lab extension must stay out of its way there.
"""

import os
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from jax_nbmem.simgpu import GIB
from tests.jupyterlab import REPO_ROOT, _free_port, console_messages, screenshot, write_notebook
from tests.notebook.test_panel_browser import PANEL, plot_state, plotly_source, wait_for_plots
from tests.notebook.test_panel_kernel import OTHER_PID
from tests.waiting import wait_for

pytest_plugins = ("tests.jupyterlab",)
pytestmark = [pytest.mark.browser]


def _use_checkout_labextension(state_dir, env) -> None:
    """This checkout's built lab extension first on JUPYTER_PATH, as a copy: Voilà refuses
    to serve files through a link that leaves the folder it serves (403)."""
    data = state_dir / "jupyter-data"
    shutil.copytree(REPO_ROOT / "jax_nbmem" / "labextension", data / "labextensions" / "jax_nbmem")
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(data), env.get("JUPYTER_PATH")]))


def _start_voila(notebook, state_dir, env) -> tuple[subprocess.Popen, str]:
    env = {**env, "JUPYTER_CONFIG_DIR": str(state_dir / "config")}
    env["JUPYTER_RUNTIME_DIR"] = str(state_dir / "runtime")
    _use_checkout_labextension(state_dir, env)
    port = _free_port()
    log = (state_dir / "voila.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}",
         "--Voila.ip=127.0.0.1", f"--Voila.root_dir={notebook.parent}",
         f"--ServerApp.token={secrets.token_hex(8)}"],
        cwd=notebook.parent, env=env, stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"

    def answers() -> bool:
        assert process.poll() is None, (state_dir / "voila.log").read_text()[-3000:]
        try:
            urllib.request.urlopen(url + "voila/static/", timeout=5)
        except urllib.error.HTTPError:
            return True  # it answers (a folder is not served)
        except OSError:
            return False
        return True

    wait_for("voila answers", answers, timeout=120)
    return process, url


@pytest.mark.timeout(300)
def test_the_panel_draws_and_follows_in_standalone_voila(lab_page, sim_state, simgpu_env, tmp_path):
    sim_state.gpu(0, total=80 * GIB).process(0, OTHER_PID, 20 * GIB).write()
    (tmp_path / "nb").mkdir()
    notebook = write_notebook(
        tmp_path / "nb" / "dash.ipynb", ["%load_ext jax_nbmem\n%jaxmem", "x = 1"]
    )
    state_dir = tmp_path / "voila-state"
    state_dir.mkdir()
    env = {**os.environ, **simgpu_env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.getcwd()}
    process, url = _start_voila(notebook, state_dir, env)
    try:
        loaded_ours = []
        lab_page.on(
            "response",
            lambda r: (
                loaded_ours.append(r.url)
                if "/labextensions/jax_nbmem/static/remoteEntry" in r.url and r.ok
                else None
            ),
        )
        lab_page.goto(url, wait_until="domcontentloaded")
        wait_for_plots(lab_page, 1, 120)
        state = plot_state(lab_page, 0)
        assert "other processes" in state["names"] and "this kernel" in state["names"]
        # No server route here: the kernel's copy, sent with the panel, drew it.
        assert plotly_source(lab_page) == "kernel"
        before = state["last"][0][0]
        wait_for("the plot moves", lambda: plot_state(lab_page, 0)["last"][0][0] > before, 60)
        assert "GPU 0: NVIDIA H200 (simulated)" in lab_page.locator(PANEL).inner_text()
        # Our lab extension loaded (Voilà serves it) and failed at nothing; no 403 for plotly.js.
        assert loaded_ours, "Voilà's page did not load jax_nbmem's lab extension"
        ours = [
            m
            for m in console_messages(lab_page)
            if m.startswith(("error", "pageerror", "warning"))
            and ("jax_nbmem" in m or "jax-nbmem" in m or "statusbar" in m or "403" in m)
        ]
        assert not ours, ours
        screenshot(lab_page, "panel-voila")
    finally:
        process.terminate()
        process.wait(timeout=30)
