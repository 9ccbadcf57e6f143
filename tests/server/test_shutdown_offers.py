"""Issue 49: the server says which kernel the sidebar may shut down: the panel's offer.

The quickstart's story, through the extension's API: this server's harmless kernel (684 MiB,
no pool) and the same user's idle neighbour of another server, whose JAX preallocated 75% and
blocks the GPU. The sidebar once offered to shut down the harmless one and not the blocker.
Now the status marks each process a blocking warning names with its ``shutdown_offer`` (the dry
run of ``%jaxmem shutdown``'s path, or why not), and the new route acts on that offer only.
"""

import psutil
import pytest

from jax_nbmem.simgpu import GIB, SimState
from tests.notebook.test_panel_kernel import OTHER_PID
from tests.server.test_extension import call, kernel_pids, start_session
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel
pytest_plugins = ("tests.jupyterlab",)

MIB = 1 << 20


@pytest.fixture
def quickstart_gpu(tmp_path, monkeypatch):
    """An 80 GiB simulated GPU with another user's 2 GiB process, and kernels mirrored on it."""
    from tests.simgpu.test_mirror import shell_env

    env = shell_env(tmp_path / "sim")
    SimState(env["JAX_NBMEM_SIMGPU_STATE"]).gpu(0, total=80 * GIB).process(
        0, OTHER_PID, 2 * GIB
    ).write()
    for name in ("LD_LIBRARY_PATH", "IPYTHONDIR", "JAX_NBMEM_SIMGPU_STATE"):
        monkeypatch.setenv(name, env[name])  # start_tenant's neighbour sees the same GPU
    return {**env, "JAX_PLATFORMS": "cpu"}


def processes(server) -> dict[int, dict]:
    status, report = call(server, "jax-nbmem/api/status")
    return {p["pid"]: p for p in report.get("processes", [])} if status == 200 else {}


@pytest.mark.timeout(300)
def test_the_blocking_kernel_is_offered_never_the_harmless_one(start_lab_server, quickstart_gpu):
    from jax_nbmem.simgpu.simulator import start_tenant

    state = quickstart_gpu["JAX_NBMEM_SIMGPU_STATE"]
    server = start_lab_server(env=quickstart_gpu)
    session = start_session(server, "quickstart.ipynb")
    kernel_id = session["kernel"]["id"]
    mine = wait_for("the quickstart kernel's PID", lambda: kernel_pids(server).get(kernel_id))
    with SimState.update(state) as current:
        current.process(0, mine, 684 * MIB)
    neighbour, held = start_tenant(state, notebook="neighbour.ipynb")  # JAX's default: 75%
    try:
        seen = wait_for(
            "the neighbour's offer",
            lambda: (p := processes(server)).get(neighbour, {}).get("shutdown_offer") and p,
            timeout=90,
        )
        offer = seen[neighbour]["shutdown_offer"]
        assert offer["offered"] is True and offer["how"] in ("server", "signal"), offer
        assert offer["why"].startswith(f"Would shut down kernel PID {neighbour}"), offer
        assert "neighbour.ipynb" in offer["why"]
        # The harmless kernel of this very server, and another user's process: no offer.
        assert seen[mine]["shutdown_offer"] is None
        assert seen[OTHER_PID]["shutdown_offer"] is None
        status, answer = call(server, f"jax-nbmem/api/processes/{mine}/shutdown", "POST", {})
        assert status == 404 and "no warning names" in answer["message"], answer
        assert psutil.pid_exists(mine)
        assert call(server, "jax-nbmem/api/processes/1/shutdown", "POST", {}, token=False)[0] == 403

        status, answer = call(server, f"jax-nbmem/api/processes/{neighbour}/shutdown", "POST", {})
        assert status == 200, answer
        assert answer["done"] is True and answer["pid"] == neighbour, answer
        assert f"kernel PID {neighbour} (neighbour.ipynb)" in answer["message"], answer
        wait_for("the neighbour to end", lambda: not _running(neighbour), timeout=30)
        assert psutil.pid_exists(mine) and kernel_id in {
            k["id"] for k in call(server, "api/kernels")[1]
        }
    finally:
        try:
            psutil.Process(neighbour).kill()
        except psutil.Error:
            pass


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
