"""A container of the harness: its PID 1, what enters it, the kernels and shells run in it.

See :mod:`tests.containers`; :class:`~tests.containers.node.Node` starts them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import textwrap
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from tests.containers.runtime import DockerLook
from tests.ipython_session import _DRIVER, CellOutput
from tests.kernels import execute, ready_client
from tests.waiting import wait_for

if TYPE_CHECKING:
    from tests.containers.node import Node

__all__ = ["INIT", "READY", "Container", "ContainerKernel", "HostSide", "missing"]

READY = "container-ready"

# PID 1 of a container, run as root by unshare: names the host, mounts the private home over
# the user's, waits (reaping what is re-parented to it) until SIGTERM. It forks nothing, so
# the first process entered is PID 2.
INIT = textwrap.dedent(
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
).replace("READY", READY)


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
    def home_inside(self) -> Path:
        """Its home as its processes see it (the user's, its private home mounted over it)."""
        return self.node.user.home

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
        inside = str(self.home_inside / runtime / name)
        argv = [self.node.python, "-m", "ipykernel_launcher", "-f", inside]
        log = open(self.node.root / "logs" / f"{self.name}-{name}.log", "ab")  # noqa: SIM115
        extra = {"JPY_SESSION_NAME": notebook, **(env or {})}
        process = self.popen(argv, extra, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        try:
            client = ready_client(str(host_file), lambda: process.poll() is None, timeout=120)
        except BaseException:
            process.kill()
            raise
        try:
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
        self._let_kernels_go()

    def _let_kernels_go(self) -> None:
        """After its kernels were killed: close their clients, reap their processes."""
        for kernel in self.kernels:
            kernel.client.stop_channels()
            with contextlib.suppress(subprocess.TimeoutExpired):
                kernel.process.wait(15)

    def _shut_kernels_down(self) -> None:
        for kernel in self.kernels:
            if kernel.process.poll() is None:
                kernel.shutdown()

    def stop(self) -> None:
        """Shut its kernels down, then stop it."""
        self._shut_kernels_down()
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
class HostSide(Container):
    """The node's host, for the same user: what runs here is in the host's PID namespace.

    The counterpart of a container in tests that compare the two: the same Python, share
    directory and simulated GPU, a home of its own (``HOME``), no namespace entered. Its
    ``unshare`` and ``init_pid`` are unused.
    """

    @property
    def home_inside(self) -> Path:
        return self.home

    @property
    def pid_namespace(self) -> int:
        return os.stat("/proc/self/ns/pid").st_ino

    @staticmethod
    def _kernel_pid(process: subprocess.Popen, connection_file: str) -> int | None:
        # setpriv runs the kernel in its own process: nothing forks on the host side.
        with contextlib.suppress(psutil.Error):
            if connection_file in psutil.Process(process.pid).cmdline():
                return process.pid
        return None

    def command(self, argv: list[str]) -> list[str]:
        user = self.node.user
        return [
            "setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
            "--", *argv,
        ]  # fmt: skip

    def popen(self, argv: list[str], env: dict[str, str] | None = None, **kwargs):
        return subprocess.Popen(
            self.command(argv), env={**self.env, **(env or {})}, cwd=self.home, **kwargs
        )

    def kill(self) -> None:
        for kernel in self.kernels:
            with contextlib.suppress(psutil.Error):
                psutil.Process(kernel.pid).kill()
        self._let_kernels_go()

    def stop(self) -> None:
        self._shut_kernels_down()
