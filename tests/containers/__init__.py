"""Containers for the tests, as a container runtime makes them, and what runs in them.

A *container* here is what DockerSpawner or KubeSpawner gives a user's notebook server, made
with real kernel namespaces (root, as CI runs): ``unshare --pid --fork --mount-proc --uts
--mount`` starts its PID 1 (a small init, below), which names the container's host (UTS
namespace) and bind-mounts a home of the container's own over the shared user's home (mount
namespace), so that runtime files do not collide. Every container of a :class:`Node` runs as
one Unix user (a throwaway user standing for ``jovyan``) and mounts one share directory at the
same path; the simulated GPU's state, library and registrar are the node's, so NVML lists host
PIDs, as a real driver does inside a container.

Processes enter a running container as ``docker exec`` does (``nsenter`` into its namespaces,
then ``setpriv`` to the user): the first one entered is PID 2 in every container, so the
kernels of identical containers have the same in-container PID. :meth:`Container.start_kernel`
starts a real IPython kernel there and connects a client from the host (the network is the
host's, as with Docker's host networking or a pod's loopback), and :meth:`Container.run_cells`
runs cells in a fresh IPython shell there.

The end-to-end tests of issue 31 live in this package's ``test_*.py`` files (the harness is
this ``__init__``, so that ``tests.containers`` names it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from jax_nbmem.simgpu import GIB, LIBRARY_NAME, STATE_ENV_VAR, SimState
from jax_nbmem.simgpu.registrar import register
from jax_nbmem.simgpu.simulator import _STARTUP_FILE
from tests.containers.runtime import DockerLook, docker_look
from tests.ipython_session import _DRIVER, CellOutput
from tests.kernels import execute
from tests.users import User, add_user, python_for, remove_user
from tests.waiting import wait_for

__all__ = [
    "Container",
    "ContainerKernel",
    "Jovyan",
    "Node",
    "jovyan",
    "missing",
    "node",
]

IMPORTS = "jax_nbmem, ipykernel, jax"
_READY = "container-ready"

# PID 1 of a container, run as root by unshare: names the host, mounts the private home over
# the user's, waits (reaping what is re-parented to it) until SIGTERM. It forks nothing, so
# the first process entered is PID 2.
_INIT = textwrap.dedent(
    """
    import ctypes, os, signal, socket, sys
    name, home, target = sys.argv[1:4]
    socket.sethostname(name)
    libc = ctypes.CDLL(None, use_errno=True)
    MS_BIND, MS_REC = 4096, 16384
    if libc.mount(home.encode(), target.encode(), None, MS_BIND | MS_REC, None) != 0:
        raise OSError(ctypes.get_errno(), f"mount --bind {home} {target}")
    os.chdir(target)

    def reap(*_):
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return

    signal.signal(signal.SIGCHLD, reap)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print("READY", os.getpid(), socket.gethostname(), flush=True)
    while True:
        signal.pause()
    """
).replace("READY", _READY)


def missing() -> str | None:
    """Why containers cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root: containers are made with unshare and a throwaway user"
    for tool in ("unshare", "nsenter", "setpriv", "useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    return None


def _ns_pid(host_pid: int) -> int | None:
    """A host process's PID in its own (innermost) namespace."""
    try:
        with open(f"/proc/{host_pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except OSError:
        return None
    return None


@dataclass
class ContainerKernel:
    """A real IPython kernel in a container, and its client on the host."""

    container: Container
    client: BlockingKernelClient
    process: subprocess.Popen  # nsenter, on the host
    pid: int  # the host's PID: what NVML lists
    pid_in_container: int
    connection_file: Path  # the host's path

    def execute(self, code: str, timeout: float = 120) -> tuple[str, str | None]:
        """Run ``code`` as a cell; (what it showed, the error's name or None)."""
        return execute(self.client, code, timeout)

    def run(self, code: str, timeout: float = 120) -> str:
        """Run ``code`` as a cell that must not fail; what it showed."""
        text, error = self.execute(code, timeout)
        assert error is None, f"in {self.container.name}: {text}"
        return text

    def shutdown(self) -> None:
        """Ask the kernel to stop, and kill it if it does not."""
        with contextlib.suppress(Exception):
            self.client.shutdown()
        self.client.stop_channels()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(psutil.Error):
                psutil.Process(self.pid).kill()
            self.process.kill()
            self.process.wait(15)


@dataclass
class Container:
    """A running container: its init (PID 1), its private home, what runs in it."""

    name: str
    node: Node
    home: Path  # on the host: bind-mounted over the user's home inside
    env: dict[str, str]  # what every process started in it gets
    unshare: subprocess.Popen
    init_pid: int  # the host's PID of its PID 1
    docker: DockerLook | None = None  # its Docker id and name, as the host sees them
    kernels: list[ContainerKernel] = field(default_factory=list)

    @property
    def pid_namespace(self) -> int:
        """The inode of its PID namespace."""
        return os.stat(f"/proc/{self.init_pid}/ns/pid").st_ino

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside, as the node's user (as ``docker exec`` would)."""
        user = self.node.user
        join = []  # as docker exec: into the container's cgroup, then its namespaces
        if self.docker is not None:
            join = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.docker.procs)]
        return [
            *join,
            "nsenter", f"--target={self.init_pid}", "--pid", "--mount", "--uts", "--wd",
            "setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
            "--", *argv,
        ]  # fmt: skip

    def popen(self, argv: list[str], env: dict[str, str] | None = None, **kwargs):
        """Start ``argv`` inside; a Popen of its ``nsenter`` on the host."""
        return subprocess.Popen(self.command(argv), env={**self.env, **(env or {})}, **kwargs)

    def run(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 120):
        """Run ``argv`` inside to its end; a CompletedProcess with text output."""
        return subprocess.run(
            self.command(argv), env={**self.env, **(env or {})}, capture_output=True,
            text=True, timeout=timeout,
        )  # fmt: skip

    def python(self, code: str, env: dict[str, str] | None = None, timeout: float = 120):
        """Run Python ``code`` inside; a CompletedProcess."""
        return self.run([self.node.python, "-c", code], env, timeout)

    def run_cells(self, cells: list[str], env: dict[str, str] | None = None, timeout=180):
        """Run ``cells`` in a fresh IPython shell inside; one CellOutput per cell."""
        done = subprocess.run(
            self.command([self.node.python, "-c", _DRIVER]), input=json.dumps(cells),
            env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        marker = done.stdout.rfind("@@RESULTS@@")
        if done.returncode != 0 or marker < 0:
            raise AssertionError(f"IPython in {self.name} failed:\n{done.stdout}\n{done.stderr}")
        results = json.loads(done.stdout[marker + len("@@RESULTS@@") :])
        return [CellOutput(**item) for item in results]

    def start_kernel(
        self, notebook: str = "notebook.ipynb", env: dict[str, str] | None = None
    ) -> ContainerKernel:
        """A real IPython kernel inside for ``notebook``; its client is on the host."""
        user = self.node.user
        runtime = Path(".local", "share", "jupyter", "runtime")
        name = f"kernel-{uuid.uuid4()}.json"
        host_file = self.home / runtime / name
        write_connection_file(str(host_file), ip="127.0.0.1")
        os.chown(host_file, user.uid, user.gid)
        inside = str(user.home / runtime / name)
        argv = [self.node.python, "-m", "ipykernel_launcher", "-f", inside]
        log = open(self.node.root / "logs" / f"{self.name}-{name}.log", "ab")  # noqa: SIM115
        extra = {"JPY_SESSION_NAME": notebook, **(env or {})}
        process = self.popen(argv, extra, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        client = BlockingKernelClient(connection_file=str(host_file))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=120)
            pid = wait_for("the kernel's host PID", lambda: self._kernel_pid(process, inside))
        except BaseException:
            client.stop_channels()
            process.kill()
            raise
        kernel = ContainerKernel(self, client, process, pid, _ns_pid(pid) or 0, host_file)
        self.kernels.append(kernel)
        return kernel

    @staticmethod
    def _kernel_pid(process: subprocess.Popen, connection_file: str) -> int | None:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(process.pid).children(recursive=True):
                if connection_file in child.cmdline():
                    return child.pid
        return None

    def kill(self) -> None:
        """SIGKILL its PID 1, as a runtime kills a container: every process in it dies."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init_pid, signal.SIGKILL)
        self.unshare.wait(30)
        for kernel in self.kernels:
            kernel.client.stop_channels()
            with contextlib.suppress(subprocess.TimeoutExpired):
                kernel.process.wait(15)

    def stop(self) -> None:
        """Shut its kernels down, then stop it."""
        for kernel in self.kernels:
            if kernel.process.poll() is None:
                kernel.shutdown()
        if self.unshare.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGTERM)
            try:
                self.unshare.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.docker is not None:
            self.docker.remove()


@dataclass
class Node:
    """What the containers of one test share: the user, the share directory, the simulated GPU.

    ``root`` (on the host, readable by all) holds the library (``lib/``), the state
    (``state/gpu.state``, world-writable folder as ``shared-setup`` makes it), the share
    directory (``share/``, 1777), each container's home (``homes/NAME``) and the logs.
    """

    user: User
    root: Path
    python: str
    env: dict[str, str]
    registrar: subprocess.Popen | None = None
    containers: list[Container] = field(default_factory=list)

    @property
    def share_dir(self) -> Path:
        return self.root / "share"

    @property
    def state(self) -> Path:
        return self.root / "state" / "gpu.state"

    def container(
        self,
        name: str,
        env: dict[str, str] | None = None,
        mirror: bool = True,
        docker_name: str | None = None,
    ) -> Container:
        """Start a container named (and with the host name) ``name``.

        ``mirror``: its kernels mirror their JAX arrays onto the simulated GPU (an IPython
        startup file in its home, as an image would carry). ``docker_name``: the host sees
        it as Docker's container of that name (a cgroup and a config: see
        :mod:`tests.containers.runtime`).
        """
        home = self.root / "homes" / name
        startup = home / ".ipython" / "profile_default" / "startup"
        for folder in (home / ".local" / "share" / "jupyter" / "runtime", startup):
            folder.mkdir(parents=True, exist_ok=True)
        if mirror:
            (startup / "50-jax-nbmem-simgpu.py").write_text(_STARTUP_FILE)
        for path in [home, *home.rglob("*")]:
            os.chown(path, self.user.uid, self.user.gid)
        home.chmod(0o700)
        command = [
            "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--mount",
            sys.executable, "-c", _INIT, name, str(home), str(self.user.home),
        ]  # fmt: skip
        unshare = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        said = unshare.stdout.readline().split()
        if said[:1] != [_READY]:
            unshare.kill()
            raise AssertionError(f"container {name} did not start: {said}")
        init = wait_for("its PID 1", lambda: psutil.Process(unshare.pid).children(), 10)[0]
        container_env = {**self.env, "HOSTNAME": name, **(env or {})}
        container = Container(name, self, home, container_env, unshare, init.pid)
        self.containers.append(container)
        if docker_name is not None:
            container.docker = docker_look(docker_name)
            if container.docker is None:
                raise AssertionError("no cgroup hierarchy to make a Docker-like container in")
            container.docker.join(init.pid)
        return container

    def start_registrar(self) -> None:
        """Run the simulated GPU's registrar on the host, as root; back once it answers."""
        self.registrar = subprocess.Popen(
            [sys.executable, "-m", "jax_nbmem.simgpu", "registrar", "--state", str(self.state)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": self.env["PYTHONPATH"]},
        )  # fmt: skip
        said = self.registrar.stdout.readline()
        if "serving" not in said:
            raise AssertionError(f"the registrar did not start: {said}")
        with register(self.state) as registration:
            assert registration.pid == os.getpid()

    def stop_registrar(self) -> None:
        if self.registrar is not None and self.registrar.poll() is None:
            self.registrar.terminate()
            self.registrar.wait(20)
        self.registrar = None

    def listed(self) -> dict[int, int]:
        """Host PID -> bytes, as the state file's lines say on GPU 0 (nobody judged them)."""
        return {proc.pid: proc.used or 0 for proc in SimState.read(self.state).processes()}


def _node_folder(prefix: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)  # every user reaches what lies under it
    return root


@dataclass(frozen=True)
class Jovyan:
    """The one Unix user every container runs as, and a Python it can run."""

    user: User
    python: str
    env: dict[str, str]  # what that Python needs (PYTHONPATH, LD_LIBRARY_PATH of a copy)


@contextlib.contextmanager
def jovyan(prefix: str = "jnm-jovyan-") -> Iterator[Jovyan]:
    """A throwaway user standing for ``jovyan`` (removed afterwards, with what it runs)."""
    folder = _node_folder(prefix)
    user = add_user("jov")
    try:
        python, env = python_for(user, folder, {"PATH": os.environ["PATH"]}, IMPORTS)
        yield Jovyan(
            user, python, {k: env[k] for k in ("PYTHONPATH", "LD_LIBRARY_PATH") if k in env}
        )
    finally:
        remove_user(user)
        _remove_tree(folder)


@contextlib.contextmanager
def node(
    simgpu_lib: Path,
    person: Jovyan,
    total: int = 80 * GIB,
    registrar: bool = True,
    prefix: str = "jnm-node-",
) -> Iterator[Node]:
    """A node: the share directory and one simulated GPU of ``total`` bytes, for ``person``.

    ``registrar``: the simulated GPU's registrar runs on the host (processes listed by host
    PID). Every container started from it is stopped afterwards, and its folder removed.
    """
    root = _node_folder(prefix)
    made: Node | None = None
    try:
        lib = root / "lib" / LIBRARY_NAME
        lib.parent.mkdir(mode=0o755)
        shutil.copy(simgpu_lib, lib)
        lib.chmod(0o755)
        state_dir = root / "state"
        state_dir.mkdir()
        state_dir.chmod(0o777)
        SimState(state_dir / "gpu.state").gpu(0, total=total).write()
        lock = state_dir / "gpu.state.lock"
        lock.touch()
        lock.chmod(0o666)
        share = root / "share"
        share.mkdir()
        share.chmod(0o1777)
        (root / "homes").mkdir()
        (root / "logs").mkdir()
        user = person.user
        libraries = [str(lib.parent), person.env.get("LD_LIBRARY_PATH", "")]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(user.home),
            "USER": user.name,
            "LOGNAME": user.name,
            "JAX_PLATFORMS": "cpu",
            **person.env,
            "LD_LIBRARY_PATH": ":".join(filter(None, libraries)),
            STATE_ENV_VAR: str(state_dir / "gpu.state"),
            "JAX_NBMEM_SHARE_DIR": str(share),
        }
        made = Node(user, root, person.python, env)
        if registrar:
            made.start_registrar()
        yield made
    finally:
        if made is not None:
            for container in made.containers:
                with contextlib.suppress(Exception):
                    container.stop()
            made.stop_registrar()
        _remove_tree(root)


def _remove_tree(root: Path) -> None:
    for _ in range(3):
        shutil.rmtree(root, ignore_errors=True)
        if not root.exists():
            return
        time.sleep(0.5)
