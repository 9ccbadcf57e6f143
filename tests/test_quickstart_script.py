"""The README's product command: scripts/quickstart.sh starts JupyterLab on the quickstart.

One run of `bash scripts/quickstart.sh --simulated-gpu` for the module, as a newcomer starts it:
no token given (JupyterLab makes one and prints it), a "browser" that only records what it is
asked to open. The tests then follow the printed URL, the opened page, the copy of the
notebook, the neighbour the script started, and the end of it all.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from jax_nbmem.simgpu import SimState
from tests.ipython_session import clean_environ
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "quickstart.ipynb"
NEIGHBOUR = re.compile(r"Simulated neighbour: kernel PID (\d+) \((\S+\.ipynb), preallocated\)")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Quickstart:
    """The script's process, what it printed so far, and how to reach its server."""

    def __init__(self, tmp: Path) -> None:
        """Start it with *tmp* as its temporary folder (the simulated GPU's lives there)."""
        self.tmp, self.port = tmp, _free_port()
        self.opened = tmp / "opened.txt"
        browser = tmp / "browser.sh"  # records the URL JupyterLab opens, opens nothing
        browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {self.opened}\n')
        browser.chmod(0o755)
        env = {**clean_environ(), "JAX_NBMEM_NO_INSTALL": "1", "TMPDIR": str(tmp)}
        env["JUPYTER_RUNTIME_DIR"] = str(tmp / "runtime")
        env.pop("JAX_PLATFORMS")  # as a user's shell: the script and its kernels decide
        command = ["bash", "scripts/quickstart.sh", "--simulated-gpu", f"--port={self.port}",
                   f"--ServerApp.browser={browser} %s"]  # fmt: skip
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def printed_url(self, timeout: float = 150) -> str:
        """The first URL JupyterLab printed, once its server answers there."""
        pattern = re.compile(rf"http://127\.0\.0\.1:{self.port}/\S+")
        deadline = time.monotonic() + timeout
        while True:
            found = pattern.search(self.output)
            if found:
                return found.group(0)
            assert self.process.poll() is None, self.output
            assert time.monotonic() < deadline, f"no URL printed:\n{self.output}"
            time.sleep(0.5)

    @property
    def token(self) -> str:
        return re.search(r"[?&]token=(\w+)", self.printed_url()).group(1)

    def api(self, path: str, body: dict | None = None, method: str | None = None):
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            method=method or ("GET" if body is None else "POST"),
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
        return json.loads(body) if body else None

    def stop(self) -> int:
        """Stop it as a terminal's Ctrl-C would reach it (its whole process group)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    started = Quickstart(tmp_path_factory.mktemp("quickstart"))
    try:
        yield started
    finally:
        started.stop()


def _opens_the_notebook(url: str) -> None:
    """The page at *url* is JupyterLab opening the quickstart, not its Launcher."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        page = answer.read().decode()
    config = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                       page, re.S)  # fmt: skip
    assert config, page[:500]
    assert json.loads(config.group(1))["treePath"] == NOTEBOOK


def test_the_printed_url_opens_the_quickstart_notebook(quickstart):
    url = quickstart.printed_url()
    assert re.fullmatch(rf"http://127\.0\.0\.1:\d+/lab/tree/{NOTEBOOK}\?token=\w+", url), url
    _opens_the_notebook(url)
    # The tree the page opens has that notebook: the server's own contents API says so.
    assert quickstart.api(f"contents/{NOTEBOOK}")["type"] == "notebook"


def test_the_page_a_browser_is_sent_to_opens_the_notebook(quickstart):
    quickstart.printed_url()
    deadline = time.monotonic() + 30
    while not quickstart.opened.exists() or not quickstart.opened.read_text():
        assert time.monotonic() < deadline, "JupyterLab opened no browser"
        time.sleep(0.2)
    opened = quickstart.opened.read_text()
    assert opened.startswith("file://"), opened  # its token stays out of the command line
    redirect = re.search(r'http-equiv="refresh" content="\d+;url=([^"]+)"',
                         Path(opened.removeprefix("file://")).read_text())  # fmt: skip
    assert redirect and f"/lab/tree/{NOTEBOOK}?token=" in redirect.group(1), redirect
    _opens_the_notebook(redirect.group(1).replace("localhost", "127.0.0.1"))


def test_it_serves_a_copy_of_the_notebook_on_a_simulated_gpu(quickstart):
    tracked = ROOT / "notebooks" / NOTEBOOK
    tracked_before = tracked.read_bytes()
    quickstart.printed_url()
    # The server serves the copy's folder, build/quickstart/, as a file argument makes it.
    assert [item["name"] for item in quickstart.api("contents")["content"]] == [NOTEBOOK]
    session = quickstart.api(
        "sessions", {"path": NOTEBOOK, "type": "notebook", "kernel": {"name": "python3"}}
    )
    assert session["path"] == NOTEBOOK
    # The user runs the cells and JupyterLab saves them, outputs and all: into the copy.
    model = quickstart.api(f"contents/{NOTEBOOK}")
    model["content"]["cells"][1]["outputs"] = [
        {"output_type": "stream", "name": "stdout", "text": "a run's output\n"}
    ]
    quickstart.api(f"contents/{NOTEBOOK}", {"type": "notebook", "content": model["content"]}, "PUT")
    assert "a run's output" in (ROOT / "build" / "quickstart" / NOTEBOOK).read_text()
    assert tracked.read_bytes() == tracked_before  # the repository's notebook is untouched
    quickstart.api(f"sessions/{session['id']}", method="DELETE")
    # --simulated-gpu built the stand-in library in this user's own folder, labelled.
    state = quickstart.tmp / f"jax_nbmem-simgpu-{os.getuid()}" / "gpu.state"
    assert "NVIDIA H200 (simulated)" in state.read_text()


def test_the_printed_line_makes_a_terminal_s_status_see_the_simulated_gpu(quickstart):
    """The notebook says `jax-nbmem status` prints the same in a terminal: after this line."""
    quickstart.printed_url()
    (line,) = [line.strip() for line in quickstart.lines
               if line.strip().startswith("export LD_LIBRARY_PATH=")]  # fmt: skip
    # A terminal of the same user: the same folders, neither of the simulation's variables.
    env = {**clean_environ(), "TMPDIR": str(quickstart.tmp)}
    env["JUPYTER_RUNTIME_DIR"] = str(quickstart.tmp / "runtime")
    for name in ("LD_LIBRARY_PATH", "JAX_NBMEM_SIMGPU_STATE"):
        env.pop(name, None)
    status = [sys.executable, "-m", "jax_nbmem.cli", "status", "--json"]
    before = subprocess.run(status, env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(before.stdout)["gpus"] == []  # "no NVIDIA driver", as the issue met
    after = subprocess.run(
        ["bash", "-c", f'{line}\nexec "$@"', "terminal", *status],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    report = json.loads(after.stdout)
    assert [gpu["name"] for gpu in report["gpus"]] == ["NVIDIA H200 (simulated)"], after.stderr
    assert any("neighbour.ipynb" in str(p.get("notebook")) for p in report["processes"]), report


def test_no_news_pop_up_covers_the_panel(quickstart):
    """JupyterLab asks "notified about official Jupyter news?" while fetchNews is "none"."""
    quickstart.printed_url()
    plugin = "@jupyterlab/apputils-extension:notification"
    request = urllib.request.Request(
        f"http://127.0.0.1:{quickstart.port}/lab/api/settings/{plugin}",
        headers={"Authorization": f"token {quickstart.token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        settings = json.loads(response.read())
    # The page's setting is the user's own, else this default: "never", not "ask".
    assert settings["schema"]["properties"]["fetchNews"]["default"] == "false"


def test_python_m_build_in_the_checkout_says_what_it_found(quickstart):
    """The quickstart's build/ folder shadows the `build` package only when it is missing."""
    quickstart.printed_url()
    real = subprocess.run([sys.executable, "-m", "build", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert real.returncode == 0 and real.stdout.startswith("build "), real  # the package wins
    # Without site-packages (-S), as in an environment without the `build` package:
    missing = subprocess.run([sys.executable, "-S", "-m", "build"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 1, missing
    assert "found this checkout's build/ folder" in missing.stderr
    assert "pip install build" in missing.stderr


def test_a_second_quickstart_says_where_the_first_runs_and_changes_nothing(quickstart):
    quickstart.printed_url()
    copy = ROOT / "build" / "quickstart" / NOTEBOOK
    copy_before = copy.read_bytes()
    state = quickstart.tmp / f"jax_nbmem-simgpu-{os.getuid()}" / "gpu.state"
    state_before = state.read_text()
    env = {**clean_environ(), "JAX_NBMEM_NO_INSTALL": "1", "TMPDIR": str(quickstart.tmp)}
    env["JUPYTER_RUNTIME_DIR"] = str(quickstart.tmp / "runtime")
    second = subprocess.run(
        ["bash", "scripts/quickstart.sh", "--simulated-gpu", f"--port={_free_port()}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert second.returncode == 1, second.stdout + second.stderr
    pid = quickstart.process.pid  # the script's PID, JupyterLab's since its exec
    assert f"A quickstart already runs from this checkout: JupyterLab, PID {pid}" in second.stderr
    assert f"http://127.0.0.1:{quickstart.port}/lab/tree/{NOTEBOOK}" in second.stderr.replace(
        "localhost", "127.0.0.1"
    ), second.stderr
    assert "Simulated neighbour" not in second.stdout  # it started no second neighbour
    assert copy.read_bytes() == copy_before and state.read_text() == state_before


def _the_story(quickstart: Quickstart, then: str = "") -> tuple[int, str]:
    """Run All as a user would; the warning, the button and the neighbour's name seen.

    *then*: a cell to run after the notebook's own ({pid}: the neighbour's). Returns the
    neighbour's PID and its notebook's name.
    """
    import nbformat

    from tests.simgpu.test_mirror import shell_env
    from tests.test_notebooks import execute_notebook, text_of

    quickstart.printed_url()
    started = NEIGHBOUR.search(quickstart.output)
    assert started, quickstart.output
    neighbour, name = int(started.group(1)), started.group(2)
    folder = quickstart.tmp / f"jax_nbmem-simgpu-{os.getuid()}"
    # The whole pool it asked for (75%), not what an earlier run's leftovers left free.
    assert SimState.read(folder / "gpu.state").process_bytes(neighbour) > 100 * 2**30
    notebook = ROOT / "notebooks" / NOTEBOOK
    if then:
        extended = nbformat.read(notebook, as_version=4)
        extended.cells.append(nbformat.v4.new_code_cell(then.format(pid=neighbour)))
        notebook = quickstart.tmp / f"then-{neighbour}.ipynb"
        nbformat.write(extended, notebook)
    # Run All, on the GPU the script set up (the same folder's state and startup file).
    env = {k: v for k, v in shell_env(folder).items() if k not in ("JAX_PLATFORMS",)}
    executed = execute_notebook(notebook, env=env)
    text = text_of(executed)
    blocking = [line for line in text.splitlines() if "blocking-preallocation" in line]
    assert blocking, text
    assert str(neighbour) in blocking[0] and name in blocking[0], blocking
    widgets = executed.metadata.get("widgets", {})
    models = widgets.get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    buttons = [m["state"].get("description") for m in models.values()
               if m.get("model_name") == "ButtonModel"]  # fmt: skip
    assert f"Shut down PID {neighbour} ({name})" in buttons, buttons
    return neighbour, text


def test_the_quickstart_names_the_neighbour_the_script_started_and_it_ends_with_it(quickstart):
    neighbour, _ = _the_story(quickstart)
    os.kill(neighbour, 0)  # still there while the script runs
    quickstart.stop()
    _ends(neighbour, "the neighbour outlived the script")


def test_every_run_tells_the_same_story(quickstart):
    """Run again, as a user does: the warning, the button and the neighbour, every time.

    In the same temporary folder, so on the simulated GPU the earlier runs left: once after a
    run that ended with the script, once after the neighbour was shut down from the notebook
    (the panel's button's route: ``%jaxmem shutdown PID --yes``).
    """
    quickstart.stop()  # the first run (the module's): its neighbour ended with it
    second = Quickstart(quickstart.tmp)
    try:
        neighbour, _ = _the_story(second, then="%jaxmem shutdown {pid} --yes")
        _ends(neighbour, "the shut-down neighbour still runs")
        state = SimState.read(quickstart.tmp / f"jax_nbmem-simgpu-{os.getuid()}" / "gpu.state")
        assert state.process_bytes(neighbour) is None  # its memory came back
    finally:
        second.stop()
    third = Quickstart(quickstart.tmp)
    try:
        _the_story(third)
    finally:
        third.stop()


def _ends(pid: int, problem: str) -> None:
    wait_for(f"{problem}: PID {pid}", lambda: not _alive(pid), timeout=30)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return not stat[stat.rindex(")") + 2 :].startswith(("Z", "X"))
