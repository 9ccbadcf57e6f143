"""This process on the GPU (jax_nbmem.gpu.own_process): one notion, and nobody else's.

The unit tests run here, on the host, and in a real PID namespace (``unshare --pid --fork
--mount-proc``, as root); the features that use it are tested on both sides with the node
agent in ``tests/containers/test_own_figures.py``.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jax_nbmem.gpu import own_process

PACKAGE = Path(__file__).resolve().parents[2] / "jax_nbmem"
ROOT = PACKAGE.parent

# Where os.getpid() may appear, and why none of them compares it with NVML's PIDs: each is
# this process's PID in its own namespace, for /proc here, its beacon's claims, its claim
# files or its own bookkeeping.
MAY_CALL_GETPID = {
    "jax_nbmem/gpu/own_process.py": "the one place that says which PID NVML lists us by",
    "jax_nbmem/gpu/jaxstats.py": "a forked child opens its own /proc/self/statm",
    "jax_nbmem/node/identity.py": "the PID in its namespace, a claim the agent proves",
    "jax_nbmem/tenants/attribution.py": "whether /proc is mounted here at all",
    "jax_nbmem/tenants/status.py": "its PID here, where its beacon and /proc know it",
    "jax_nbmem/tenants/auto.py": "claims are keyed by the PID in the claimer's namespace",
    "jax_nbmem/notebook/beacon.py": "the beacon's `pid`: its PID here, a claim",
    "jax_nbmem/notebook/session.py": "releases its claim, keyed by its PID here",
    "jax_nbmem/cli/stop_target.py": "the CLI's own PID in /proc, never stopped",
    "jax_nbmem/agent/netpeer.py": "the agent's own network namespace in /proc",
    "jax_nbmem/agent/conntrack.py": "the agent's own network namespace's conntrack in /proc",
    "jax_nbmem/agent/admission.py": "the agent's own PID namespace in /proc",
    "jax_nbmem/agent/publish.py": "the agent says its own PID in what it publishes",
}


def _getpid_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "getpid"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "os"
    ]


def test_no_module_compares_os_getpid_with_nvml_pids():
    unexpected, compared = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith("jax_nbmem/simgpu/"):
            continue  # the simulated GPU is the driver: it lists whoever calls it
        tree = ast.parse(path.read_text(), filename=name)
        calls = _getpid_calls(tree)
        if calls and name not in MAY_CALL_GETPID:
            unexpected.append(f"{name}:{calls[0].lineno}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and name != "jax_nbmem/gpu/own_process.py":
                if _getpid_calls(node):
                    compared.append(f"{name}:{node.lineno}")
    assert not unexpected, (
        "os.getpid() where NVML's PIDs are read: use jax_nbmem.gpu.own_process "
        f"(nvml_pid, is_own, own_entries), or say here why it is not NVML's: {unexpected}"
    )
    assert not compared, f"os.getpid() compared: use jax_nbmem.gpu.own_process: {compared}"


def test_the_allowed_list_names_only_modules_that_still_call_it():
    stale = [
        name for name in MAY_CALL_GETPID if not _getpid_calls(ast.parse((ROOT / name).read_text()))
    ]
    assert not stale, stale


def test_on_the_host_nvml_lists_us_by_our_own_pid_whatever_a_proof_says(monkeypatch):
    if own_process.in_host_namespace() is not True:
        pytest.skip("this test process is not in the host's PID namespace")
    monkeypatch.setattr(own_process, "_proven", None)
    assert own_process.nvml_pid() == os.getpid()
    own_process.set_proven_pid(4242)  # a stand-in agent's answer: the host needs none
    assert own_process.nvml_pid() == os.getpid()
    assert own_process.proven_pid() == 4242
    processes = [_Entry(os.getpid(), 0, 5), _Entry(4242, 0, 7)]
    assert own_process.own_entries(processes) == [processes[0]]
    assert own_process.is_own(os.getpid()) and not own_process.is_own(4242)


class _Entry:
    def __init__(self, pid, gpu, used_bytes):
        self.pid, self.gpu, self.used_bytes = pid, gpu, used_bytes


_IN_NAMESPACE = textwrap.dedent(
    """
    import os, sys
    from jax_nbmem.gpu import own_process
    class P:
        def __init__(self, pid): self.pid, self.gpu, self.used_bytes = pid, 0, 1
    said = [own_process.in_host_namespace(), own_process.nvml_pid(),
            own_process.own_entries([P(os.getpid()), P(0)]), own_process.is_own(os.getpid()),
            own_process.is_own(None), "container" in own_process.unknown_reason()]
    own_process.set_proven_pid(int(sys.argv[1]))
    listed = own_process.own_entries([P(int(sys.argv[1])), P(os.getpid())])
    said += [own_process.nvml_pid(), [p.pid for p in listed]]
    own_process.set_proven_pid(0)  # not a PID: unproven again, never 0
    said.append(own_process.nvml_pid())
    pid = os.fork()
    if pid == 0:  # a forked child is another process: unproven
        own_process.set_proven_pid(777)
        os.write(1, f"{[own_process.proven_pid()]}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    own_process.set_proven_pid(777)
    pid = os.fork()
    if pid == 0:
        os.write(1, f" child {own_process.proven_pid()} {own_process.nvml_pid()}\\n".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    print(said, flush=True)
    """
)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare for a PID namespace (as CI runs)",
)
def test_in_a_pid_namespace_our_nvml_pid_is_unknown_until_the_agent_proves_it():
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _IN_NAMESPACE,
         "31337"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, rest = done.stdout.split(" child ")
    assert first == "[777]"
    assert rest.splitlines()[0] == "None None"  # the parent's proof is not the child's
    said = eval(rest.splitlines()[1])  # noqa: S307 - our own repr of plain values
    assert said == [False, None, None, False, False, True, 31337, [31337], None]
