"""Processes in PID namespaces of their own, as a container runtime makes them (root only)."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.waiting import wait_for

CLIENT = Path(__file__).with_name("agent_client.py")


def need_namespaces() -> None:
    """Skip unless this is root with ``unshare`` (as CI runs the suite)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("PID namespaces need root and unshare")


class Contained:
    """A process started in a PID namespace of its own: ``host_pid``, its lines on stdout."""

    def __init__(self, popen: subprocess.Popen, program: str) -> None:
        self.popen = popen
        self.host_pid = wait_for(
            f"{program} as the namespace's init", lambda: _inner(popen.pid, program), timeout=20
        )

    def line(self) -> str:
        """Its next line on stdout ('' once it ended)."""
        return self.popen.stdout.readline().strip()

    def kill(self) -> None:
        """SIGKILL to its namespace's init: every process in it dies."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.host_pid, signal.SIGKILL)
        self.popen.wait(20)


def _inner(unshare_pid: int, program: str) -> int | None:
    """The namespace's init once it runs ``program`` (before: unshare's fork, then sh)."""
    try:
        children = psutil.Process(unshare_pid).children()
        started = children and children[0].cmdline()[:1] == [program]
    except psutil.Error:
        return None
    return children[0].pid if started else None


@contextlib.contextmanager
def contained(args, *, hostname="box", mount_proc=True, env=None, blank_proc=False):
    """Run ``args`` as PID 1 of a new PID namespace (and UTS, mount), named ``hostname``.

    ``mount_proc=False``: /proc stays the host's; ``blank_proc``: an empty /proc (none mounted).
    """
    need_namespaces()
    inner = " ".join(_quote(a) for a in args)
    script = f"hostname {hostname}; "
    if blank_proc:
        script += "mount -t tmpfs none /proc; "
    script += f"exec {inner}"
    flags = ["--pid", "--fork", "--uts", "--mount"]
    if mount_proc:
        flags.append("--mount-proc")
    popen = subprocess.Popen(
        ["unshare", *flags, "sh", "-c", script],
        stdout=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    box = Contained(popen, str(args[0]))
    try:
        yield box
    finally:
        box.kill()


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(str(arg))


def client_args(socket_path, patches="[{}]", share_dir="", *, kernel_id=None, folder=None):
    """The command line of tests/agent/agent_client.py.

    ``kernel_id`` (and a ``folder`` to copy it to): it looks like a Jupyter kernel from the
    host (``.../ipykernel_launcher.py ... -f kernel-<id>.json``).
    """
    client = CLIENT
    if kernel_id is not None:
        client = Path(folder) / "ipykernel_launcher.py"
        shutil.copy(CLIENT, client)
    args = [sys.executable, str(client), str(socket_path), patches]
    args = [*args, str(share_dir)] if share_dir else args
    return [*args, "-f", f"/tmp/kernel-{kernel_id}.json"] if kernel_id is not None else args
