"""GPU sharing caps on the simulated GPU: MPS's and HAMi's variables in real shells and kernels.

An 80 GiB simulated card; the kernel's environment caps it at 20 GiB. The mirror holds what
JAX's allocator would under the cap (modelled as MPS or HAMi enforce it), and jax_nbmem says,
before JAX starts, what the mode will take against the cap; ``auto`` and ``fit`` size against
it; status, the beacon and the metrics carry it; bad caps are said, never a crash.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from jax_nbmem.allocator.jaxlib import effective
from jax_nbmem.metrics.metrics import Snapshot, metric_families
from jax_nbmem.simgpu import GIB, SimState
from jax_nbmem.simgpu.mirror import CONTEXT_BYTES
from jax_nbmem.tenants.status import collect
from jax_nbmem.tools.fit import ProgramNeeds, read_rooms
from jax_nbmem.tools.fit_report import format_fit, judge
from tests.ipython_session import run_cells
from tests.kernels import execute, running_kernel
from tests.waiting import wait_for

MPS = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20G"}
HAMI = {"CUDA_DEVICE_MEMORY_LIMIT_0": "20480m"}


def _retried(pool: int, room: int) -> int:
    while pool > room:
        pool = int(pool * 0.9)  # XLA's BFC asks again for 0.9x as much
    return pool


# JAX's default asks 75% of the card under MPS: 60 GiB; its 0.9x retries end at 60 x 0.9**11.
MPS_POOL = _retried(60 * GIB, 20 * GIB - CONTEXT_BYTES)
START_MIRROR = (
    "from jax_nbmem.simgpu.mirror import start_from_environment\nstart_from_environment()"
)
START_JAX = "import jax.numpy as jnp\nx = jnp.ones((1024, 1024))"


def held_by(state_path, pid, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = SimState.read(state_path).process_bytes(pid)
        if held is not None:
            return held
        time.sleep(0.1)
    raise AssertionError(f"PID {pid} never held memory on the simulated GPU")


def status_json(text: str) -> dict:
    return json.loads(text[text.index("{") :])


@pytest.mark.kernel
@pytest.mark.timeout(240)
def test_under_mps_the_default_overruns_the_cap_and_everyone_is_told(
    sim_state, simgpu_env, simgpu_in_process
):
    sim_state.gpu(0, total=80 * GIB).write()
    with running_kernel(env={**simgpu_env, **MPS}) as (manager, client):
        pid = manager.provisioner.process.pid
        execute(client, "%load_ext jax_nbmem\n" + START_MIRROR)
        # Before JAX starts, %jaxalloc says what JAX's default will take against the cap.
        report, _ = execute(client, "%jaxalloc")
        assert (
            "cap:         GPU 0: MPS caps this process at 20.0 GiB "
            "(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT); 'on' asks for 75% of the whole GPU, as CUDA "
            "reports it (60.0 GiB), over the cap: its 0.9x retries end at 18.8 GiB"
        ) in report
        out, _ = execute(client, "%jaxmem status --json")
        status = status_json(out)
        assert status["gpus"][0]["memory_cap_bytes"] == 20 * GIB
        assert status["gpus"][0]["memory_cap"]["kind"] == "mps"
        [warning] = [w for w in status["warnings"] if w["kind"] == "prealloc-exceeds-cap"]
        assert "its 0.9x retries end at 18.8 GiB" in warning["message"]
        assert "`%jaxalloc fraction 0.2`, which fits" in warning["message"]
        assert not [w for w in status["warnings"] if w["kind"] == "prealloc-will-fail"]
        # JAX's default asked for 60 GiB of the card; under the cap it holds 18.8 GiB.
        execute(client, START_JAX)
        assert held_by(sim_state.path, pid) == CONTEXT_BYTES + MPS_POOL
        assert CONTEXT_BYTES + MPS_POOL <= 20 * GIB

        # The node's view (this process, no cap of its own): the kernel's beacon carries it.
        def capped():  # the beacon is rewritten at most once a second: the cap comes with it
            node = collect(in_kernel=False, host=False)
            rows = [p for p in node["processes"] if p["pid"] == pid]
            return node if rows and rows[0]["memory_cap_bytes"] == 20 * GIB else None

        node = wait_for("the kernel's beacon to carry its cap", capped, timeout=30)
        [row] = [p for p in node["processes"] if p["pid"] == pid]
        assert node["gpus"][0]["memory_cap_bytes"] is None  # no cap on this process
        families = {f.name: f for f in metric_families(Snapshot(node, time.time()))}
        caps = families["jax_nbmem_kernel_memory_cap_bytes"]
        pid_at = caps.labels.index("pid")
        assert [(v[pid_at], value) for v, value in caps.samples] == [(str(pid), 20.0 * GIB)]
        kinds = {v[0] for v, _ in families["jax_nbmem_warnings"].samples}
        assert "prealloc-exceeds-cap" in kinds


def test_under_hami_the_fraction_is_of_the_cap_and_auto_keeps_the_default(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    cells = run_cells(
        [
            "%load_ext jax_nbmem\n" + START_MIRROR,
            "%jaxalloc auto",
            "%jaxalloc",
            "%jaxmem status --json",
        ],
        env={**simgpu_env, **HAMI, "JAX_PLATFORMS": "cpu"},
    )
    assert all(c.error is None for c in cells), [c.text for c in cells]
    auto = cells[1].text
    assert "auto chose 'on'" in auto
    assert "alone on GPU 0 with 20.0 GiB of 20.0 GiB free, capped at 20.0 GiB by HAMi" in auto
    assert "'on' asks for 75% of the cap (15.0 GiB), which fits" in cells[2].text
    status = status_json(cells[3].text)
    assert status["gpus"][0]["memory_cap"] == {
        "bytes": 20 * GIB, "cuda_device": 0, "kind": "hami",
        "variable": "CUDA_DEVICE_MEMORY_LIMIT_0", "cuda_total_is_cap": True,
    }  # fmt: skip
    assert status["warnings"] == []


def test_hami_pool_on_the_mirror_is_a_fraction_of_the_cap(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    cells = run_cells(
        [
            "%load_ext jax_nbmem\n" + START_MIRROR,
            START_JAX,
            "import time, os\nfrom jax_nbmem.simgpu import SimState\n"
            f"for _ in range(100):\n"
            f"    held = SimState.read({str(sim_state.path)!r}).process_bytes(os.getpid())\n"
            "    if held: break\n"
            "    time.sleep(0.1)\n"
            "print(held)",
            "%jaxmem status --json",
        ],
        env={**simgpu_env, **HAMI, "JAX_PLATFORMS": "cpu"},
    )
    assert all(c.error is None for c in cells), [c.text for c in cells]
    assert int(cells[2].stdout.split()[-1]) == CONTEXT_BYTES + 15 * GIB  # 75% of the cap
    [row] = [p for p in status_json(cells[3].text)["processes"] if p["kind"] == "self"]
    assert row["memory_cap_bytes"] == 20 * GIB


def test_under_mps_auto_turns_preallocation_off_and_fits_a_fraction(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    cells = run_cells(
        ["%load_ext jax_nbmem", "%jaxalloc auto", "%jaxalloc fraction 0.5"],
        env={**simgpu_env, **MPS},
    )
    assert all(c.error is None for c in cells), [c.text for c in cells]
    assert "auto chose 'off'" in cells[1].text and "capped at 20.0 GiB by MPS" in cells[1].text
    # Asked for explicitly, a mode over the cap is said at once, as one that will not fit is.
    assert "WARNING [prealloc-exceeds-cap]" in cells[2].text
    assert "will ask for 50% of the whole of GPU 0, as CUDA reports it (40.0 GiB)" in cells[2].text


def test_bad_caps_are_said_in_status_and_by_jaxalloc_never_a_crash(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    env = {
        **simgpu_env,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20",
        "CUDA_DEVICE_MEMORY_LIMIT": "100g",
        "CUDA_DEVICE_MEMORY_LIMIT_1": "8.5g",
    }
    cells = run_cells(["%load_ext jax_nbmem", "%jaxmem status", "%jaxalloc", "%jaxalloc auto"],
                      env=env)  # fmt: skip
    assert all(c.error is None for c in cells), [c.text for c in cells]
    status = cells[1].text
    assert "Traceback" not in status and "capped at" not in status
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT='0=20' is not an MPS limit: entry '0=20' has no " in (
        status
    )
    assert "CUDA_DEVICE_MEMORY_LIMIT_1 '8.5g' is not an integer" in status
    assert "CUDA_DEVICE_MEMORY_LIMIT caps CUDA device 0 (GPU 0) at 100 GiB, more than its " in (
        status
    )
    assert "no cap there" in cells[2].text and "is not an MPS limit" in cells[2].text
    assert "auto chose 'on'" in cells[3].text  # no cap read: the card, alone, as without one


def test_fit_is_limited_by_the_cap(simgpu_in_process, monkeypatch):
    simgpu_in_process.gpu(0, 80 * GIB, reserved=0).process(0, os.getpid(), 18 * GIB).write()
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=20G")
    program = ProgramNeeds(
        call="step(x)", platform="gpu", devices=("gpu:0",), argument_bytes=GIB,
        output_bytes=GIB, alias_bytes=0, temp_bytes=GIB, code_bytes=0, peak_bytes=3 * GIB,
        host_bytes=0,
    )  # fmt: skip
    started = effective({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    report = judge(program, read_rooms(program, started=started, stats={"gpu:0": None}))
    room = report.rooms[0]
    # 62 GiB are free on the card, but the cap leaves 2 GiB of its 20 to this process.
    assert room.free_bytes == 62 * GIB and room.memory_cap_bytes == 20 * GIB
    assert room.limit == "cap" and room.room_bytes == 2 * GIB
    assert report.fits is False and report.verdict.startswith("does not fit by 1.00 GiB")
    assert "left under this process's MPS or HAMi cap" in report.verdict
    assert report.advice.startswith("this process's MPS or HAMi cap (20.0 GiB) is the limit")
    assert "(the cap is the limit)" in format_fit(report)


PANEL_HEADER = """\
import jax_nbmem.notebook.magics as magics
session = magics.session_of(get_ipython())
session.watcher.refresh()
live = session._panel_state.live
live._read_session()
live.update()
print(live.header.value)
"""


def test_the_panel_header_shows_the_cap(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    cells = run_cells(
        ["%load_ext jax_nbmem", '%config JaxNbMem.panel = "widget"', "%jaxmem", PANEL_HEADER],
        env={**simgpu_env, **HAMI},
    )
    assert all(c.error is None for c in cells), [c.text for c in cells]
    header = cells[-1].stdout
    assert ">GPU 0: NVIDIA H200 (simulated) · allocator: on (when JAX starts)" in header
    assert "· capped at 20.0 GiB for this kernel (MPS or HAMi)</b>" in header


def test_a_beacons_caps_are_read_and_odd_ones_dropped(tmp_path):
    from jax_nbmem.node.beacons import read_beacons
    from tests.node.test_beacons import UUID, _facts, _write_file

    caps = {UUID: 20 * GIB, "GPU-odd": -1, "GPU-text": "20G", "GPU-zero": 0, "GPU-ok": GIB}
    path = tmp_path / f"jax_nbmem-beacon-{os.getpid()}.json"
    _write_file(path, {**_facts(memory_caps=caps), "written_at": time.time()})
    (beacon,) = read_beacons([str(tmp_path)]).values()
    assert beacon.memory_caps == {UUID: 20 * GIB, "GPU-ok": GIB}
    _write_file(path, {**_facts(memory_caps=["0=20G"]), "written_at": time.time()})
    (beacon,) = read_beacons([str(tmp_path)]).values()
    assert beacon.memory_caps == {}
