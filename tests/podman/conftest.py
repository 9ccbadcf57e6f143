"""The Podman scenario of issue 39, made once per module: a node, its agent, two containers."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.containers.node import IMPORTS, Jovyan, Node, node
from tests.jupyterlab import REPO_ROOT
from tests.podman.podman import (
    JOVYAN_UID,
    PodmanKernel,
    Runtime,
    missing_podman,
    podman,
    start,
)
from tests.users import User, add_user, python_for
from tests.waiting import wait_for


@dataclass
class Agent:
    """``jax-nbmem exporter --share-dir S`` as root on the host: the node agent, and its log."""

    node: Node
    interval: float = 0.5
    process: subprocess.Popen | None = None
    logs: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
             "--interval", str(self.interval), "--share-dir", str(self.node.share_dir)],
            env=host_env(self.node), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = self.process.stdout.readline()
        assert line.startswith("jax-nbmem exporter: serving"), line + self.process.stderr.read()
        wait_for("the agent's socket", (self.node.share_dir / "agent" / "agent.sock").exists)

    def stop(self, sig: int = signal.SIGTERM) -> str:
        """Stop it with ``sig``; what it logged (stderr) since it started."""
        if self.process is None:
            return ""
        self.process.send_signal(sig)
        self.process.wait(20)
        said = self.process.stderr.read()
        self.logs.append(said)
        self.process = None
        return said


def host_env(node: Node, share_dir: bool = True) -> dict[str, str]:
    """Root's environment on the host: the simulated GPU and this checkout; the share dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "XLA_", "JAX_"))}
    env.update({
        "PYTHONPATH": str(REPO_ROOT), "JAX_PLATFORMS": "cpu",
        "LD_LIBRARY_PATH": node.env["LD_LIBRARY_PATH"].split(":")[0],
        "JAX_NBMEM_SIMGPU_STATE": str(node.state),
    })  # fmt: skip
    if share_dir:
        env["JAX_NBMEM_SHARE_DIR"] = str(node.share_dir)
    return env


@dataclass
class Scenario:
    """Alice's hog and Bob's work, each in its Podman container; the agent on the host."""

    node: Node
    agent: Agent
    alice: PodmanKernel
    bob: PodmanKernel


@pytest.fixture(scope="module")
def jovyan_1000():
    """uid 1000, ``jovyan`` in the containers, and a Python it can run (ours is under /root)."""
    why = missing_podman()
    if why is not None and os.geteuid() != 0:
        pytest.skip(why)  # as every root-only test: CI runs the suite as root
    assert why is None, why  # as root, a Podman that does not run is a failure, not a skip
    folder = Path(tempfile.mkdtemp(prefix="jnm-podman-"))
    folder.chmod(0o755)
    home = folder / "home"
    home.mkdir()
    os.chown(home, JOVYAN_UID, JOVYAN_UID)
    # The host has an account of its own at uid 1000, as a real host does, named otherwise
    # than the containers' jovyan: no text about a container's kernel may name it (issue 51).
    made = None
    try:
        name = pwd.getpwuid(JOVYAN_UID).pw_name
    except KeyError:
        made = add_user("jnmhost", uid=JOVYAN_UID)
        name = made.name
    user = User(name, JOVYAN_UID, JOVYAN_UID, home)
    try:
        python, env = python_for(user, folder, {"PATH": os.environ["PATH"]}, IMPORTS)
        keep = ("PYTHONPATH", "LD_LIBRARY_PATH")
        yield Jovyan(user, python, {k: env[k] for k in keep if k in env})
    finally:
        if made is not None:  # its processes are the containers' (gone by now): none killed
            subprocess.run(["userdel", "--force", "--remove", made.name], capture_output=True)
        subprocess.run(["rm", "-rf", str(folder)], check=False)


@pytest.fixture(scope="module")
def scenario(simgpu_lib, jovyan_1000):
    """Issue 39's two containers on one simulated 80 GiB GPU, proven by the node agent."""
    names = ["jupyter-alice", "jupyter-bob"]
    for name in names:  # a run killed earlier may have left them
        podman("rm", "--force", "--time", "0", name)
    with node(simgpu_lib, jovyan_1000, prefix="jnm-podnode-") as made:
        agent = Agent(made)
        agent.start()
        kernels = []
        try:
            binds = [made.share_dir, made.state.parent]
            env = {k: v for k, v in made.env.items() if k not in ("USER", "LOGNAME")}
            for name, user, notebook in (("jupyter-alice", "alice", "hog.ipynb"),
                                         ("jupyter-bob", "bob", "work.ipynb")):  # fmt: skip
                kernels.append(start(
                    name, made.root, made.python, env, notebook, binds,
                    {"JUPYTERHUB_USER": user},
                ))  # fmt: skip
            yield Scenario(made, agent, *kernels)
        finally:
            for kernel in kernels:
                kernel.remove()
            for name in names:
                podman("rm", "--force", "--time", "0", name)
            with contextlib.suppress(Exception):
                agent.stop()


@pytest.fixture(scope="module")
def docker_runtime():
    """Debian's dockerd, as root, of its own: vfs storage, no bridge, no iptables; an empty
    image whose root is the host's system folders (no registry here), bound read-only."""
    if os.geteuid() != 0:
        pytest.skip("needs root: dockerd runs as root")
    for tool in ("dockerd", "docker"):
        assert shutil.which(tool), f"needs {tool} (bash .ci/docker-deps.sh)"
    folder = Path(tempfile.mkdtemp(prefix="jnm-dockerd-"))
    sock = f"unix://{folder / 'docker.sock'}"
    log = open(folder / "dockerd.log", "wb")  # noqa: SIM115
    daemon = subprocess.Popen(
        ["dockerd", "--data-root", str(folder / "data"), "--exec-root", str(folder / "exec"),
         "-H", sock, "--pidfile", str(folder / "dockerd.pid"), "--storage-driver", "vfs",
         "--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-masq=false"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    system = [
        f"--volume={p}:{p}:ro" for p in ("/usr", "/lib", "/lib64", "/bin") if Path(p).exists()
    ]
    runtime = Runtime(("docker", "-H", sock), (*system, "jnm-empty"))
    try:
        wait_for("dockerd", lambda: daemon.poll() is not None or runtime("info").returncode == 0,
                 60, every=0.5)  # fmt: skip
        assert daemon.poll() is None, (folder / "dockerd.log").read_text()[-2000:]
        empty = folder / "empty.tar"
        subprocess.run(["tar", "cf", str(empty), "--files-from", "/dev/null"], check=True)
        done = runtime("import", str(empty), "jnm-empty")
        assert done.returncode == 0, done.stderr
        yield runtime
    finally:
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(10)
        log.close()
        subprocess.run(["rm", "-rf", str(folder)], check=False)


@pytest.fixture(scope="module")
def docker_scenario(simgpu_lib, jovyan_1000, docker_runtime):
    """Carol's kernel (default mode) in Docker's container ``jupyter-carol``, as DockerSpawner
    makes it: the share directory at its own path, ``$JAX_NBMEM_SHARE_DIR``, uid 1000, no
    host PID namespace; the agent on the host."""
    with node(simgpu_lib, jovyan_1000, prefix="jnm-docknode-") as made:
        agent = Agent(made)
        agent.start()
        kernel = None
        try:
            env = {k: v for k, v in made.env.items() if k not in ("USER", "LOGNAME")}
            # The Python uid 1000 runs (a copy, where ours is under /root) and our package.
            prefix = Path(made.python).parents[1]
            binds = [made.root, *(Path(p) for p in env["PYTHONPATH"].split(":") if p)]
            binds += [prefix] if not str(prefix).startswith("/usr") else []
            kernel = start("jupyter-carol", made.root, made.python, env, "carol.ipynb", binds,
                           {"JUPYTERHUB_USER": "carol"}, runtime=docker_runtime)  # fmt: skip
            yield made, agent, kernel
        finally:
            if kernel is not None:
                kernel.remove()
            with contextlib.suppress(Exception):
                agent.stop()
