"""A proof is bound to its process: a connection that outlives it proves no one (issue 37).

Mallory proves her kernel, hands the connection to a child and exits; bob's process is given
her PID (forced with ``ns_last_pid`` in a PID namespace of the test's own, where the agent
serves too, so its PIDs are the agent's host PIDs); the child's line claiming bob's process
must prove nothing, and its refusal must say nothing of bob's process. Real users; root only.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile.agents import reachable_share, users
from tests.jupyterlab import REPO_ROOT

DRIVER = Path(__file__).with_name("pid_reuse.py")


__all__ = ["reachable_share", "users"]  # fixtures


@pytest.mark.parametrize("bound_by", ["pidfd", "ticks"])
def test_a_reused_pid_is_not_proven_by_the_connection_its_first_owner_left(
    users, reachable_share, bound_by
):
    mallory, bob = users
    args = [str(reachable_share), f"{mallory.uid}:{mallory.gid}", f"{bob.uid}:{bob.gid}", bound_by]
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(DRIVER), *args],
        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["first"] == {"ok": True, "pid": report["mallory"]}  # her proof held, once
    assert report["bob"] == report["mallory"]  # the PID was reused: bob's process has it
    answer = report["answer"]
    # The child's line proved nothing: refused (the connection's process ended) or closed.
    assert answer == "closed" or answer == {
        "ok": False,
        "reason": "the process that opened this connection has ended",
    }
    assert report["bob"] not in report["proven"]
    assert str(report["bob_ticks"]) not in json.dumps(answer)
