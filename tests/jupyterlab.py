"""Real-browser test harness: a JupyterLab server and Debian's chromium driven by Playwright.

A browser test reads like a person's session::

    pytest_plugins = ("tests.jupyterlab",)  # the fixtures below (or once, in a root conftest)

    @pytest.mark.browser
    def test_panel(lab_server, lab_page):
        write_notebook(lab_server.root_dir / "panel.ipynb", ["%load_ext jax_nbmem", "%jaxmem"])
        open_notebook(lab_page, lab_server, "panel.ipynb")
        run_all_cells(lab_page)
        screenshot(lab_page, "panel")

Tests that need their own kernel environment (a simulated GPU through LD_LIBRARY_PATH) take
``start_lab_server`` and call ``start_lab_server(env={...})`` instead of ``lab_server``.

Everything stays offline: the server checks for no updates and fetches no news, and chromium
resolves no host name (only the loopback address is reached). When a test using these fixtures
fails, the server log, the browser console and a screenshot are copied to :func:`artifacts_dir`
and the log's tail is added to the failure report.

PYTEST_DONT_REWRITE: test modules import these helpers before pytest loads this module as a
plugin, too late for assertion rewriting; the helpers raise their own errors, never assert.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest

__all__ = [
    "ARTIFACTS_ENV",
    "CHROMIUM_ARGS",
    "CHROMIUM_PATH",
    "LabServer",
    "artifacts_dir",
    "chromium_page",
    "console_messages",
    "dismiss_dialogs",
    "open_notebook",
    "require_chromium",
    "run_all_cells",
    "running_lab",
    "screenshot",
    "start_lab",
    "wait_cells_executed",
    "wait_kernel_connected",
    "write_notebook",
]

CHROMIUM_PATH = "/usr/bin/chromium"
ARTIFACTS_ENV = "JAX_NBMEM_ARTIFACTS"
REPO_ROOT = Path(__file__).resolve().parents[1]

CHROMIUM_ARGS = (
    "--no-sandbox",  # runs as root in containers, where the setuid sandbox is unavailable
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    # Every host name fails to resolve: the page can reach 127.0.0.1 and nothing else.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)

# Settings a fresh JupyterLab starts with, so no popup covers the notebook and nothing
# goes to the network. windowingMode "none" keeps every cell attached to the DOM: plots
# and panels below the fold are then measured and drawn like the visible ones.
_LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}

_SERVER_TIMEOUT_S = 90.0
_STOP_WAIT_S = 15.0
_EXECUTED_PROMPT = re.compile(r"^\[\d+\]:$")


def artifacts_dir() -> Path:
    """Return the folder for screenshots and logs (``$JAX_NBMEM_ARTIFACTS`` or ``artifacts/``)."""
    folder = Path(os.environ.get(ARTIFACTS_ENV) or REPO_ROOT / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "artifact"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class LabServer:
    """A JupyterLab server this test started; :meth:`stop` ends it and the kernels it left."""

    process: subprocess.Popen
    port: int
    token: str = field(repr=False)
    root_dir: Path
    log_path: Path
    _log_file: Any = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def base_url(self) -> str:
        """Return ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def notebook_url(self, name: str) -> str:
        """Return the browser address of notebook ``name`` (relative to ``root_dir``)."""
        return f"{self.base_url}/lab/tree/{name}?token={self.token}"

    def api(self, path: str, method: str = "GET", body: Any = None) -> Any:
        """Call the REST API at ``/api/PATH`` with the token; return the decoded JSON reply."""
        request = urllib.request.Request(
            f"{self.base_url}/api/{path.lstrip('/')}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            reply = response.read()
        return json.loads(reply) if reply else None

    def log_tail(self, lines: int = 120) -> str:
        """Return the last ``lines`` lines of the server log (kernels write there too)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as error:
            return f"(no server log: {error})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM the server by its PID, SIGKILL it if it lingers, then end its kernels.

        Calling it again does nothing.
        """
        if self._stopped:
            return
        self._stopped = True
        # Until the server is reaped its PID cannot be reused, so its children are its own.
        kernels = _kernel_processes(self.process.pid, self.process.returncode is None)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # the server shuts its kernels down first
            try:
                self.process.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(_STOP_WAIT_S)
        for kernel in kernels:
            _end_process_group(kernel)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _kernel_processes(server_pid: int, server_alive: bool) -> list[psutil.Process]:
    """Find the kernels a server started: its children, and orphans whose env names it."""
    found: dict[int, psutil.Process] = {}
    if server_alive:
        try:
            for child in psutil.Process(server_pid).children(recursive=True):
                found[child.pid] = child
        except psutil.Error:
            pass
    # jupyter_client sets JPY_PARENT_PID in each kernel's env; orphans keep it after a crash.
    for process in psutil.process_iter():
        try:
            if process.environ().get("JPY_PARENT_PID") == str(server_pid):
                found[process.pid] = process
        except psutil.Error:
            continue
    return list(found.values())


def _end_process_group(process: psutil.Process) -> None:
    """End a kernel and what it spawned: jupyter_client starts each kernel in its own session."""
    try:
        if not process.is_running():
            return
        group = os.getpgid(process.pid)
    except (psutil.Error, ProcessLookupError):
        return
    own_group = group == process.pid  # never signal a group we did not create (e.g. pytest's)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            if own_group:
                os.killpg(group, sig)
            else:
                process.send_signal(sig)
            process.wait(5)
            return
        except (psutil.TimeoutExpired, ProcessLookupError):
            continue
        except psutil.NoSuchProcess:
            return


def _write_lab_settings(settings_dir: Path) -> None:
    for plugin, values in _LAB_SETTINGS.items():
        target = settings_dir / f"{plugin}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))


def _lab_command(port: int, token: str, root_dir: Path, state_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root_dir}",
        f"--IdentityProvider.token={token}",
        "--ServerApp.allow_root=True",
        "--ServerApp.terminals_enabled=False",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        f"--LabApp.user_settings_dir={state_dir / 'user-settings'}",
        f"--LabApp.workspaces_dir={state_dir / 'workspaces'}",
        "--LanguageServerManager.autodetect=False",
    ]


def _wait_until_up(server: LabServer, timeout: float) -> bool:
    """Poll ``/api/status``; False when the server exited (e.g. its port was taken)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            server.api("status")
            return True
        except (OSError, ValueError):
            time.sleep(0.25)
    server.stop()
    raise TimeoutError(f"JupyterLab did not answer in {timeout:.0f}s:\n{server.log_tail()}")


def _use_checkout_labextension(state_dir: Path, env: dict[str, str]) -> None:
    """Serve this checkout's built JupyterLab extension, whatever copy pip installed.

    A folder first on ``JUPYTER_PATH`` holds ``labextensions/jax_nbmem``, a link to
    ``jax_nbmem/labextension`` here: JupyterLab and Notebook 7 take it over an installed copy
    of the same name (an editable install copies the built files once, when it runs).
    """
    built = REPO_ROOT / "jax_nbmem" / "labextension"
    if not (built / "package.json").is_file():
        return
    data = state_dir / "jupyter-data"
    (data / "labextensions").mkdir(parents=True, exist_ok=True)
    link = data / "labextensions" / "jax_nbmem"
    if not link.exists():
        link.symlink_to(built, target_is_directory=True)
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(data), env.get("JUPYTER_PATH")]))


def start_lab(
    root_dir: Path,
    state_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = _SERVER_TIMEOUT_S,
) -> LabServer:
    """Start JupyterLab serving ``root_dir`` and return once ``/api/status`` answers.

    ``env`` is the whole environment of the server and so of its kernels (default: this
    process's). Config, runtime files, settings, workspaces and the log
    (``state_dir/server.log``) go under ``state_dir``, so no user configuration leaks in.
    """
    root_dir, state_dir = Path(root_dir), Path(state_dir)
    root_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    _write_lab_settings(state_dir / "user-settings")
    server_env = dict(os.environ if env is None else env)
    server_env.setdefault("JUPYTER_CONFIG_DIR", str(state_dir / "config"))
    server_env["JUPYTER_RUNTIME_DIR"] = str(state_dir / "runtime")
    _use_checkout_labextension(state_dir, server_env)
    log_path = state_dir / "server.log"
    for _attempt in range(3):  # another process may grab the free port before the server does
        port, token = _free_port(), secrets.token_hex(24)
        log_file = log_path.open("ab")
        process = subprocess.Popen(
            _lab_command(port, token, root_dir, state_dir),
            cwd=root_dir,
            env=server_env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        server = LabServer(process, port, token, root_dir, log_path, log_file)
        if _wait_until_up(server, timeout):
            return server
        server.stop()
    raise RuntimeError(f"JupyterLab exited during startup:\n{server.log_tail()}")


@contextmanager
def running_lab(
    root_dir: Path, state_dir: Path, *, env: Mapping[str, str] | None = None
) -> Iterator[LabServer]:
    """Run JupyterLab for the duration of a ``with`` block (see :func:`start_lab`)."""
    server = start_lab(root_dir, state_dir, env=env)
    try:
        yield server
    finally:
        server.stop()


def wait_kernel_connected(
    server: LabServer, timeout: float = 60.0, notebook: str | None = None
) -> dict:
    """Wait until a notebook's kernel has a browser connection and is idle; return its model.

    ``notebook`` is the path relative to ``root_dir``; ``None`` accepts any session. The
    server's ``connections`` count proves the page's websocket is open, which the idle
    indicator alone does not (it can show before the kernel channel is up).
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            sessions = server.api("sessions")
            for session in sessions:
                if notebook is not None and session.get("path") != notebook:
                    continue
                kernel = server.api(f"kernels/{session['kernel']['id']}")
                last = kernel
                if kernel.get("connections", 0) >= 1 and kernel["execution_state"] == "idle":
                    return kernel
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.25)
    raise TimeoutError(f"no connected idle kernel for {notebook!r} in {timeout:.0f}s: {last}")


def write_notebook(path: Path, cells: Sequence[str]) -> Path:
    """Write a Python 3 notebook with one code cell per source string; return its path."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    path = Path(path)
    nbformat.write(notebook, path)
    return path


def require_chromium() -> str:
    """Return chromium's path; skip the test when it is missing, unless ``CI`` is set (fail)."""
    reason = None
    if not Path(CHROMIUM_PATH).exists():
        reason = f"{CHROMIUM_PATH} is missing (run .ci/browser-deps.sh)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError as error:
            reason = f"Playwright for Python is not installed ({error})"
    if reason is None:
        return CHROMIUM_PATH
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail(f"browser tests need chromium under CI: {reason}")
    pytest.skip(reason)


_CONSOLE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextmanager
def chromium_page(profile_dir: Path, *, width: int = 1280, height: int = 900) -> Iterator[Any]:
    """Yield a Playwright page in headless Debian chromium with a fresh profile ``profile_dir``."""
    executable = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile_dir),
            executable_path=executable,
            headless=True,
            args=list(CHROMIUM_ARGS),
            viewport={"width": width, "height": height},
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(30_000)
            messages: list[str] = []
            _CONSOLE[page] = messages
            page.on("console", lambda message: messages.append(f"{message.type}: {message.text}"))
            page.on("pageerror", lambda error: messages.append(f"pageerror: {error}"))
            yield page
        finally:
            context.close()


def console_messages(page: Any) -> list[str]:
    """Return what the page wrote to its console so far (errors and uncaught exceptions too)."""
    return list(_CONSOLE.get(page, []))


def dismiss_dialogs(page: Any) -> list[str]:
    """Close popups that would cover the notebook; return what was closed.

    A "Select Kernel" dialog is accepted (the default kernel starts); any other dialog is
    cancelled; toast notifications are hidden.
    """
    closed = []
    for dialog in page.locator(".jp-Dialog").all():
        if not dialog.is_visible():
            continue
        title = dialog.locator(".jp-Dialog-header").inner_text().strip()
        choice = ".jp-mod-accept" if "kernel" in title.lower() else ".jp-mod-reject"
        buttons = dialog.locator(f".jp-Dialog-button{choice}")
        if buttons.count():
            buttons.first.click()
        else:
            page.keyboard.press("Escape")
        closed.append(f"dialog: {title}")
    for button in page.get_by_role("button", name="Hide notification").all():
        if button.is_visible():
            button.click()
            closed.append("notification")
    return closed


def open_notebook(page: Any, server: LabServer, name: str, *, timeout: float = 90.0) -> dict:
    """Open notebook ``name`` and wait until its kernel is connected and idle; return the kernel."""
    page.goto(server.notebook_url(name), wait_until="domcontentloaded")
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=timeout * 1000)
    dismiss_dialogs(page)
    kernel = wait_kernel_connected(server, timeout, notebook=name)
    # The page must agree: its toolbar indicator follows the kernel status it received.
    page.locator(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(
        timeout=timeout * 1000
    )
    dismiss_dialogs(page)
    return kernel


def _open_menu_item(page: Any, menu: str, item: str) -> None:
    page.get_by_role("menuitem", name=menu, exact=True).click()
    entry = page.get_by_role("menuitem", name=re.compile(rf"^{re.escape(item)}"))
    entry.wait_for()
    if entry.get_attribute("aria-disabled") == "true":
        page.keyboard.press("Escape")
        raise RuntimeError(f"menu item {menu} > {item} is disabled (no current notebook?)")
    entry.click()


def run_all_cells(page: Any, *, timeout: float = 60.0) -> None:
    """Run every cell through the menu (Run > Run All Cells) and wait until all have run."""
    dismiss_dialogs(page)
    # The command acts on the current notebook: make sure that is the one on screen.
    page.locator(".jp-NotebookPanel:visible .jp-Notebook").first.click(position={"x": 5, "y": 5})
    _open_menu_item(page, "Run", "Run All Cells")
    wait_cells_executed(page, timeout=timeout)


def wait_cells_executed(page: Any, *, timeout: float = 60.0) -> None:
    """Wait until every code cell of the visible notebook shows an execution count ``[n]:``."""
    prompts = page.locator(".jp-NotebookPanel:visible .jp-CodeCell .jp-InputPrompt")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        texts = [text.strip() for text in prompts.all_inner_texts()]
        if texts and all(_EXECUTED_PROMPT.match(text) for text in texts):
            return
        time.sleep(0.2)
    raise TimeoutError(f"cells did not finish in {timeout:.0f}s; prompts: {texts}")


def screenshot(page: Any, name: str) -> Path:
    """Save a PNG of the page as ``<artifacts>/<name>.png`` and return its path."""
    path = artifacts_dir() / f"{_safe_name(name)}.png"
    page.screenshot(path=str(path))
    return path


# ---- pytest integration: fixtures and the failure report ---------------------------------

_LABS = pytest.StashKey[list]()
_PAGES = pytest.StashKey[list]()


@pytest.fixture
def start_lab_server(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., LabServer]]:
    """Start servers with ``start_lab_server(env=...)``; each is stopped after the test."""
    servers = request.node.stash.setdefault(_LABS, [])

    def start(env: Mapping[str, str] | None = None) -> LabServer:
        index = len(servers)
        server = start_lab(tmp_path / f"notebooks{index}", tmp_path / f"lab{index}", env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def lab_server(start_lab_server: Callable[..., LabServer]) -> LabServer:
    """Return a running JupyterLab with this process's environment."""
    return start_lab_server()


@pytest.fixture
def lab_page(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Yield a Playwright page in a fresh headless chromium."""
    with chromium_page(tmp_path / "chromium-profile") as page:
        request.node.stash.setdefault(_PAGES, []).append(page)
        yield page


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """On failure, keep the server log, console and a screenshot, and show the log's tail."""
    report = yield
    if not report.failed or report.when == "teardown":
        return report
    prefix = _safe_name(item.nodeid.split("::", 1)[-1])
    for index, server in enumerate(item.stash.get(_LABS, [])):
        with suppress(OSError):
            shutil.copyfile(server.log_path, artifacts_dir() / f"{prefix}-server{index}.log")
        report.sections.append((f"jupyterlab server {index} log (tail)", server.log_tail()))
    for index, page in enumerate(item.stash.get(_PAGES, [])):
        console = "\n".join(console_messages(page)[-80:])
        (artifacts_dir() / f"{prefix}-console{index}.log").write_text(console)
        report.sections.append((f"browser {index} console (tail)", console))
        try:
            screenshot(page, f"{prefix}-failure{index}")
        except Exception as error:  # a dead page must not hide the real failure
            report.sections.append((f"browser {index} screenshot", f"failed: {error}"))
    return report
