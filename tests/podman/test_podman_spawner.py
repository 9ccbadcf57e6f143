"""docs/containers.md's Podman deployment: DockerSpawner's calls, through Podman's own API.

Podman's Docker-compatible API runs here as the page says (``podman system service
--time=0 unix://SOCKET``, with the suite's storage and runtime flags, on a socket of the test's
own). The page's DockerSpawner settings and its Podman block are evaluated as JupyterHub would,
and the container is made as DockerSpawner makes it: ``docker.APIClient`` built from
``client_kwargs``, ``create_host_config`` from the volumes, read-only volumes and
``extra_host_config``, ``create_container`` with the environment. Its command is a real kernel
as uid 1000. What is checked: the API is Podman's; the passwd file the page's step makes names
uid 1000 in the container; the share directory is there; a stop's SIGTERM ends the kernel
(exit status 143) with ``init``, and the same container without it ignores SIGTERM and is
killed after the grace (137). The GPU request is not tested (no GPU here: the page says so).
No registry: the image is empty and the host's system folders are bound read-only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest
from jupyter_client.connect import write_connection_file
from traitlets.config import Config

from tests.jupyterlab import REPO_ROOT
from tests.podman.podman import JOVYAN_UID, PODMAN_FLAGS, missing_podman, podman
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(300)
PAGE = REPO_ROOT / "docs" / "containers.md"
SOCKET = "/run/podman/podman.sock"
SHARE = "/var/tmp/jax_nbmem"
_CHANNELS = ("shell", "iopub", "stdin", "control", "hb")


def _blocks() -> tuple[str, str, str]:
    """(the DockerSpawner section's config, the Podman block, the passwd step) from the page."""
    page = PAGE.read_text()
    dockerspawner = re.findall(r"```python\n(.*?)```", page, re.S)[0]
    assert "dockerspawner.DockerSpawner" in dockerspawner
    podman_block = page.split("<!-- podman-spawner -->\n```python\n", 1)[1].split("```", 1)[0]
    passwd = page.split("<!-- podman-passwd -->\n```bash\n", 1)[1].split("```", 1)[0]
    assert f"unix://{SOCKET}" in page.split("<!-- podman-spawner -->", 1)[0]
    return dockerspawner, podman_block, passwd


@pytest.fixture(scope="module")
def api_socket():
    """``podman system service`` on a socket of this module's (the page's command, elsewhere)."""
    why = missing_podman()
    if why is not None and os.geteuid() != 0:
        pytest.skip(why)
    assert why is None, why
    folder = Path(tempfile.mkdtemp(prefix="jnm-podapi-"))
    socket = folder / "podman.sock"
    (line,) = [x for x in PAGE.read_text().splitlines() if x.startswith("podman system service")]
    argv = line.replace(SOCKET, str(socket)).split()  # the page's command, this test's socket
    service = subprocess.Popen(
        [argv[0], *PODMAN_FLAGS, *argv[1:]],
        stdout=subprocess.DEVNULL, stderr=open(folder / "service.log", "wb"),  # noqa: SIM115
    )  # fmt: skip
    try:
        wait_for("Podman's API socket", lambda: service.poll() is not None or socket.exists(), 60)
        assert service.poll() is None, (folder / "service.log").read_text()[-2000:]
        empty = folder / "empty.tar"
        subprocess.run(["tar", "cf", str(empty), "--files-from", "/dev/null"], check=True)
        done = podman("import", str(empty), "jnm-empty-api")
        assert done.returncode == 0, done.stderr
        yield socket, folder
    finally:
        service.terminate()
        try:
            service.wait(30)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(10)
        podman("rmi", "--force", "jnm-empty-api")
        shutil.rmtree(folder, ignore_errors=True)


def _documented(folder: Path, socket: Path) -> Config:
    """The page's settings, as JupyterHub evaluates them, with this test's paths."""
    dockerspawner, podman_block, _ = _blocks()
    code = (dockerspawner + podman_block).replace(SOCKET, str(socket))
    code = code.replace("/etc/jax_nbmem/passwd", str(folder / "etc" / "passwd"))
    code = code.replace(SHARE, str(folder / "share"))  # not the host's, which others may use
    c = Config()
    exec(code, {"c": c, "get_config": lambda: c})  # noqa: S102 (the docs' own config)
    return c


def _kernel_pid(container_pid: int) -> int | None:
    for process in [psutil.Process(container_pid), *psutil.Process(container_pid).children(True)]:
        if "ipykernel_launcher" in " ".join(process.cmdline()):
            return process.pid
    return None


def _run_kernel(api, c: Config, jovyan, home: Path, name: str, init: bool) -> str:
    """A container as DockerSpawner makes it, a kernel its command; its id, once the kernel
    is listening (its signal handlers set)."""
    connection = home / f"kernel-{uuid.uuid4().hex[:8]}.json"
    write_connection_file(str(connection), transport="ipc", ip=str(home / f"k{int(init)}"))
    os.chown(connection, JOVYAN_UID, JOVYAN_UID)
    spawner = c.DockerSpawner
    binds = {host: {"bind": guest, "mode": "rw"} for host, guest in spawner.volumes.items()}
    binds.update({h: {"bind": g, "mode": "ro"} for h, g in spawner.read_only_volumes.items()})
    prefix = Path(jovyan.python).parents[1]
    system = ["/usr", "/lib", "/lib64", "/bin", str(home.parent)]
    system += [p for p in jovyan.env.get("PYTHONPATH", "").split(":") if p]
    system += [str(REPO_ROOT)] + ([] if str(prefix).startswith("/usr") else [str(prefix)])
    for path in filter(os.path.exists, system):
        binds[path] = {"bind": path, "mode": "ro"}
    binds[str(home)] = {"bind": str(home), "mode": "rw"}  # the user's home: the kernel's sockets
    extra = {k: v for k, v in spawner.extra_host_config.items() if k != "device_requests"}
    if not init:
        extra.pop("init")
    import docker

    # This machine's own (as the harness's run flags): no network, limits runc may set here.
    limits = [docker.types.Ulimit(name=n, soft=4096, hard=4096) for n in ("nofile", "nproc")]
    host_config = api.create_host_config(binds=binds, network_mode="none", ulimits=limits, **extra)
    environment = {**spawner.environment, **jovyan.env, "JUPYTERHUB_USER": "alice",
                   "HOME": str(home), "JAX_PLATFORMS": "cpu"}  # fmt: skip
    created = api.create_container(
        "jnm-empty-api", [jovyan.python, "-m", "ipykernel_launcher", "-f", str(connection)],
        name=name, user=f"{JOVYAN_UID}:{JOVYAN_UID}", environment=environment,
        volumes=sorted(b["bind"] for b in binds.values()), host_config=host_config,
        working_dir=str(home),
    )  # fmt: skip
    api.start(created["Id"])
    from jupyter_client.blocking import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(connection))
    client.load_connection_file()
    sockets = [Path(f"{client.ip}-{getattr(client, ch + '_port')}") for ch in _CHANNELS]
    try:
        wait_for(f"the kernel's sockets in {name}", lambda: all(map(Path.exists, sockets)), 120)
    except AssertionError as error:
        said = api.logs(created["Id"]).decode(errors="replace")[-3000:]
        state = api.inspect_container(created["Id"])["State"]
        raise AssertionError(f"{error}: {state}\n{said}") from None
    return created["Id"]


def test_the_documented_podman_deployment_runs_and_stops_on_sigterm(api_socket, jovyan_1000):
    import docker

    socket, folder = api_socket
    _, _, passwd_step = _blocks()
    etc = folder / "etc"
    step = passwd_step.replace("/etc/jax_nbmem", str(etc))
    subprocess.run(["bash", "-euc", step], check=True, timeout=30)
    assert (etc / "passwd").stat().st_mode & 0o777 == 0o644
    c = _documented(folder, socket)
    assert c.DockerSpawner.extra_host_config["init"] is True
    share = folder / "share"
    share.mkdir()
    share.chmod(0o1777)
    assert c.DockerSpawner.volumes == {str(share): str(share)}
    api = docker.APIClient(version="auto", **c.DockerSpawner.client_kwargs)
    assert any("Podman" in part.get("Name", "") for part in api.version().get("Components", []))
    home = folder / "home"
    home.mkdir()
    folder.chmod(0o755)
    os.chown(home, JOVYAN_UID, JOVYAN_UID)
    names = ("jnm-spawner-init", "jnm-spawner-noinit")
    for name in names:
        podman("rm", "--force", "--time", "0", name)
    try:
        with_init = _run_kernel(api, c, jovyan_1000, home, names[0], init=True)
        said = api.exec_start(api.exec_create(with_init, ["id", "-un"], user="1000:1000"))
        assert said.decode().strip() == "jovyan"  # the passwd file the page's step made
        (share / "from-the-host").touch()
        said = api.exec_start(api.exec_create(with_init, ["ls", str(share)]))
        assert said.decode().split() == ["from-the-host"]  # the share directory, at its path
        kernel = _kernel_pid(api.inspect_container(with_init)["State"]["Pid"])
        assert kernel is not None
        api.stop(with_init, timeout=60)
        assert api.inspect_container(with_init)["State"]["ExitCode"] == 128 + 15  # SIGTERM
        assert not psutil.pid_exists(kernel) or psutil.Process(kernel).status() == "zombie"
        # The control: the kernel as PID 1 ignores the stop's SIGTERM and is killed.
        without = _run_kernel(api, c, jovyan_1000, home, names[1], init=False)
        api.stop(without, timeout=2)
        assert api.inspect_container(without)["State"]["ExitCode"] == 128 + 9  # SIGKILL
    finally:
        for name in names:
            podman("rm", "--force", "--time", "0", name)
