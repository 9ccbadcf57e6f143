"""A real JupyterHub for the hub tests: the docs' jupyterhub_config.py, two Unix users.

One hub for the whole session (starting it and two servers is most of the time these tests
take): ``configurable-http-proxy`` from npm (``.ci/hub-deps.sh``), ``LocalProcessSpawner``,
two throwaway Unix users created here with their homes and removed afterwards, one simulated
GPU that every user's processes see, the shared beacon directory, all on loopback.

The authenticator is JupyterHub's DummyAuthenticator with a password: the throwaway users
have no Unix password and PAM would need the machine's PAM stack set up for them; what is
tested here (cookies, XSRF, OAuth to the single-user servers, scopes) is the same for every
authenticator.

Needs root (to create users and spawn their servers); skipped with the reason otherwise.
When the Python running the tests is not readable by other users (e.g. under /root), the
users' servers run a hard-linked copy of it (no data copied).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from jax_nbmem.simgpu import GIB, SimState
from tests.jupyterlab import REPO_ROOT
from tests.users import User as HubUser
from tests.users import add_user as _add_user
from tests.users import python_for
from tests.users import remove_user as _remove_user

_HUB_IMPORTS = "jax_nbmem, jupyterhub.singleuser, ipykernel"
CONFIG = REPO_ROOT / "docs" / "jupyterhub_config.py"
CHP_LOCAL = REPO_ROOT / "build" / "hub-deps" / "node_modules" / ".bin" / "configurable-http-proxy"
PASSWORD = secrets.token_hex(8)
_START_S = 120.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root: it creates two Unix users and spawns their servers"
    for tool in ("useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if _chp() is None:
        return "needs configurable-http-proxy (run .ci/hub-deps.sh)"
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        return "needs jupyterhub (pip install jupyterhub)"
    return None


def _chp() -> str | None:
    return shutil.which("configurable-http-proxy") or (
        str(CHP_LOCAL) if CHP_LOCAL.exists() else None
    )


@dataclass
class Hub:
    """The running hub: its public URL, an admin token, its users and the simulated GPU."""

    url: str
    admin_token: str = field(repr=False)
    culler_token: str = field(repr=False)
    alice: HubUser
    bob: HubUser
    folder: Path
    share_dir: Path
    state_path: Path
    env: dict = field(repr=False)  # what root's commands (jax-nbmem) run with here
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    def api(self, method: str, path: str, body=None, token: str | None = None):
        """(status, decoded body) of a hub REST call (``/hub/api/PATH``)."""
        return request(self.url + "/hub/api/" + path, method, body, token or self.admin_token)

    def server(self, user: HubUser, method: str, path: str, body=None, token=None):
        """(status, decoded body) of a call to a user's server through the proxy."""
        url = f"{self.url}/user/{user.name}/{path}"
        return request(url, method, body, self.admin_token if token is None else token)

    def log_tail(self, lines: int = 80) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def request(url: str, method: str = "GET", body=None, token: str | None = None, headers=None):
    """(status, decoded JSON or text) of one request; HTTP errors are answers too."""
    data = None if body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token:
        sent["Authorization"] = f"token {token}"
    req = urllib.request.Request(url, method=method, data=data, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=30) as reply:
            text, status = reply.read().decode(), reply.status
    except urllib.error.HTTPError as error:
        text, status = error.read().decode(errors="replace"), error.code
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def _config(hub_port, api_port, proxy_port, folder, users, python, tokens) -> str:
    """The docs' jupyterhub_config.py, then what only this test sets."""
    admin_token, culler_token = tokens
    extra = f"""

# ---- the hub tests' own settings (tests/hub/conftest.py) ----
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {api_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_port}"
c.ConfigurableHTTPProxy.command = [{_chp()!r}]
c.JupyterHub.db_url = "sqlite:///{folder}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
c.JupyterHub.pid_file = "{folder}/jupyterhub.pid"
c.JupyterHub.cleanup_servers = True
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.allow_named_servers = True  # a kernel of a named server is stopped through it
c.DummyAuthenticator.password = {PASSWORD!r}
c.Authenticator.allowed_users = {set(users)!r}
from jupyterhub.auth import Authenticator as _Authenticator
if hasattr(_Authenticator, "allow_all"):  # the docs' config lets every account in; two here
    c.Authenticator.allow_all = False
c.Spawner.cmd = [{python!r}, "-m", "jupyterhub.singleuser"]
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.environment.update({{
    "JAX_PLATFORMS": "cpu", "JAX_NBMEM_SIMGPU_STATE": {str(folder / "simgpu" / "gpu.state")!r},
    "JUPYTER_PATH": {str(folder / "jupyter-data")!r},  # the checkout's JupyterLab extension
}})
c.Spawner.args = ["--ServerApp.terminals_enabled=False", "--LabApp.news_url=None"]
# The culler runs from the tests, one round at a time; the hub only knows its token.
c.JupyterHub.services[0].pop("command")
c.JupyterHub.services[0]["api_token"] = {culler_token!r}
c.JupyterHub.services.append({{"name": "test-admin", "api_token": {admin_token!r}}})
c.JupyterHub.load_roles.append({{
    "name": "test-admin", "services": ["test-admin"],
    "scopes": ["admin:users", "admin:servers", "access:servers", "list:users", "read:servers",
               "tokens"],
}})
"""
    return CONFIG.read_text() + extra


def documented_config(env: dict):
    """The docs' jupyterhub_config.py evaluated as JupyterHub evaluates it, with ``env``: its c."""
    from unittest import mock

    from traitlets.config import Config

    c = Config()
    with mock.patch.dict(os.environ, env):
        exec(CONFIG.read_text(), {"get_config": lambda: c, "__file__": str(CONFIG)})
    return c


def _wait_up(url: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the hub exited:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/hub/api/", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"the hub did not answer in {timeout:.0f} s")


def start_servers(hub: Hub, *users: HubUser) -> None:
    """Spawn the users' servers through the hub's API, all at once, and wait until ready."""
    for user in users:
        status, answer = hub.api("POST", f"users/{user.name}/server")
        assert status in (201, 202), (status, answer)
    deadline = time.monotonic() + _START_S
    waiting = list(users)
    while waiting and time.monotonic() < deadline:
        for user in list(waiting):
            status, model = hub.api("GET", f"users/{user.name}")
            server = (model or {}).get("servers", {}).get("") if status == 200 else None
            if server and server.get("ready"):
                waiting.remove(user)
        time.sleep(0.5)
    if waiting:
        names = ", ".join(u.name for u in waiting)
        raise TimeoutError(f"the servers of {names} did not start:\n{hub.log_tail()}")


def _serve_labextension(data: Path, package_root: Path) -> None:
    """The built JupyterLab extension of the package the users run, first on their JUPYTER_PATH."""
    (data / "labextensions").mkdir(parents=True)
    data.chmod(0o755)
    (data / "labextensions").chmod(0o755)
    built = package_root / "jax_nbmem" / "labextension"
    (data / "labextensions" / "jax_nbmem").symlink_to(built, target_is_directory=True)


@pytest.fixture(scope="session")
def hub(simgpu_lib):
    """The running hub (see the module); everything it made is removed afterwards."""
    with running_hub(simgpu_lib) as started:
        yield started


@contextlib.contextmanager
def running_hub(
    simgpu_lib,
    extra_config: str = "",
    prefix: str = "jnm-hub-",
    unix_prefix: str = "",
    servers: bool = True,
) -> Iterator[Hub]:
    """A hub as the module says, its two users' servers started; ``extra_config`` goes last.

    ``servers=False``: the hub only (a test of the hub's own API), no server started.

    ``unix_prefix``: each hub user NAME is Unix user ``unix_prefix`` + NAME (as TLJH names
    them: ``jupyter-NAME``), for a spawner in ``extra_config`` that runs them so; the hub's
    users (``Hub.alice``, ``Hub.bob``) then carry the hub name with the Unix user's UID and
    home. Skips (saying why) where it cannot run.
    """
    missing = _missing()
    if missing:
        pytest.skip(missing)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    folder.chmod(0o755)
    users: list[HubUser] = []
    process = None
    try:
        share = folder / "share"
        share.mkdir()
        share.chmod(0o1777)
        simgpu = folder / "simgpu"
        simgpu.mkdir()
        shutil.copy2(simgpu_lib, simgpu / simgpu_lib.name)
        simgpu.chmod(0o755)
        state = SimState(simgpu / "gpu.state").gpu(0, total=80 * GIB)
        state.write()
        users = [_add_user(unix_prefix + "jnma"), _add_user(unix_prefix + "jnmb")]
        hub_users = [replace(u, name=u.name.removeprefix(unix_prefix)) for u in users]
        port, api_port, proxy_port = _free_port(), _free_port(), _free_port()
        url = f"http://127.0.0.1:{port}"
        base_env = {
            k: v for k, v in os.environ.items() if not re.match(r"(JUPYTER|JPY_|XLA_|JAX_)", k)
        }
        base_env.update({
            "LD_LIBRARY_PATH": str(simgpu),
            "JAX_NBMEM_SIMGPU_STATE": str(simgpu / "gpu.state"),
            "JAX_NBMEM_SHARE_DIR": str(share),
            "JAX_NBMEM_HUB_URL": url,
            "JAX_PLATFORMS": "cpu",
        })  # fmt: skip
        python, env = python_for(users[0], folder, base_env, _HUB_IMPORTS)
        _serve_labextension(folder / "jupyter-data", Path(env["PYTHONPATH"]))
        tokens = (secrets.token_hex(24), secrets.token_hex(24))
        config = folder / "jupyterhub_config.py"
        config.write_text(
            _config(
                port, api_port, proxy_port, folder, [u.name for u in hub_users], python, tokens
            )  # fmt: skip
            + extra_config
        )
        log_path = folder / "hub.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(config)],
                cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        _wait_up(url, process, log_path, _START_S)
        root_env = {**env, "PYTHONPATH": str(REPO_ROOT)}
        root_env["LD_LIBRARY_PATH"] = str(simgpu)
        hub = Hub(
            url, tokens[0], tokens[1], hub_users[0], hub_users[1], folder, share,
            simgpu / "gpu.state", root_env, log_path, process,
        )  # fmt: skip
        if servers:
            start_servers(hub, *hub_users)
        yield hub
    finally:
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # the hub stops the users' servers first
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        for user in users:
            _remove_user(user)
        if os.environ.get("JAX_NBMEM_KEEP_HUB"):
            print(f"hub folder kept: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
