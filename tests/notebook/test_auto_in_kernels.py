"""`%jaxalloc auto` in real kernels on the simulated GPU; kernels started together; the policy."""

import json
import subprocess
import sys

import pytest

from jax_nbmem.simgpu import GIB
from tests.kernels import execute, running_kernel

pytestmark = pytest.mark.kernel

ENV_DUMP = (
    "import os, json; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith('XLA_')}))"
)


def test_alone_auto_keeps_jax_default_and_says_why(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    with running_kernel(env=simgpu_env) as (_, client):
        out, error = execute(client, "%load_ext jax_nbmem\n%jaxalloc auto")
        assert error is None, out
        assert "allocator mode 'on'" in out
        report, _ = execute(client, "%jaxalloc")
        assert "requested:   on" in report and "auto: alone on GPU 0" in report
        env, _ = execute(client, ENV_DUMP)
        assert json.loads(env) == {}


def test_with_a_preallocated_neighbour_auto_turns_preallocation_off(sim_state, simgpu_env, sleeper):
    sim_state.gpu(0, total=80 * GIB).process(0, sleeper, 60 * GIB).write()
    with running_kernel(env=simgpu_env) as (_, client):
        out, error = execute(client, "%load_ext jax_nbmem\n%jaxalloc auto")
        assert error is None, out
        assert "allocator mode 'off'" in out
        report, _ = execute(client, "%jaxalloc")
        assert f"auto: GPU 0 is shared (PID {sleeper} holds 60.0 GiB" in report
        env, _ = execute(client, ENV_DUMP)
        assert json.loads(env) == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def _reply_text(client, msg_id, timeout=60):
    chunks = []
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            chunks.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            chunks.append("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(chunks)


@pytest.mark.timeout(180)
def test_kernels_starting_together_see_each_others_claims(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    with (
        running_kernel(env=simgpu_env) as (_, first),
        running_kernel(env=simgpu_env) as (_, second),
    ):
        for client in (first, second):
            execute(client, "%load_ext jax_nbmem")
        # The same moment: both ask before either has seen the other's answer.
        ids = [client.execute("%jaxalloc auto") for client in (first, second)]
        answers = [_reply_text(c, i) for c, i in zip((first, second), ids, strict=True)]
    chosen = sorted(
        "on" if "mode 'on'" in a else "off" if "mode 'off'" in a else a for a in answers
    )
    assert chosen == ["off", "on"], answers  # one pool, not two of 60 GiB on an 80 GiB GPU
    (late,) = [a for a in answers if "'off'" in a]
    assert "kernels starting now claim 60.0 GiB" in late


def test_a_site_policy_refuses_on_and_leaves_the_environment_unchanged(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    with running_kernel(env=simgpu_env) as (_, client):
        execute(client, "%load_ext jax_nbmem")
        execute(client, "%config JaxNbMem.policy = {'max_fraction': 0.5, 'reason': 'shared node'}")
        before, _ = execute(client, ENV_DUMP)
        out, error = execute(client, "%jaxalloc on")
        assert "UsageError" in out, (error, out)
        assert "refused by this site's policy" in out and "(shared node)" in out
        after, _ = execute(client, ENV_DUMP)
        assert after == before
        out, error = execute(client, "%jaxalloc auto")
        assert error is None and "allocator mode 'fraction 0.5'" in out, out


def test_a_kernelspec_in_auto_decides_when_the_kernel_starts(
    sim_state, simgpu_env, tmp_path, sleeper
):
    sim_state.gpu(0, total=80 * GIB).process(0, sleeper, 60 * GIB).write()
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "kernel", "install", "--allocator", "auto",
         "--prefix", str(tmp_path)],
        capture_output=True, text=True, env=simgpu_env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kernels = str(tmp_path / "share" / "jupyter" / "kernels")
    with running_kernel("jax-nbmem-auto", env=simgpu_env, kernel_dirs=[kernels]) as (_, client):
        env, _ = execute(client, ENV_DUMP)
        assert json.loads(env) == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # before any cell
        report, _ = execute(client, "%jaxalloc")
        assert "[from $JAX_NBMEM_ALLOCATOR auto: GPU 0 is shared" in report


@pytest.mark.timeout(180)
def test_the_provisioner_chooses_at_launch_before_any_user_code(
    simgpu_in_process, simgpu_env, tmp_path, sleeper
):
    # The launcher (here: this process, as a Jupyter server would be) reads the simulated GPU.
    simgpu_in_process.gpu(0, total=80 * GIB).process(0, sleeper, 60 * GIB).write()
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "kernel", "install", "--allocator", "auto",
         "--provisioner", "--prefix", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kernels = str(tmp_path / "share" / "jupyter" / "kernels")
    spec = json.loads(
        (tmp_path / "share/jupyter/kernels/jax-nbmem-auto-provisioned/kernel.json").read_text()
    )
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "jax-nbmem-provisioner"
    with running_kernel("jax-nbmem-auto-provisioned", env=simgpu_env, kernel_dirs=[kernels]) as (
        _,
        client,
    ):
        env, _ = execute(client, ENV_DUMP)
        assert json.loads(env) == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # before any cell
        reason, _ = execute(client, "import os; print(os.environ['JAX_NBMEM_MODE_REASON'])")
        assert f"GPU 0 is shared (PID {sleeper} holds 60.0 GiB" in reason
        report, _ = execute(client, "%jaxalloc")
        assert "requested:   off" in report and "chosen at launch: GPU 0 is shared" in report
