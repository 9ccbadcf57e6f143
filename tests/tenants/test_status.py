"""The status report as a person and a machine read it: `jax-nbmem status`, `%jaxmem status`.

Real processes against the simulated GPU: the CLI in a fresh Python, the magics in a real
IPython session.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jax_nbmem.simgpu import GIB
from tests.ipython_session import run_cells
from tests.users import library_for_others

MIB = 1024**2
BASE_USED = 0  # R510+ drivers (the simulated one's default): used is the processes' memory


def _cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "status", *args],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_used_is_what_nvidia_smi_shows_and_the_reserved_memory_is_said_apart(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB, reserved=512 * MIB).process(0, 4242, 4 * GIB).write()
    [gpu] = json.loads(_cli("--json", env=simgpu_env))["gpus"]
    assert gpu["used_bytes"] == 4 * GIB + BASE_USED  # nvidia-smi's "used", without reserved
    assert gpu["reserved_bytes"] == 512 * MIB
    assert gpu["free_bytes"] == 80 * GIB - 512 * MIB - 4 * GIB - BASE_USED
    assert gpu["used_bytes"] + gpu["reserved_bytes"] + gpu["free_bytes"] == gpu["total_bytes"]
    line = (
        "GPU 0: NVIDIA H200 (simulated) — 4.00 GiB used of 80.0 GiB, 75.5 GiB free, "
        "512 MiB reserved by the driver"
    )
    assert line in _cli(env=simgpu_env).splitlines()
    out = run_cells(
        ["%load_ext jax_nbmem", "import time; time.sleep(0.3)", "%jaxmem status", "%jaxmem"],
        env=simgpu_env,
    )
    assert all(o.error is None for o in out), [o.text for o in out]
    assert line in out[2].stdout.splitlines()
    header = out[3].stdout.splitlines()[0]  # the panel, as a frontend without widgets shows it
    assert header.endswith("free 75.5 GiB of 80.0 GiB · 512 MiB reserved by the driver")


def test_a_lost_gpu_is_said_once(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).gpu(1, total=80 * GIB).process(0, 4242, GIB)
    sim_state.process(1, 4343, GIB).fail("memory", "GPU_IS_LOST", 1).write()
    report = json.loads(_cli("--json", env=simgpu_env))
    lost = report["gpus"][1]
    assert lost["used_bytes"] is None and lost["problem"].count("GPU 1 is lost") == 1
    assert "process list unreadable" in lost["problem"]  # who is on it is unknown too
    assert report["gpus"][0]["problem"] is None
    text = _cli(env=simgpu_env)
    assert text.count("GPU 1 is lost") == 1
    after = text.split("GPU 1: ", 1)[1]
    assert "no processes" not in after.split("\nGPU ", 1)[0]  # unknown, not none
    out = run_cells(["%load_ext jax_nbmem", "import time; time.sleep(0.3)", "%jaxmem"], simgpu_env)
    [panel_line] = [line for line in out[2].stdout.splitlines() if line.startswith("GPU 1: GPU")]
    assert panel_line.count("GPU 1 is lost") == 1 and "process list unreadable" in panel_line


SMALL_MIG = "MIG-11111111-2222-5333-8444-555555555555"
BIG_MIG = "MIG-66666666-7777-5888-8999-000000000000"


def _split_gpu(state, sleeper):
    """GPU 0 split into a 1g.18gb (instance 1) and a 3g.71gb (instance 2); GPU 1 whole."""
    state.gpu(0, total=141 * GIB, mig=True).gpu(1, total=141 * GIB)
    state.mig(0, 1, 18 * GIB, uuid=SMALL_MIG, name="NVIDIA H200 MIG 1g.18gb")
    state.mig(0, 2, 71 * GIB, uuid=BIG_MIG, name="NVIDIA H200 MIG 3g.71gb")
    state.process(0, 4001, 5 * GIB, mig=1).process(0, sleeper, 30 * GIB, mig=2)
    return state.process(1, 4003, 2 * GIB)


def test_a_mig_instance_is_a_gpu_in_the_status(sim_state, simgpu_env, sleeper):
    _split_gpu(sim_state, sleeper).write()
    env = {**simgpu_env, "CUDA_VISIBLE_DEVICES": BIG_MIG}
    report = json.loads(_cli("--json", env=env))
    split, whole, small, big = report["gpus"]
    assert (split["mig_mode"], split["ours"], whole["ours"]) == (True, False, False)
    assert (small["ours"], big["ours"]) == (False, True)  # only the instance named is ours
    assert big["label"] == "MIG 3g.71gb instance 2 of GPU 0" and big["uuid"] == BIG_MIG
    assert big["mig"]["parent_uuid"] == split["uuid"] and big["mig"]["gpu_instance_id"] == 2
    assert big["total_bytes"] == 71 * GIB and big["used_bytes"] == 30 * GIB
    on = {p["pid"]: p["gpu"] for p in report["processes"]}
    assert on == {4001: small["index"], sleeper: big["index"], 4003: 1}
    assert report["notes"] == []  # a MIG UUID is certain
    text = _cli(env=env)
    assert "GPU 0: NVIDIA H200 (simulated) — " in text and "in MIG mode" in text
    assert "MIG 3g.71gb instance 2 of GPU 0: NVIDIA H200 MIG 3g.71gb — 30.0 GiB used of " in text
    split_block = text.split("GPU 0: ", 1)[1].split("\nMIG", 1)[0]
    assert "no processes" not in split_block  # its processes are its instances'
    # The kernel's sampler and panel follow the instance too.
    out = run_cells(["%load_ext jax_nbmem", "import time; time.sleep(0.3)", "%jaxmem"], env=env)
    assert all(o.error is None for o in out), [o.text for o in out]
    lines = out[2].stdout.splitlines()
    assert lines[0].startswith("MIG 3g.71gb instance 2 of GPU 0: NVIDIA H200 MIG 3g.71gb · ")
    assert lines[0].endswith("free 41.0 GiB of 71.0 GiB")


# A cell in which an administrator makes a 2g.35gb instance in GPU 0's free slices.
SPLIT_ANEW_CELL = f"""\
import os, time
from jax_nbmem.gpu.nvml_session import LAYOUT_CHECK_S
from jax_nbmem.simgpu import GIB, SimState
state = SimState(os.environ["JAX_NBMEM_SIMGPU_STATE"] + ".new")
state.gpu(0, total=141 * GIB, mig=True).gpu(1, total=141 * GIB)
state.mig(0, 1, 18 * GIB, uuid="{SMALL_MIG}", name="NVIDIA H200 MIG 1g.18gb")
state.mig(0, 2, 71 * GIB, uuid="{BIG_MIG}", name="NVIDIA H200 MIG 3g.71gb")
state.mig(0, 3, 35 * GIB, uuid="MIG-33333333-4444-5555-8666-777777777777",
          name="NVIDIA H200 MIG 2g.35gb")
state.process(0, os.getpid(), 9 * GIB, mig=2).write()
os.replace(state.path, os.environ["JAX_NBMEM_SIMGPU_STATE"])
time.sleep(LAYOUT_CHECK_S + 1)  # the readings look at the layout that often: once more
"""


def test_an_instance_made_under_a_running_kernel_is_shown(sim_state, simgpu_env, sleeper):
    _split_gpu(sim_state, sleeper).write()
    env = {**simgpu_env, "CUDA_VISIBLE_DEVICES": BIG_MIG}
    cells = ["%load_ext jax_nbmem", "%jaxmem status", SPLIT_ANEW_CELL, "%jaxmem status", "%jaxmem"]
    out = run_cells(cells, env=env)
    assert all(o.error is None for o in out), [o.text for o in out]
    assert "MIG 2g.35gb" not in out[1].stdout
    after = out[3].stdout
    assert "MIG 2g.35gb instance 3 of GPU 0: NVIDIA H200 MIG 2g.35gb — 0 B used of 35.0 GiB" in (
        after
    )
    assert "MIG 3g.71gb instance 2 of GPU 0: NVIDIA H200 MIG 3g.71gb — 9.00 GiB used" in after
    # The kernel's panel still draws its own instance, with its memory as it is now.
    header = out[4].stdout.splitlines()[0]
    assert header.startswith("MIG 3g.71gb instance 2 of GPU 0: NVIDIA H200 MIG 3g.71gb · ")
    assert header.endswith("free 62.0 GiB of 71.0 GiB")


def test_a_user_other_than_root_sees_the_instances_and_is_told_why_not_the_gpu(
    sim_state, simgpu_env, sleeper
):
    _split_gpu(sim_state, sleeper).unprivileged().write()
    report = json.loads(_cli("--json", env={**simgpu_env, "CUDA_VISIBLE_DEVICES": SMALL_MIG}))
    split, _, small, big = report["gpus"]
    assert report["nvml"]["available"] is True
    assert split["used_bytes"] is None
    assert "MIG instances other than yours cannot be read without root" in split["problem"]
    assert small["ours"] and small["used_bytes"] == 5 * GIB and big["used_bytes"] == 30 * GIB
    text = _cli(env={**simgpu_env, "CUDA_VISIBLE_DEVICES": SMALL_MIG})
    assert "cannot be read without root" in text and "Traceback" not in text


def test_the_warning_names_the_instance_and_counts_in_its_memory(sim_state, simgpu_env, sleeper):
    _split_gpu(sim_state, sleeper).write()
    code = (
        "import json; from jax_nbmem.tenants.status import collect\n"
        "print(json.dumps(collect(in_kernel=True)['warnings']))"
    )
    env = {**simgpu_env, "CUDA_VISIBLE_DEVICES": BIG_MIG, "JAX_PLATFORMS": ""}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    [warning] = json.loads(done.stdout.splitlines()[-1])
    assert warning["kind"] == "prealloc-will-fail" and warning["gpu"] == 3
    # 75% of the instance's 71 GiB, not of the GPU's 141 GiB; the process on it is named
    assert "will ask for 75% of MIG 3g.71gb instance 2 of GPU 0 (53.2 GiB)" in warning["message"]
    assert "only 41.0 GiB is free" in warning["message"] and f"PID {sleeper}" in warning["message"]


SIBLING_CODE = """\
import json
from jax_nbmem.tenants.advice import oom_diagnosis
from jax_nbmem.tenants.status import collect, format_status
report = collect(in_kernel=True)
ours = {gpu["index"] for gpu in report["gpus"] if gpu["ours"]}
oom = oom_diagnosis(report.tenants(), [g for g in report.gpu_memory() if g.index in ours])
print(json.dumps({"warnings": report["warnings"], "text": format_status(report), "oom": oom,
                  "ours": sorted(ours), "on": {p["pid"]: p["gpu"] for p in report["processes"]}}))
"""


@pytest.mark.parametrize("root", [True, False], ids=["root", "not-root"])
def test_a_process_on_a_sibling_instance_is_not_on_your_gpu(sim_state, simgpu_env, sleeper, root):
    # The other instance of the same GPU is nearly full (as if JAX had preallocated 75% of
    # it): our kernel, on the small instance, is alone.
    sim_state.gpu(0, total=141 * GIB, mig=True).gpu(1, total=141 * GIB)
    sim_state.mig(0, 1, 18 * GIB, uuid=SMALL_MIG, name="NVIDIA H200 MIG 1g.18gb")
    sim_state.mig(0, 2, 71 * GIB, uuid=BIG_MIG, name="NVIDIA H200 MIG 3g.71gb")
    sim_state.process(0, sleeper, 70 * GIB, mig=2)
    sim_state.unprivileged(not root).write()
    env = {**simgpu_env, "CUDA_VISIBLE_DEVICES": SMALL_MIG, "JAX_PLATFORMS": ""}
    done = subprocess.run(
        [sys.executable, "-c", SIBLING_CODE], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["ours"] == [2] and seen["on"] == {str(sleeper): 3}  # on its own instance only
    assert seen["warnings"] == []  # no "will fail", no "blocking", no one sharing
    assert f"PID {sleeper}" not in seen["oom"] and "MIG 3g.71gb" not in seen["oom"]
    assert "MIG 1g.18gb instance 1 of GPU 0 (NVIDIA H200 MIG 1g.18gb): 0 B used" in seen["oom"]
    # The status lists the sibling under its own instance, which is not this process's.
    ours, theirs = seen["text"].split("MIG 1g.18gb instance 1 of GPU 0: ", 1)[1].split("\nMIG ")
    assert "no processes" in ours and str(sleeper) not in ours
    assert theirs.startswith("3g.71gb instance 2 of GPU 0: ") and "(not visible" in theirs
    assert str(sleeper) in theirs and "No warnings." in seen["text"]


def test_a_real_user_other_than_root_is_told_not_raised(sim_state, other_user, simgpu_lib, sleeper):
    from jax_nbmem import simgpu

    _, uid, gid = other_user
    with library_for_others(simgpu_lib, "jnm-mig-status-") as folder:
        lib = folder / "lib" / simgpu.LIBRARY_NAME
        sim_state.path = folder / "gpu.state"
        _split_gpu(sim_state, sleeper).write()
        env = {**simgpu.env_for_subprocess(lib.parent, sim_state.path), "HOME": str(folder),
               "CUDA_VISIBLE_DEVICES": BIG_MIG}  # fmt: skip
        # everything is imported as root; NVML is opened, and the status taken, as the other user
        code = (
            "import json, os, pynvml\nfrom jax_nbmem.tenants.status import collect, format_status\n"
            f"os.setgroups([]); os.setgid({gid}); os.setuid({uid})\n"
            "report = collect(share_dir=os.environ['HOME'])\n"
            "print(format_status(report)); print(json.dumps(report['gpus']))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        split, _, _, big = json.loads(done.stdout.splitlines()[-1])
        assert split["used_bytes"] is None and "cannot be read without root" in split["problem"]
        assert big["ours"] and big["used_bytes"] == 30 * GIB
        assert "GPU 0 is in MIG mode: MIG instances other than yours" in done.stdout


POOL_GPUS_CODE = """\
import json, sys
import jax
if sys.argv[1] != "all":  # JAX's own option, set in a cell before JAX starts
    jax.config.update("jax_cuda_visible_devices", sys.argv[1])
from jax_nbmem.gpu import jaxstats
from jax_nbmem.tenants.status import collect
assert not jaxstats.backend_initialized()
print(json.dumps(collect(in_kernel=True)["warnings"]))
"""


@pytest.mark.parametrize(
    ("chosen", "warned"), [("all", [0, 1]), ("1", [1]), ("0", [0])], ids=["all", "1", "0"]
)
def test_the_pool_to_come_is_warned_of_only_where_jax_cuda_visible_devices_lets_jax(
    sim_state, simgpu_env, sleeper, chosen, warned
):
    """Issue 47's gap: JAX's ``jax_cuda_visible_devices`` (as well as CUDA_VISIBLE_DEVICES)
    narrows the GPUs where a kernel whose JAX has not started will make its pool."""
    for index in (0, 1):  # 75% of 80 GiB will not fit in the 20 GiB left on either
        sim_state.gpu(index, total=80 * GIB).process(index, sleeper, 60 * GIB)
    sim_state.write()
    env = {**simgpu_env, "JAX_PLATFORMS": ""}
    done = subprocess.run([sys.executable, "-c", POOL_GPUS_CODE, chosen],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    warnings = json.loads(done.stdout.splitlines()[-1])
    assert [w["gpu"] for w in warnings if w["kind"] == "prealloc-will-fail"] == warned, warnings
