"""Podman containers for the tests: a kernel in each, reached from the host over IPC sockets.

Each container runs one real IPython kernel (``ipykernel_launcher``) under ``sh``, so that the
kernel is PID 2 there, as the first process a notebook server would start. The container has
no network (``--network none``): the kernel's connection file says ``transport: ipc``, its
sockets lie in the container's home, bind-mounted at the same path as on the host, where the
test's client connects. The share directory and the simulated GPU's state folder are
bind-mounted at their host paths too; the simulated GPU's library and the Python uid 1000 can
run come with the host's root filesystem (``--rootfs /:O``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from jax_nbmem.simgpu.simulator import STARTUP_FILE
from tests.kernels import execute
from tests.waiting import wait_for

__all__ = [
    "JOVYAN_UID", "PODMAN", "PODMAN_FLAGS", "PodmanKernel", "Runtime", "missing_podman",
    "podman", "start",
]  # fmt: skip

JOVYAN_UID = 1000
_CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
# What runs here (docs/containers.md, "Podman"): runc (crun fails on hybrid cgroups), the
# cgroupfs manager (no systemd), vfs storage, no network, limits a kernel's ZMQ threads fit.
PODMAN_FLAGS = [
    "--runtime", "runc", "--cgroup-manager=cgroupfs", "--storage-driver=vfs",
]  # fmt: skip
_RUN_FLAGS = [
    "--network", "none", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
]  # fmt: skip


@dataclass(frozen=True)
class Runtime:
    """A container runtime's command line: ``command`` before the verb, ``root`` (what makes
    the container's root filesystem) right before the command a container runs."""

    command: tuple[str, ...]
    root: tuple[str, ...]
    remove: tuple[str, ...] = ("rm", "--force")  # kill at once (a kernel under sh: no TERM)

    def __call__(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``RUNTIME ARGV``; its output as text (never raises on failure)."""
        return subprocess.run(
            [*self.command, *argv], capture_output=True, text=True, timeout=timeout
        )


# Podman: the host's own root as an overlay (no registry here).
PODMAN = Runtime(("podman", *PODMAN_FLAGS), ("--rootfs", "/:O"), ("rm", "--force", "--time", "0"))


def podman(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``podman ARGV`` with the flags above; its output as text (never raises on failure)."""
    return PODMAN(*argv, timeout=timeout)


def missing_podman() -> str | None:
    """Why no Podman container can run here (None: one can)."""
    if os.geteuid() != 0:
        return "needs root: Podman runs as root here"
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            return f"needs {tool} (bash .ci/podman-deps.sh)"
    done = podman("run", "--rm", *_RUN_FLAGS, "--rootfs", "/:O", "true")
    if done.returncode != 0:
        return f"podman run fails here: {done.stderr.strip()[-500:]}"
    return None


@dataclass
class PodmanKernel:
    """A real IPython kernel in a Podman container, and its client on the host."""

    name: str  # the container's name (``podman ps``)
    id: str  # its full id
    client: BlockingKernelClient
    pid: int  # the host's PID: what NVML lists
    pid_in_container: int
    home: Path

    def run(self, code: str, timeout: float = 120) -> str:
        """Run ``code`` as a cell that must not fail; what it showed."""
        text, error = execute(self.client, code, timeout)
        assert error is None, f"in {self.name}: {text}"
        return text

    runtime: Runtime = PODMAN

    def exec(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``podman exec`` ARGV in the container as jovyan: a shell in it, as a user has."""
        flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
        user = f"{JOVYAN_UID}:{JOVYAN_UID}"
        return self.runtime("exec", "--user", user, *flags, self.name, *argv)

    def remove(self) -> None:
        """``podman rm -f``: its processes killed, as a spawner's stop does."""
        self.client.stop_channels()
        self.runtime(*self.runtime.remove, self.name)


def _passwd(folder: Path, home: Path) -> Path:
    """A passwd file in which uid 1000 is ``jovyan`` (the image's user, as docker-stacks')."""
    path = folder / "passwd"
    if not path.exists():
        path.write_text(
            "root:x:0:0:root:/root:/bin/sh\n"
            f"jovyan:x:{JOVYAN_UID}:{JOVYAN_UID}:Jupyter user:{home.parent}:/bin/sh\n"
        )
        path.chmod(0o644)
    return path


def _kernel_pid(container_pid: int, connection_file: str) -> int | None:
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(container_pid).children(recursive=True):
            if connection_file in child.cmdline():
                return child.pid
    return None


def _ns_pid(host_pid: int) -> int | None:
    with open(f"/proc/{host_pid}/status") as status:
        for line in status:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return None


def start(
    name: str, root: Path, python: str, env: dict[str, str], notebook: str,
    binds: list[Path], extra_env: dict[str, str] | None = None, runtime: Runtime = PODMAN,
) -> PodmanKernel:  # fmt: skip
    """``podman run -d --name NAME`` a kernel for ``notebook`` as jovyan; its client.

    ``root`` is the test's folder (readable by all); ``binds`` are folders mounted at their own
    paths; ``env`` is the kernel's environment (``HOME`` is set here).
    """
    home = root / "homes" / name
    startup = home / ".ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    # The mirror: kernels hold their JAX arrays on the simulated GPU (an image would carry it).
    (startup / "50-jax-nbmem-simgpu.py").write_text(STARTUP_FILE)
    for path in [home, *home.rglob("*")]:
        os.chown(path, JOVYAN_UID, JOVYAN_UID)
    connection = home / f"kernel-{uuid.uuid4().hex[:8]}.json"
    write_connection_file(str(connection), transport="ipc", ip=str(home / "k"))
    os.chown(connection, JOVYAN_UID, JOVYAN_UID)
    environment = {
        **env,
        **(extra_env or {}),
        "HOME": str(home),
        "JPY_SESSION_NAME": str(home / notebook),
    }
    volumes = [f"--volume={p}:{p}" for p in (*binds, home)]
    volumes.append(f"--volume={_passwd(root, home)}:/etc/passwd:ro")
    kernel = f"{python} -m ipykernel_launcher -f {connection}"
    done = runtime(
        "run", "--detach", "--name", name, *_RUN_FLAGS, "--user", f"{JOVYAN_UID}:{JOVYAN_UID}",
        *volumes, f"--workdir={home}", *(f"--env={k}={v}" for k, v in environment.items()),
        *runtime.root, "sh", "-c", f"{kernel} & wait",
    )  # fmt: skip
    assert done.returncode == 0, f"{runtime.command[0]} run {name}: {done.stderr}"
    container_id = done.stdout.strip().splitlines()[-1]
    inspected = json.loads(runtime("inspect", name).stdout)[0]
    shell_pid = inspected["State"]["Pid"]
    client = BlockingKernelClient(connection_file=str(connection))
    client.load_connection_file()
    ports = [getattr(client, f"{channel}_port") for channel in _CHANNELS]
    bound = [Path(f"{client.ip}-{port}") for port in ports]
    try:
        # Its heartbeat must answer at once: a client whose first beat is missed gives up.
        wait_for(f"the kernel's sockets in {name}", lambda: all(map(Path.exists, bound)), 120)
        client.start_channels()
        client.wait_for_ready(timeout=120)
        pid = wait_for("the kernel's host PID", lambda: _kernel_pid(shell_pid, str(connection)))
    except BaseException as error:
        client.stop_channels()
        said = runtime("logs", name)
        runtime(*runtime.remove, name)
        raise AssertionError(f"no kernel in {name}: {error}\n{said.stdout}{said.stderr}") from None
    return PodmanKernel(name, container_id, client, pid, _ns_pid(pid) or 0, home, runtime)
