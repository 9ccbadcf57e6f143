"""The JupyterLab extension in Debian chromium, on the simulated GPU: a notebook's status-bar
item turns amber when its kernel preallocates on a shared GPU and red when a neighbour's arrival
makes it block others, one notification says so, the sidebar lists both kernels and shuts down
each that blocks, as the notebook panel offers to (issue 49: the same user's blocking kernel of
another server too, through the path `%jaxmem shutdown` takes; never a harmless kernel in its
place), and the item goes back to normal."""

import json
import os
import re
import time

import psutil
import pytest

from jax_nbmem.simgpu import GIB, SimState
from tests.jupyterlab import (
    REPO_ROOT,
    artifacts_dir,
    console_messages,
    open_notebook,
    run_all_cells,
    screenshot,
    wait_kernel_connected,
    write_notebook,
)
from tests.notebook.test_panel_kernel import OTHER_PID
from tests.server.test_extension import kernel_pids
from tests.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.kernel]
pytest_plugins = ("tests.jupyterlab",)

ITEM = ".jax-nbmem-item"


def _model_constant(name: str) -> float:
    """A constant of the item's model (labextension/src/model.ts), in seconds: what it waits."""
    source = (REPO_ROOT / "labextension" / "src" / "model.ts").read_text()
    return int(re.search(rf"export const {name} = (\d+);", source).group(1)) / 1000


REFRESH_S = _model_constant("REFRESH_MS")  # the item's look at the server, with a GPU
NO_GPU_REFRESH_S = _model_constant("NO_GPU_REFRESH_MS")  # and without one
SIDEBAR = "#jax-nbmem-sidebar"
NOTICE = "keeps others off"  # what the blocking notification says
TRAIN = [
    "%load_ext jax_nbmem\n%jaxalloc fraction 0.2",
    "import jax.numpy as jnp\nx = jnp.ones(1024)",
]


def wait_state(page, state: str, timeout_s: float = 60) -> str:
    """Wait until the status-bar item's state is *state*; return its text."""
    page.wait_for_function(
        "([s, state]) => document.querySelector(s)?.dataset.state === state",
        arg=[ITEM, state],
        timeout=timeout_s * 1000,
    )
    return page.locator(ITEM).inner_text()


def notifications(page) -> int:
    """How many of the notification centre's entries tell that a kernel blocks others."""
    return page.evaluate(
        """notice => {
            const toasts = [...document.querySelectorAll('.Toastify__toast')];
            return toasts.filter(t => t.innerText.includes(notice)).length;
        }""",
        NOTICE,
    )


def gib(nbytes: int) -> str:
    """Bytes as the sidebar writes them (the board's rule)."""
    return f"{nbytes / 2**30:.1f} GiB"


@pytest.fixture
def demo(tmp_path, monkeypatch):
    """An 80 GiB simulated GPU, named as such a card is (docs/labext-*.png show its name), with
    another user's 2 GiB process on it."""
    from tests.simgpu.test_mirror import shell_env

    env = shell_env(tmp_path / "sim")
    state = env["JAX_NBMEM_SIMGPU_STATE"]
    gpu = SimState(state).gpu(0, total=80 * GIB, name="NVIDIA H100 80GB HBM3 (simulated)")
    gpu.process(0, OTHER_PID, 2 * GIB).write()
    for name in ("LD_LIBRARY_PATH", "IPYTHONDIR", "JAX_NBMEM_SIMGPU_STATE"):
        monkeypatch.setenv(name, env[name])  # start_tenant's neighbour sees the same GPU
    return {**env, "JAX_PLATFORMS": "cpu"}


@pytest.mark.timeout(420)
def test_amber_then_red_then_shut_down_from_the_sidebar(start_lab_server, lab_page, demo):
    from jax_nbmem.simgpu.simulator import start_tenant

    state = demo["JAX_NBMEM_SIMGPU_STATE"]
    server = start_lab_server(env=demo)
    write_notebook(server.root_dir / "train.ipynb", TRAIN)
    kernel = open_notebook(lab_page, server, "train.ipynb")
    run_all_cells(lab_page, timeout=120)
    text = wait_state(lab_page, "amber")
    shape = r"^GPU 0 \(simulated\): 1\d\.\d GiB · \d+\.\d GiB free · fraction 0\.2( \(starting\))?$"
    assert re.match(shape, text), text
    lab_page.locator(ITEM).screenshot(path=str(artifacts_dir() / "labext-item-amber.png"))

    neighbour, held = start_tenant(state, notebook="hog.ipynb")  # default mode: 75%
    try:
        text = wait_state(lab_page, "red")
        count_status_requests(lab_page)  # two more looks at the server: raised once
        wait_for("two more looks", lambda: status_requests(lab_page) >= 2, timeout=30)
        assert notifications(lab_page) == 1
        lab_page.locator(ITEM).screenshot(path=str(artifacts_dir() / "labext-item-red.png"))
        screenshot(lab_page, "labext-red-and-notification")

        # A click on the item opens the sidebar: both kernels, their notebooks and bytes.
        lab_page.locator(ITEM).click()
        sidebar = lab_page.locator(SIDEBAR)
        sidebar.wait_for(state="visible")
        sim = SimState.read(state)
        train_pid = kernel_pids(server)[kernel["id"]]
        for notebook, owner_pid in (("train.ipynb", train_pid), ("hog.ipynb", neighbour)):
            row = sidebar.locator("li", has_text=notebook)
            row.wait_for()
            assert gib(sim.process_bytes(owner_pid)) in row.inner_text(), row.inner_text()
        assert "blocking-preallocation" in sidebar.inner_text()
        # Both block, both are this user's: each is offered, named by its notebook, as the
        # panel offers them; another user's harmless process is not.
        hog_button = sidebar.get_by_role("button", name=f"Shut down PID {neighbour} (hog.ipynb)")
        hog_button.wait_for(timeout=30_000)
        assert sidebar.get_by_role("button", name=f"Shut down PID {OTHER_PID}").count() == 0
        sidebar.screenshot(path=str(artifacts_dir() / "labext-sidebar.png"))
        screenshot(lab_page, "labext-sidebar-page")  # docs/labext-sidebar.png is a copy of it

        # A reload shows the same state, and tells no second time.
        lab_page.reload(wait_until="domcontentloaded")
        wait_kernel_connected(server, 90, notebook="train.ipynb")
        wait_state(lab_page, "red")
        count_status_requests(lab_page)
        wait_for("two looks after the reload", lambda: status_requests(lab_page) >= 2, timeout=30)
        assert notifications(lab_page) == 0

        lab_page.locator(ITEM).click()
        sidebar.get_by_role("button", name=f"Shut down PID {train_pid}").click()
        confirm = sidebar.get_by_role("button", name=f"Confirm: shut down PID {train_pid}")
        confirm.wait_for()
        assert psutil.pid_exists(train_pid)  # nothing happens before the confirmation
        confirm.click()
        sidebar.get_by_text(f"Shut down kernel PID {train_pid} of this server.").wait_for(
            timeout=30_000
        )
        assert kernel["id"] not in [k["id"] for k in server.api("kernels")]
        text = wait_state(lab_page, "normal")
        assert "train.ipynb" not in sidebar.inner_text()
        screenshot(lab_page, "labext-after-shutdown")
        print(json.dumps({"after_shutdown": text}))

        # The neighbour, a kernel of no server here, still blocks: it goes through the same path.
        hog_button = sidebar.get_by_role("button", name=f"Shut down PID {neighbour} (hog.ipynb)")
        hog_button.wait_for(timeout=30_000)
        hog_button.click()
        sidebar.get_by_role("button", name=f"Confirm: shut down PID {neighbour}").click()
        sidebar.get_by_text(re.compile(rf"kernel PID {neighbour} \(hog\.ipynb\)")).wait_for(
            timeout=30_000
        )
        wait_for("the neighbour to end", lambda: not _running(neighbour), timeout=30)
        screenshot(lab_page, "labext-neighbour-shut-down")
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


def count_status_requests(page) -> None:
    """From now on, count the page's requests to the status route (as the browser times them)."""
    page.evaluate(
        """() => {
            window.jaxNbmemRequests = 0;
            new PerformanceObserver(list => {
                for (const entry of list.getEntries()) {
                    if (entry.name.includes('/jax-nbmem/api/status')) { window.jaxNbmemRequests++; }
                }
            }).observe({ type: 'resource' });
        }"""
    )


def status_requests(page) -> int:
    return page.evaluate("() => window.jaxNbmemRequests")


def set_hidden(page, hidden: bool) -> None:
    """Make the tab hidden (or visible again) as the browser says it when one switches tabs."""
    page.evaluate(
        """hidden => {
            Object.defineProperty(document, 'hidden', { value: hidden, configurable: true });
            Object.defineProperty(document, 'visibilityState',
                { value: hidden ? 'hidden' : 'visible', configurable: true });
            document.dispatchEvent(new Event('visibilitychange'));
        }""",
        hidden,
    )


@pytest.mark.timeout(300)
def test_one_request_every_few_seconds_for_all_notebooks_and_none_while_hidden(
    start_lab_server, lab_page, sim_state, simgpu_env
):
    sim_state.gpu(0, total=80 * GIB).process(0, OTHER_PID, 2 * GIB).write()
    server = start_lab_server(env={**simgpu_env, "JAX_PLATFORMS": "cpu"})
    names = [f"n{index}.ipynb" for index in range(4)]
    for name in names:
        write_notebook(server.root_dir / name, ["x = 1"])
    open_notebook(lab_page, server, names[0])
    for name in names[1:]:  # File > Open from Path…, as a person opens another notebook
        lab_page.get_by_role("menuitem", name="File", exact=True).click()
        lab_page.get_by_role("menuitem", name=re.compile(r"^Open from Path")).click()
        lab_page.locator(".jp-Dialog input").fill(name)
        lab_page.keyboard.press("Enter")
        wait_kernel_connected(server, 90, notebook=name)
    lab_page.locator(".jp-NotebookPanel").nth(len(names) - 1).wait_for(state="attached")
    assert lab_page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").count() >= len(names)
    assert len(server.api("sessions")) == len(names)
    wait_state(lab_page, "normal")

    count_status_requests(lab_page)
    window_s = 15.0
    time.sleep(window_s)
    visible = status_requests(lab_page)
    set_hidden(lab_page, True)
    time.sleep(1.0)  # a request already under way may still finish
    hidden_from = status_requests(lab_page)
    time.sleep(10.0)
    hidden = status_requests(lab_page) - hidden_from
    set_hidden(lab_page, False)
    back = time.monotonic()
    while status_requests(lab_page) == hidden_from + hidden and time.monotonic() < back + 10:
        time.sleep(0.1)
    resumed_s = time.monotonic() - back
    print(
        json.dumps({
            "notebooks": len(names), "window_s": window_s, "requests_visible": visible,
            "requests_hidden_10s": hidden, "resumed_after_s": round(resumed_s, 2),
        })
    )  # fmt: skip
    assert 2 <= visible <= window_s / 3 + 1  # one poll for the tab, every 3 s
    assert hidden == 0
    assert resumed_s < 5


@pytest.mark.timeout(300)
def test_notebook_7_shows_the_item_and_the_sidebar(start_lab_server, lab_page, demo):
    pytest.importorskip("notebook", minversion="7")
    server = start_lab_server(env=demo)
    write_notebook(server.root_dir / "nb7.ipynb", TRAIN)
    lab_page.goto(
        f"{server.base_url}/notebooks/nb7.ipynb?token={server.token}",
        wait_until="domcontentloaded",
    )
    lab_page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=90_000)
    kernel = wait_kernel_connected(server, 90, notebook="nb7.ipynb")
    lab_page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})
    lab_page.get_by_role("menuitem", name="Run", exact=True).click()
    lab_page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
    text = wait_state(lab_page, "amber", timeout_s=120)
    assert "fraction 0.2" in text, text
    lab_page.locator(ITEM).click()
    sidebar = lab_page.locator(SIDEBAR)
    sidebar.wait_for(state="visible")
    pid = kernel_pids(server)[kernel["id"]]
    row = sidebar.locator("li", has_text="nb7.ipynb")
    row.wait_for()
    assert f"kernel PID {pid}" in row.inner_text()
    screenshot(lab_page, "labext-notebook7")


@pytest.mark.timeout(240)
def test_without_the_server_extension_nothing_shows_and_the_console_says_why_once(
    start_lab_server, lab_page, tmp_path
):
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"jax_nbmem.server": False}}})
    )
    server = start_lab_server(env={**os.environ, "JUPYTER_CONFIG_DIR": str(config)})
    write_notebook(server.root_dir / "plain.ipynb", ["x = 1"])
    open_notebook(lab_page, server, "plain.ipynb")
    count_status_requests(lab_page)
    time.sleep(2 * REFRESH_S + 2)  # more than two polls' worth: none may come
    said = [m for m in console_messages(lab_page) if "jax_nbmem" in m]
    assert len(said) == 1 and "not enabled" in said[0], said
    assert status_requests(lab_page) == 0  # it asked once, before the count began, and stopped
    assert lab_page.locator(ITEM).count() == 0 or not lab_page.locator(ITEM).is_visible()
    assert lab_page.locator(SIDEBAR).count() == 0
    assert lab_page.locator(".jp-NotebookPanel .jp-Cell").count() == 1  # the notebook is fine


@pytest.mark.timeout(240)
def test_a_mode_that_will_not_fit_is_red_before_jax_starts(
    start_lab_server, lab_page, sim_state, simgpu_env
):
    sim_state.gpu(0, total=80 * GIB).process(0, OTHER_PID, 50 * GIB).write()
    server = start_lab_server(env={**simgpu_env, "JAX_PLATFORMS": "cpu"})
    write_notebook(server.root_dir / "later.ipynb", ["%load_ext jax_nbmem\n%jaxalloc on"])
    open_notebook(lab_page, server, "later.ipynb")
    run_all_cells(lab_page, timeout=90)
    wait_state(lab_page, "red")
    lab_page.wait_for_function(  # the beacon follows %jaxalloc within a second or two
        "s => document.querySelector(s).innerText.endsWith('· on (JAX not started)')",
        arg=ITEM,
        timeout=30_000,
    )
    title = lab_page.locator(ITEM).get_attribute("title")
    assert "will take 75% of GPU 0" in title and "of 80.0 GiB is free" in title, title
    # The simulated GPU says so here too, as the panel, the sidebar and the board do.
    assert lab_page.locator(ITEM).inner_text().startswith("GPU 0 (simulated): "), title
    assert "GPU 0 is simulated (NVIDIA H200 (simulated))" in title, title
    lab_page.locator(ITEM).screenshot(path=str(artifacts_dir() / "labext-item-will-not-fit.png"))


@pytest.mark.timeout(240)
def test_without_a_gpu_the_item_says_so_and_stays_quiet(
    start_lab_server, lab_page, sim_state, simgpu_env
):
    sim_state.no_driver().write()
    server = start_lab_server(env={**simgpu_env, "JAX_PLATFORMS": "cpu"})
    write_notebook(server.root_dir / "cpu.ipynb", ["x = 1"])
    open_notebook(lab_page, server, "cpu.ipynb")
    assert wait_state(lab_page, "none") == "GPU: none"
    assert "No GPU seen" in lab_page.locator(ITEM).get_attribute("title")
    count_status_requests(lab_page)
    assert NO_GPU_REFRESH_S >= 30  # so the window below, three looks with a GPU, sees none
    time.sleep(3 * REFRESH_S + 1)
    assert status_requests(lab_page) == 0  # it looks again only once a minute


@pytest.mark.timeout(240)
def test_a_mig_instance_is_named_as_the_gpu_it_is(
    start_lab_server, lab_page, sim_state, simgpu_env
):
    big = "MIG-5a1e0000-0000-0000-0000-000000000002"
    sim_state.gpu(0, total=141 * GIB, mig=True)
    sim_state.mig(0, 1, 18 * GIB, name="NVIDIA H200 MIG 1g.18gb")
    sim_state.mig(0, 2, 71 * GIB, uuid=big, name="NVIDIA H200 MIG 3g.71gb")
    sim_state.process(0, OTHER_PID, 30 * GIB, mig=2).write()
    env = {**simgpu_env, "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": big}
    server = start_lab_server(env=env)
    write_notebook(server.root_dir / "mig.ipynb", ["x = 1"])
    open_notebook(lab_page, server, "mig.ipynb")
    wait_kernel_connected(server, 90, notebook="mig.ipynb")
    lab_page.wait_for_function(  # this kernel holds nothing: the item names the instance's room
        "s => document.querySelector(s)?.innerText.startsWith('MIG 3g.71gb instance 2 of GPU 0:')",
        arg=ITEM,
        timeout=60_000,
    )
    assert f"{gib(41 * GIB)} free" in lab_page.locator(ITEM).inner_text()
    lab_page.locator(ITEM).click()
    instance = lab_page.get_by_role("region", name="MIG 3g.71gb instance 2 of GPU 0")
    instance.wait_for(state="visible")
    split = lab_page.get_by_role("region", name="GPU 0", exact=True)
    assert "in MIG mode: its processes are listed under its instances" in split.inner_text()
    assert "kernel PID" not in instance.inner_text() and "30.0 GiB" in instance.inner_text()
    # Nothing measured the pool of the process on it: said as unknown, never a guessed 0.
    assert "(JAX pools: —)" in instance.inner_text(), instance.inner_text()
    assert "JAX pools" not in split.inner_text()  # they are its instances'
    screenshot(lab_page, "labext-mig")
