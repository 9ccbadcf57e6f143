"""The live panel in a real kernel on the simulated GPU: its traces, and updates while a cell runs.

The kernel talks to no frontend here; we read what a frontend would receive (the widget's comm
messages on IOPub) and what the kernel holds (the plot widget's synced parts).
"""

import json
import queue
import subprocess
import sys
import time

import pytest

from jax_nbmem.notebook.panel_text import WIDGET_STAND_IN
from jax_nbmem.simgpu import GIB
from tests.ipython_session import clean_environ
from tests.kernels import execute, running_kernel

pytestmark = pytest.mark.kernel

OTHER_PID = 4242

# Shows the panel the way a user does, and keeps the session at hand for the checks.
SHOW_PANEL_CELL = """\
%load_ext jax_nbmem
%jaxmem
import jax_nbmem.notebook.magics, jax_nbmem.notebook.panel
_jaxmem_session = jax_nbmem.notebook.magics.session_of(get_ipython())
"""

# A cell that takes more and more of the simulated GPU for ~3 s, noting what the figure holds.
GROW_CELL = f"""\
import json, os, time
from jax_nbmem.simgpu import GIB, SimState
_plot = _jaxmem_session._panel_state.live.plot
_mine = [t["name"] for t in _plot.timeline].index("this kernel")
_seen = []
_started = time.monotonic()
for step in range(1, 13):
    state = SimState(os.environ["JAX_NBMEM_SIMGPU_STATE"]).gpu(0, total=80 * GIB)
    state.process(0, {OTHER_PID}, 20 * GIB).process(0, os.getpid(), step * GIB).write()
    time.sleep(0.25)
    _seen.append([_plot.timeline[_mine]["x"][-1], _plot.timeline[_mine]["y"][-1]])
print(json.dumps({{"seen": _seen, "seconds": time.monotonic() - _started}}))
"""


def run_collecting(client, code, timeout=60):
    """Run ``code``; return (its stdout, every comm message sent meanwhile, display bundles)."""
    msg_id = client.execute(code)
    stdout, comm_msgs, displays = [], [], []
    while True:
        try:
            msg = client.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no reply within {timeout}s") from None
        kind, content = msg["msg_type"], msg["content"]
        if kind == "comm_msg":
            comm_msgs.append(content)
        mine = msg["parent_header"].get("msg_id") == msg_id
        if mine and kind == "stream":
            stdout.append(content["text"])
        elif mine and kind == "display_data":
            displays.append(content["data"])
        elif mine and kind == "error":
            raise AssertionError("\n".join(content["traceback"]))
        elif mine and kind == "status" and content["execution_state"] == "idle":
            return "".join(stdout), comm_msgs, displays


@pytest.fixture
def gpu_kernel(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).process(0, OTHER_PID, 20 * GIB).write()
    with running_kernel(env=simgpu_env) as (_, client):
        yield client


def test_panel_shows_the_gpu_and_grows_while_a_cell_runs(gpu_kernel):
    _, _, displays = run_collecting(gpu_kernel, SHOW_PANEL_CELL)
    bundle, snapshot, picture = displays
    assert "application/vnd.jupyter.widget-view+json" in bundle
    # Frontends without widgets get a line instead of a traceback; it holds no figures of its
    # own, which would be stale in a saved notebook above the snapshot (issue 49), and no HTML.
    assert bundle["text/plain"] == WIDGET_STAND_IN and "text/html" not in bundle
    assert "GiB" not in bundle["text/plain"] and "the snapshot below" in bundle["text/plain"]
    assert "GPU 0: NVIDIA H200 (simulated)" in snapshot["text/html"]
    assert "allocator: on (when JAX starts)" in snapshot["text/html"]

    # Under the widget, its snapshot: what an export or a frontend without the widget shows.
    # Its words, then its picture as an image output: SVG, and a PNG for sanitising viewers.
    assert "jax-nbmem-snapshot" in snapshot["text/html"] and "<svg" not in snapshot["text/html"]
    assert picture["image/svg+xml"].startswith("<svg") and picture["image/png"]

    names, _ = execute(
        gpu_kernel,
        "live = _jaxmem_session._panel_state.live\n"
        "print(live.plot.model_id, [t['name'] for t in live.plot.timeline if t['visible']])",
    )
    plot_id, shown = names.split(" ", 1)
    for name in ("this kernel", "other processes", "device total"):
        assert name in shown
    assert "process RSS" not in shown  # a GPU is seen: no host fallback

    out, comm_msgs, _ = run_collecting(gpu_kernel, GROW_CELL)
    report = json.loads(out)
    # The trace reaches further in time as the cell runs. (Its number of points need not
    # grow: once the window holds more samples than it draws, they are binned.)
    ends = [end for end, _ in report["seen"]]
    assert ends == sorted(ends) and ends[-1] > ends[0], ends
    assert report["seen"][-1][1] >= 10.0  # GiB: the cell's last steps reached the figure

    # Updates are ordinary state: what a view made now (or after a reload) reads.
    states = [m["data"]["state"] for m in comm_msgs if m["comm_id"] == plot_id]
    timelines = [state["timeline"] for state in states if "timeline" in state]
    assert len(timelines) >= 3, f"only {len(timelines)} timeline updates while the cell ran"
    # The throttle: at most four updates a second (plus the one a cell's end may add).
    assert len(timelines) <= 4 * report["seconds"] + 2
    lengths = [len(timeline[0]["x"]) for timeline in timelines]  # "this kernel" is first
    assert lengths[-1] > lengths[0], lengths
    for state in states:  # every message within the budget of one update
        assert len(json.dumps(state)) <= 32 * 1024, {
            k: len(json.dumps(v)) for k, v in state.items()
        }


def test_showing_the_panel_twice_keeps_one_live_panel(gpu_kernel):
    run_collecting(gpu_kernel, SHOW_PANEL_CELL)
    out, _ = execute(
        gpu_kernel,
        "import threading\n"
        "first = _jaxmem_session._panel_state.live\n"
        "jax_nbmem.notebook.panel.show_panel(_jaxmem_session)\n"
        "second = _jaxmem_session._panel_state.live\n"
        "threads = [t for t in threading.enumerate() if t.name == 'jax_nbmem-panel']\n"
        "print('RESULT', first is second, len(threads), len(_jaxmem_session.sampler._callbacks))",
    )
    assert out[out.index("RESULT") :].split()[:4] == ["RESULT", "True", "1", "1"]
    out, _ = execute(
        gpu_kernel,
        "jax_nbmem.notebook.panel.close_panels(_jaxmem_session)\n"
        "print(first.alive, len(_jaxmem_session.sampler._callbacks))",
    )
    assert out.split() == ["False", "0"]


@pytest.mark.parametrize("kind", ["static", "text"])
def test_fallbacks_refresh_after_each_cell(gpu_kernel, kind):
    setup = f"%config JaxNbMem.panel = {kind!r}\n" + SHOW_PANEL_CELL
    _, _, displays = run_collecting(gpu_kernel, setup)
    (bundle,) = displays
    assert "application/vnd.jupyter.widget-view+json" not in bundle
    # No plotly figure: JupyterLab's plotly renderer would keep its first drawing on update.
    assert "application/vnd.plotly.v1+json" not in bundle
    assert ("<svg" in bundle["text/html"]) == (kind == "static")
    assert "Redrawn after each cell, not live." in bundle["text/plain"]
    assert "GPU 0: NVIDIA H200 (simulated)" in bundle["text/plain"]

    msg_id = gpu_kernel.execute("x = sum(range(1000))")
    refreshed = None
    while refreshed is None:
        msg = gpu_kernel.get_iopub_msg(timeout=30)
        if msg["msg_type"] == "update_display_data":
            refreshed = msg["content"]["data"]
        assert not (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
            and refreshed is None
        ), "no refresh of the panel after the cell"
    assert "x = sum(range(1000))" in refreshed["text/plain"]  # the new cell's row


# A neighbour as NVML and /proc see it: a process whose JAX runs in its default mode (so its
# 60 GiB are its preallocated pool), naming a notebook; it waits until it is killed.
NEIGHBOUR = "import jax, sys, time; print('ready', flush=True); time.sleep(600)"
PREALLOCATED = 60 * GIB + (300 << 20)  # 75% of 80 GiB plus its CUDA context


def follow_state(client, synced, done, timeout=45):
    """Read IOPub, with no cell run, until ``done(synced)`` holds; returns ``synced``.

    ``synced`` maps each widget's id to its state as a frontend would hold it: the comm
    messages (openings and updates) sent since, merged in order.
    """
    deadline = time.monotonic() + timeout
    while not done(synced):
        try:
            msg = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"not within {timeout}s; last seen: {synced}") from None
        assert msg["msg_type"] != "execute_input", "a cell ran: the test must not run one"
        if msg["msg_type"] in ("comm_open", "comm_msg"):
            content = msg["content"]
            state = content.get("data", {}).get("state", {})
            synced.setdefault(content["comm_id"], {}).update(state)
    return synced


def test_the_banner_follows_the_watcher_while_no_cell_runs(sim_state, simgpu_env):
    """The warnings, their names and their buttons follow the GPU while the kernel is idle."""
    sim_state.gpu(0, total=80 * GIB).write()
    neighbour = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR],
        env={**simgpu_env, **clean_environ(), "JPY_SESSION_NAME": "/home/ada/neighbour.ipynb"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert neighbour.stdout.readline().strip() == "ready"
        with running_kernel(env=simgpu_env) as (_, client):
            ids, _ = execute(
                client,
                "%config JaxNbMem.status_interval = 0.5\n"
                + SHOW_PANEL_CELL
                + "_live = _jaxmem_session._panel_state.live\n"
                "print('IDS', _live.banner.model_id, _live.actions.rows.model_id)",
            )
            banner_id, rows_id = ids[ids.index("IDS") :].split()[1:3]

            def banner(synced):
                return synced.get(banner_id, {}).get("value", "")

            def buttons(synced):
                rows = synced.get(rows_id, {}).get("children", [])
                ids = [row.removeprefix("IPY_MODEL_") for row in rows]
                return [synced.get(i, {}).get("description") for i in ids]

            # A neighbour appears while no cell runs: the banner names it, with its button.
            sim_state.gpu(0, total=80 * GIB).process(0, neighbour.pid, PREALLOCATED).write()
            named = f"PID {neighbour.pid} (notebook /home/ada/neighbour.ipynb"
            button = f"Shut down PID {neighbour.pid} (neighbour.ipynb)"
            synced = follow_state(client, {}, lambda s: named in banner(s) and buttons(s))
            assert "blocking-preallocation" in banner(synced)
            synced = follow_state(client, synced, lambda s: buttons(s) == [button])

            # It goes: the warning and its button go too, still without a cell.
            neighbour.kill()
            neighbour.wait()
            sim_state.gpu(0, total=80 * GIB).write()
            follow_state(
                client,
                synced,
                lambda s: "blocking" not in banner(s) and buttons(s) == [],
            )
            # The notes apart from the warnings' box say, all along, that the panel is live.
            shown, _ = execute(client, "print(_live.notes.value)")
            assert "Live: sampling every 100 ms." in shown
    finally:
        neighbour.kill()
        neighbour.wait()
