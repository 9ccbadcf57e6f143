"""A node of the harness: one jovyan, one share directory, one simulated GPU, its containers.

See :mod:`tests.containers`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from jax_nbmem.simgpu import GIB, LIBRARY_NAME, STATE_ENV_VAR, SimState
from jax_nbmem.simgpu.registration import register
from jax_nbmem.simgpu.simulator import STARTUP_FILE
from tests.containers.container import INIT, READY, Container, HostSide
from tests.containers.runtime import docker_look
from tests.users import User, add_user, python_for, remove_user
from tests.waiting import wait_for

__all__ = ["IMPORTS", "Jovyan", "Node", "jovyan", "node"]

IMPORTS = "jax_nbmem, ipykernel, jax"


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
        home = self._home(name, mirror)
        command = [
            "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--mount",
            sys.executable, "-c", INIT, name, str(home), str(self.user.home),
        ]  # fmt: skip
        unshare = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        said = unshare.stdout.readline().split()
        if said[:1] != [READY]:
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

    def on_host(self, name: str = "host", env: dict[str, str] | None = None) -> HostSide:
        """The host itself, as the node's user, with a home ``name`` of its own.

        What runs there runs in the host's PID namespace, beside the containers; as in
        :meth:`container`, its kernels mirror their JAX arrays onto the simulated GPU.
        """
        home = self._home(name, mirror=True)
        host_env = {**self.env, "HOME": str(home), **(env or {})}
        side = HostSide(name, self, home, host_env, unshare=None, init_pid=os.getpid())
        self.containers.append(side)
        return side

    def _home(self, name: str, mirror: bool) -> Path:
        """A home for ``name`` owned by the user: its runtime folder, the mirror's startup."""
        home = self.root / "homes" / name
        startup = home / ".ipython" / "profile_default" / "startup"
        for folder in (home / ".local" / "share" / "jupyter" / "runtime", startup):
            folder.mkdir(parents=True, exist_ok=True)
        if mirror:
            (startup / "50-jax-nbmem-simgpu.py").write_text(STARTUP_FILE)
        for path in [home, *home.rglob("*")]:
            os.chown(path, self.user.uid, self.user.gid)
        home.chmod(0o700)
        return home

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
