"""The node agent under exactly the privileges it ships with, and what they allow and refuse.

The systemd unit runs it as uid 0 with two capabilities (CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH)
and /proc read-only; the DaemonSet's agent container keeps the same two. Here the real
``jax-nbmem exporter --share-dir --agent-listen`` runs so (``setpriv``: the same user, the
capabilities as ambient, inheritable and bounding sets, no new privileges; ``unshare --mount``:
/proc remounted read-only, as ``ReadOnlyPaths=/proc`` does), and a kernel of *another* user, in
PID and network namespaces of its own, proves itself on the Unix socket and over TCP. A probe
under the same privileges shows what they allow: another user's ``fd``, ``ns`` and ``environ``
read; no process's memory written, root's included. The system-call filter (``@debug``:
ptrace, pidfd_getfd) is systemd's to apply, checked by tests/deploy/test_systemd.py. Root only,
as CI runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from tests.agent.namespaces import Contained, need_namespaces
from tests.agent.test_agent_tcp import into_subnet, subnet  # noqa: F401  (subnet: a fixture)
from tests.agent.test_kernel_over_tcp import _free_port
from tests.users import User, add_user, python_for, remove_user
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "jax-nbmem-exporter.service"
DAEMONSET = REPO / "deploy" / "kubernetes" / "base" / "daemonset.yaml"
CLIENTS = [REPO / "tests" / "agent" / name for name in ("agent_client.py", "agent_client_net.py")]


def unit_capabilities() -> list[str]:
    """The unit's ambient capabilities, as setpriv names them (``sys_ptrace``)."""
    (line,) = re.findall(r"^AmbientCapabilities=(.*)$", UNIT.read_text(), re.M)
    return [cap.removeprefix("CAP_").lower() for cap in line.split()]


def daemonset_capabilities() -> list[str]:
    pod = yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"]
    (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
    return [cap.lower() for cap in agent["securityContext"]["capabilities"]["add"]]


def test_the_unit_and_the_daemonset_keep_the_same_two_capabilities():
    assert unit_capabilities() == daemonset_capabilities() == ["sys_ptrace", "dac_read_search"]
    assert re.search(r"^ReadOnlyPaths=/proc$", UNIT.read_text(), re.M)


def as_shipped(argv: list[str], caps: list[str], *, read_only_proc: bool = True) -> list[str]:
    """``argv`` as uid 0 with only ``caps`` (and, as the unit has it, /proc read-only)."""
    sets = ",".join(["-all", *(f"+{cap}" for cap in caps)])
    setpriv = ["setpriv", "--reuid=0", "--regid=0", "--clear-groups", "--no-new-privs"]
    setpriv += [f"--inh-caps={sets}", f"--ambient-caps={sets}", f"--bounding-set={sets}"]
    command = shlex.join([*setpriv, "--", *argv])
    if not read_only_proc:
        return ["sh", "-c", f"exec {command}"]
    remount = "mount -o remount,bind,ro /proc"
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f"{remount} && exec {command}",
    ]


@pytest.fixture(scope="module")
def jovyan() -> Iterator[tuple[User, str, dict, Path]]:
    """A throwaway user, a Python it can run, and the test clients where it can read them."""
    need_namespaces()
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is missing: .ci/system-deps.sh installs it")
    folder = Path(tempfile.mkdtemp(prefix="jnm-privileges-", dir="/var/tmp"))  # others may read
    folder.chmod(0o755)
    user = add_user("jnmpriv")
    try:
        python, env = python_for(user, folder, {"PATH": os.environ["PATH"]})
        clients = folder / "clients"
        clients.mkdir(mode=0o755)
        for client in CLIENTS:
            shutil.copy(client, clients / client.name)
        yield user, python, env, clients
    finally:
        remove_user(user)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def share() -> Iterator[Path]:
    """A share directory as systemd-tmpfiles makes it: root's, sticky, world-writable."""
    folder = Path(tempfile.mkdtemp(prefix="jnm-share-", dir="/var/tmp"))  # others reach it
    folder.chmod(0o1777)
    (folder / "agent").mkdir(mode=0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def agent(
    env: dict, share: Path, caps: list[str], *, tcp: str | None = None, read_only_proc: bool = True
) -> Iterator[subprocess.Popen]:
    """The real exporter and node agent under ``caps``, until the block ends."""
    argv = [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
            "--interval", "1", "--share-dir", str(share)]  # fmt: skip
    argv += ["--agent-listen", tcp] if tcp else []
    command = as_shipped(argv, caps, read_only_proc=read_only_proc)
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        for line in process.stdout:
            if "serving" in line:
                break
        else:
            pytest.fail(f"the agent did not start: {process.stderr.read()}")
        wait_for("the agent's socket", (share / "agent" / "agent.sock").exists, timeout=30)
        yield process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)


@contextlib.contextmanager
def kernel_of(jovyan, args: list[str], *, net: bool = False) -> Iterator[Contained]:
    """The user's process as PID 1 of PID (and with ``net``, network) namespaces of its own."""
    user, python, env, clients = jovyan
    flags = ["--pid", "--fork", "--mount-proc", "--uts", "--mount", *(["--net"] if net else [])]
    drop = f"setpriv --reuid={user.uid} --regid={user.gid} --clear-groups"
    script = f"hostname box; exec {drop} {shlex.join([python, *args])}"
    popen = subprocess.Popen(["unshare", *flags, "sh", "-c", script], stdout=subprocess.PIPE,
                             text=True, env=env, start_new_session=True)  # fmt: skip
    box = Contained(popen, python)
    try:
        yield box
    finally:
        box.kill()


@pytest.mark.parametrize("shipped", ["unit", "daemonset"])
def test_the_shipped_agent_proves_another_users_kernel_on_its_socket(
    shipped, jovyan, share, simgpu_env, sim_state
):
    """The unit's privileges, and the DaemonSet's (the same two capabilities, /proc as is)."""
    sim_state.gpu(0, total=80 << 30).write()
    caps = unit_capabilities() if shipped == "unit" else daemonset_capabilities()
    with agent(simgpu_env, share, caps, read_only_proc=shipped == "unit"):
        sock = share / "agent" / "agent.sock"
        with kernel_of(jovyan, [str(jovyan[3] / "agent_client.py"), str(sock), "[{}]"]) as box:
            said = json.loads(box.line())
            assert said["ok"] is True and said["pid"] == box.host_pid, said


def test_the_shipped_agent_proves_a_tcp_caller_of_another_user(
    jovyan,
    share,
    subnet,  # noqa: F811
    simgpu_env,
    sim_state,
):
    """Over TCP the caller is found by the socket in its /proc/PID/fd: another user's, 0500."""
    sim_state.gpu(0, total=80 << 30).write()
    network = subnet[0]
    port = _free_port(f"{network}.1")
    with agent(simgpu_env, share, unit_capabilities(), tcp=f"{network}.1:{port}"):
        args = [str(jovyan[3] / "agent_client_net.py"), f"{network}.1:{port}", "[{}]"]
        with kernel_of(jovyan, args, net=True) as box:
            into_subnet(box.host_pid, subnet)
            said = json.loads(box.line())
            assert said["ok"] is True and said["pid"] == box.host_pid, said


_PROBE = textwrap.dedent(
    """
    import errno, json, os, sys
    def tried(path, flags):
        try:
            os.close(os.open(path, flags))
            return "ok"
        except OSError as error:
            return errno.errorcode[error.errno]
    def listed(path):
        try:
            os.listdir(path)
            return "ok"
        except OSError as error:
            return errno.errorcode[error.errno]
    other, root = sys.argv[1], sys.argv[2]
    print(json.dumps({
        "other_fd": listed(f"/proc/{other}/fd"),
        "other_ns": tried(f"/proc/{other}/ns/pid", os.O_RDONLY),
        "other_environ": tried(f"/proc/{other}/environ", os.O_RDONLY),
        "other_mem_write": tried(f"/proc/{other}/mem", os.O_RDWR),
        "root_mem_write": tried(f"/proc/{root}/mem", os.O_RDWR),
        "other_mem_read": tried(f"/proc/{other}/mem", os.O_RDONLY),
    }))
    """
)


def _probe(caps: list[str], other: int, root: int, *, read_only_proc: bool = True) -> dict:
    argv = as_shipped([sys.executable, "-c", _PROBE, str(other), str(root)], caps,
                      read_only_proc=read_only_proc)  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_unit_s_privileges_read_what_proofs_need_and_write_no_process_s_memory(jovyan):
    user, python, env, _ = jovyan
    theirs = subprocess.Popen([python, "-c", "import time; time.sleep(120)"], user=user.uid,
                              group=user.gid, extra_groups=[], env=env)  # fmt: skip
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        wait_for("the user's process", lambda: Path(f"/proc/{theirs.pid}/exe").exists())
        found = _probe(unit_capabilities(), theirs.pid, ours.pid)
        assert found["other_fd"] == found["other_ns"] == found["other_environ"] == "ok", found
        # Another user's memory: not theirs to write (EACCES) before /proc even says read-only;
        # root's, which uid 0 owns: the read-only /proc (EROFS), and only it (below).
        assert found["other_mem_write"] in ("EACCES", "EROFS"), found
        assert found["root_mem_write"] == "EROFS", found
        # What the two capabilities still allow (docs/security.md says so): reading it.
        assert found["other_mem_read"] == "ok", found
        # Why CAP_DAC_READ_SEARCH: without it, uid 0 cannot list another user's fd (0500).
        alone = _probe(["sys_ptrace"], theirs.pid, ours.pid)
        assert alone["other_fd"] == "EACCES" and alone["other_ns"] == "ok", alone
        # Why /proc read-only: without it the same capabilities open root's memory for writing
        # (the DaemonSet cannot make /proc read-only: docs/security.md says what that leaves).
        writable = _probe(unit_capabilities(), theirs.pid, ours.pid, read_only_proc=False)
        assert writable["root_mem_write"] == "ok", writable
    finally:
        for process in (theirs, ours):
            process.kill()
            process.wait()


def test_the_unit_s_privileges_tell_who_made_a_namespace(jovyan):
    """The agent's limits count a namespace a user minted as hers (issue 45): the ioctls that
    tell so (NS_GET_USERNS, NS_GET_PARENT, NS_GET_OWNER_UID) work under the unit's privileges."""
    user, _python, _env, _ = jovyan
    minted = subprocess.Popen(
        ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "unshare",
         "--user", "--pid", "--fork", "sleep", "120"], start_new_session=True,
    )  # fmt: skip
    try:

        def inner() -> int | None:
            children = psutil.Process(minted.pid).children(recursive=True)
            sleeping = [c.pid for c in children if c.name() == "sleep"]
            return sleeping[0] if sleeping else None

        pid = wait_for("the user's namespace's process", inner)
        code = (
            "import json; from jax_nbmem.agent.admission import unix_group; "
            f"print(json.dumps(unix_group('/proc', {pid}, -1)))"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run(as_shipped([sys.executable, "-c", code], unit_capabilities()),
                              capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == ["uid", user.uid]
    finally:
        os.killpg(minted.pid, signal.SIGKILL)
        minted.wait()
