"""The GPU board in Debian chromium: GPUs, kernels, a warning, and a shutdown that asks first."""

import re
import time

import psutil
import pytest
from jupyter_client import BlockingKernelClient

from jax_nbmem.simgpu import GIB, SimState
from tests.jupyterlab import screenshot
from tests.server.test_extension import call, kernel_pids, start_session, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.kernel]
pytest_plugins = ("tests.jupyterlab",)


def run_in_kernel(server, kernel_id: str, code: str) -> None:
    """Run *code* in one of the server's kernels, through its connection file."""
    connection = str(server.log_path.parent / "runtime" / f"kernel-{kernel_id}.json")
    deadline = time.monotonic() + 90
    while True:  # a kernel still importing misses heartbeats, and clients call it dead
        client = BlockingKernelClient(connection_file=connection)
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=30)
            break
        except RuntimeError:
            client.stop_channels()
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    try:
        reply = client.execute_interactive(code, timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()


@pytest.mark.timeout(240)
def test_the_board_shows_the_gpu_and_shuts_a_blocking_kernel_down_after_asking(
    start_lab_server, lab_page, sim_state, simgpu_env
):
    sim_state.gpu(0, total=80 * GIB).write()
    server = start_lab_server(env={**simgpu_env, "JAX_PLATFORMS": "cpu"})
    hog = start_session(server, "hog.ipynb")["kernel"]["id"]
    start_session(server, "other.ipynb")
    run_in_kernel(server, hog, "import jax.numpy as jnp\njnp.ones(1).block_until_ready()")
    pid = wait_for("the kernel's PID", lambda: kernel_pids(server).get(hog))
    # What a preallocating JAX kernel holds on an 80 GiB card: 75% plus its CUDA context.
    SimState(sim_state.path).gpu(0, total=80 * GIB).process(0, pid, 60 * GIB + (300 << 20)).write()

    def warned():
        report = call(server, "jax-nbmem/api/status")[1]
        return any(w["kind"] == "blocking-preallocation" for w in report.get("warnings", []))

    wait_for("the blocking warning", warned)

    lab_page.goto(f"{server.base_url}/jax-nbmem/?token={server.token}")
    gpu = lab_page.get_by_role("region", name="GPU 0")
    gpu.wait_for(timeout=30_000)
    assert "NVIDIA H200 (simulated)" in gpu.get_by_role("heading").inner_text()
    row = gpu.get_by_role("row").filter(has_text="hog.ipynb")
    row.wait_for(timeout=30_000)
    assert str(pid) in row.inner_text() and "60.3 GiB" in row.inner_text()
    warning = lab_page.get_by_role("alert").filter(has_text="blocking-preallocation")
    assert warning.is_visible() and "hog.ipynb" in warning.inner_text()
    lab_page.wait_for_function("() => document.querySelector('.gpu svg path') !== null")
    screenshot(lab_page, "board-blocking-kernel")

    lab_page.get_by_role("button", name=f"Shut down PID {pid}").click()
    confirm = lab_page.get_by_role("button", name=f"Confirm: shut down PID {pid}")
    confirm.wait_for()
    time.sleep(2.5)  # a refresh or two later, the question is still there, and nothing happened
    assert confirm.is_visible() and psutil.pid_exists(pid)
    assert hog in {k["id"] for k in call(server, "api/kernels")[1]}
    confirm.click()
    lab_page.get_by_role("status").filter(
        has_text=re.compile(rf"Stopped kernel PID {pid}")
    ).wait_for(timeout=30_000)
    assert hog not in {k["id"] for k in call(server, "api/kernels")[1]}
    SimState(sim_state.path).gpu(0, total=80 * GIB).write()  # its memory is back
    lab_page.get_by_role("alert").filter(has_text="blocking-preallocation").wait_for(
        state="detached", timeout=30_000
    )
    screenshot(lab_page, "board-after-shutdown")


@pytest.mark.timeout(180)
def test_the_board_shows_each_mig_instance_as_a_gpu_under_the_gpu_it_splits(
    start_lab_server, lab_page, sim_state, simgpu_env, sleeper
):
    sim_state.gpu(0, total=141 * GIB, mig=True).gpu(1, total=141 * GIB)
    sim_state.mig(0, 1, 18 * GIB, name="NVIDIA H200 MIG 1g.18gb")
    sim_state.mig(0, 2, 71 * GIB, name="NVIDIA H200 MIG 3g.71gb")
    sim_state.process(0, sleeper, 30 * GIB, mig=2).write()
    server = start_lab_server(env={**simgpu_env, "JAX_PLATFORMS": "cpu"})
    lab_page.goto(f"{server.base_url}/jax-nbmem/?token={server.token}")
    big = lab_page.get_by_role("region", name="MIG 3g.71gb instance 2 of GPU 0")
    big.wait_for(timeout=30_000)
    heading = big.get_by_role("heading").inner_text()
    assert "NVIDIA H200 MIG 3g.71gb" in heading and "of 71.0 GiB" in heading
    assert str(sleeper) in big.get_by_role("row").filter(has_text="30.0 GiB").inner_text()
    split = lab_page.get_by_role("region", name="GPU 0", exact=True)
    assert "in MIG mode" in split.inner_text() and "no processes" not in split.inner_text()
    names = [s.get_attribute("aria-label") for s in lab_page.locator("section.gpu").all()]
    assert names == [
        "GPU 0", "MIG 1g.18gb instance 1 of GPU 0", "MIG 3g.71gb instance 2 of GPU 0", "GPU 1",
    ]  # fmt: skip
    screenshot(lab_page, "board-mig")
