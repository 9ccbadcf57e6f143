"""Every cell reaches the panel in a kernel whose comms drop what other threads send (Colab's way).

Colab does not show widget updates sent from a background thread (googlecolab/colabtools
#3373). The stand-in here is a real ipykernel whose comm publishing is patched, in its first
cell, to drop every comm message sent from a thread other than the main one, as that frontend
does; the panel's own thread keeps trying (its drops are counted). We read IOPub as a frontend
would and merge the comm messages that arrive into each widget's state.

What the stand-in cannot show is Colab's other habit (colabtools#498: comm messages from later
cells do not reach views made earlier). There the panel does not use comms: ``auto`` picks the
static picture, whose output each cell replaces through its display id (``update_display``)
while it runs; the second test checks exactly those messages, parented to each cell.
"""

import json
import queue
import time

import pytest

from jax_nbmem.simgpu import GIB, SimState
from tests.kernels import running_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(240)]

# Drops comm messages sent from threads other than the main one, and counts them.
DROP_THREAD_SENDS = """\
import threading
import ipykernel.comm.comm as _kernel_comm
_dropped_sends = []
_publish = _kernel_comm.BaseComm.publish_msg

def _main_thread_only(self, msg_type, *args, **kwargs):
    if threading.current_thread() is not threading.main_thread():
        _dropped_sends.append(msg_type)
        return None
    return _publish(self, msg_type, *args, **kwargs)

_kernel_comm.BaseComm.publish_msg = _main_thread_only
"""

# What `google.colab` being imported looks like to jax_nbmem (its frontend() test).
LOOK_LIKE_COLAB = (
    "import sys, types\nsys.modules['google.colab'] = types.ModuleType('google.colab')\n"
)

SHOW = """\
%load_ext jax_nbmem
%jaxmem
import jax_nbmem.notebook.magics
_live = jax_nbmem.notebook.magics.session_of(get_ipython())._panel_state.live
"""

IDS = "print('IDS', _live.plot.model_id, _live.header.model_id, _live.notes.model_id)"


def grow_cell(mark: int, thread_tries: bool = True) -> str:
    """A cell that takes *mark* GiB of the simulated GPU and ends once the sampler saw it.

    *thread_tries*: it also waits until the panel's thread has tried to send (and been
    dropped) meanwhile, so the cell's news reached the frontend only if the main thread sent.
    """
    return (
        f"_mark_{mark} = {mark}\n"
        "import os, time\n"
        "from jax_nbmem.simgpu import SimState\n"
        "from jax_nbmem.notebook.magics import session_of\n"
        "SimState(os.environ['JAX_NBMEM_SIMGPU_STATE']).gpu(0, total=80 * 2**30)"
        f".process(0, os.getpid(), {mark} * 2**30).write()\n"
        "_sampler = session_of(get_ipython()).sampler\n"
        f"while (_sampler.latest().gpu(0).self_bytes or 0) < {mark} * 2**30:\n"
        "    time.sleep(0.05)\n"
        + (
            "_tried = len(_dropped_sends)\n"
            "while len(_dropped_sends) == _tried:\n"
            "    time.sleep(0.05)\n"
            if thread_tries
            else ""
        )
    )


def kernel_gib(plot: dict) -> float:
    """The top of the timeline's "this kernel" line, in GiB, in a plot's synced state."""
    unit = plot["plot_layout"]["yaxis"]["title"]["text"].rsplit(" ", 1)[-1]
    mine = next(t for t in plot["timeline"] if t["name"] == "this kernel")
    return max(y or 0 for y in mine["y"]) * {"GiB": 1, "MiB": 1 / 1024}[unit]


class Frontend:
    """IOPub read as a frontend reads it: each widget's state, merged from what arrived."""

    def __init__(self, client) -> None:
        self.client = client
        self.state: dict[str, dict] = {}
        self.displays: list[dict] = []  # update_display_data messages: parent and data
        self.idle: set[str] = set()  # the requests the kernel has finished
        self.printed: dict[str, str] = {}  # what each request printed

    def read(self, timeout: float) -> None:
        try:
            msg = self.client.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle":
            self.idle.add(msg["parent_header"].get("msg_id"))
        elif kind == "error":
            raise AssertionError("\n".join(content["traceback"]))
        elif kind == "stream":
            parent = msg["parent_header"].get("msg_id")
            self.printed[parent] = self.printed.get(parent, "") + content["text"]
        elif kind in ("comm_open", "comm_msg"):
            update = content.get("data", {}).get("state", {})
            self.state.setdefault(content["comm_id"], {}).update(update)
        elif kind == "update_display_data":
            parent = msg["parent_header"].get("msg_id")
            self.displays.append({"parent": parent, "data": content["data"]})

    def run(self, code: str) -> str:
        """Run *code*, reading IOPub until the kernel is idle again; its msg_id.

        Nothing read meanwhile is dropped: comm messages of earlier cells land in the state.
        """
        msg_id = self.client.execute(code)

        def finished():
            """The kernel went idle after the cell."""
            return msg_id in self.idle

        self.until(finished, timeout=60)
        return msg_id

    def until(self, check, timeout: float = 30.0):
        """Read IOPub until ``check()`` holds (returns it), or fail after *timeout*."""
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"not within {timeout:g} s: {check.__doc__}")
            self.read(min(left, 0.2))

    def words(self, code: str) -> list[str]:
        """Run *code*; the words it printed."""
        return self.printed.get(self.run(code), "").split()


def test_every_cell_reaches_the_widget_when_thread_sends_are_dropped(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    with running_kernel(env=simgpu_env) as (_, client):
        frontend = Frontend(client)
        frontend.run(DROP_THREAD_SENDS)
        frontend.run(SHOW)
        words = frontend.words(IDS)
        plot_id, header_id, notes_id = words[words.index("IDS") + 1 :][:3]

        for mark in (1, 2, 3):
            frontend.run(grow_cell(mark))

            def shown(mark=mark):
                """The cell's tick in the plot, and its memory on the timeline."""
                plot = frontend.state.get(plot_id, {})
                return f"_mark_{mark} = {mark}" in json.dumps(plot.get("cells")) and (
                    kernel_gib(plot) >= mark - 0.01
                )

            frontend.until(shown)

        dropped = frontend.words("print(len(_dropped_sends))")
        assert int(dropped[-1]) > 0, "the panel's thread sent nothing: the stand-in was not tested"
        notes = frontend.state[notes_id]["value"]
        assert "Live: sampling every 100 ms." in notes
        assert "free" in frontend.state[header_id]["value"]

        # Not live: the same widget, no thread, updated from the main thread after each cell.
        frontend.run("%jaxmem panel cells")
        frontend.run(grow_cell(4, thread_tries=False))

        def not_live():
            """The notes say the panel follows cells, and cell 4 is in the plot."""
            value = frontend.state.get(notes_id, {}).get("value", "")
            cells = json.dumps(frontend.state.get(plot_id, {}).get("cells", []))
            return "Updated after each cell, not live" in value and "_mark_4 = 4" in cells

        frontend.until(not_live)
        assert "Live" not in frontend.state[notes_id]["value"]
        threads = frontend.words(
            "import threading\n"
            "print(sum(t.name == 'jax_nbmem-panel' for t in threading.enumerate()), _live.alive)",
        )
        assert threads[-2:] == ["0", "False"]


def test_between_cells_a_view_s_ping_brings_what_the_thread_could_not_send(sim_state, simgpu_env):
    """Issue 49: the view keeps its own clock and pings; the kernel answers on its main thread.

    A neighbour ends while the notebook sits idle: the panel's thread sees it, its sends are
    dropped, and no cell runs to send it from the main thread. The view's ping (a comm message,
    handled between cells on the main thread here, as in Colab) brings it, and a pong.
    """
    sim_state.gpu(0, total=80 * GIB).process(0, 4242, 20 * GIB).write()
    with running_kernel(env=simgpu_env) as (_, client):
        frontend = Frontend(client)
        frontend.run(DROP_THREAD_SENDS)
        frontend.run(SHOW)
        words = frontend.words(IDS)
        plot_id, notes_id = words[words.index("IDS") + 1], words[words.index("IDS") + 3]
        plot = frontend.state[plot_id]
        assert plot["live"] is True and plot["update_interval_s"] == 0.25
        assert "<span class='jax-nbmem-live'>Live: sampling" in frontend.state[notes_id]["value"]

        def others_gib() -> float:
            state = frontend.state[plot_id]
            others = next(t for t in state["timeline"] if t["name"] == "other processes")
            return others["y"][-1]

        assert others_gib() == 20
        SimState(sim_state.path).gpu(0, total=80 * GIB).write()  # the neighbour ends
        dropped_before = int(frontend.words("print(len(_dropped_sends))")[-1])
        time.sleep(1.5)  # the thread sees it and sends: dropped
        pongs: list = []
        original_read = frontend.read

        def read(timeout: float) -> None:
            try:
                msg = client.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                return
            data = msg["content"].get("data", {}) if msg["msg_type"] == "comm_msg" else {}
            if data.get("method") == "custom" and data["content"].get("event") == "pong":
                pongs.append(data["content"])
            update = data.get("state", {})
            frontend.state.setdefault(msg["content"].get("comm_id"), {}).update(update)

        frontend.read = read
        ping = {"method": "custom", "content": {"event": "ping", "id": 7}}
        client.shell_channel.send(
            client.session.msg("comm_msg", {"comm_id": plot_id, "data": ping})
        )

        def answered():
            """A pong for ping 7, and the plot without the neighbour."""
            return pongs and others_gib() == 0

        frontend.until(answered, timeout=30)
        assert pongs == [{"event": "pong", "id": 7}]
        frontend.read = original_read
        assert int(frontend.words("print(len(_dropped_sends))")[-1]) > dropped_before

        # A panel that follows cells only tells its views not to expect updates between them.
        frontend.run("%jaxmem panel cells")
        assert frontend.state[plot_id]["live"] is False


def test_in_colab_each_cell_replaces_the_panel_by_its_display_id(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    with running_kernel(env=simgpu_env) as (_, client):
        frontend = Frontend(client)
        frontend.run(DROP_THREAD_SENDS + LOOK_LIKE_COLAB)
        frontend.run("%load_ext jax_nbmem\n%jaxmem")
        assert not frontend.state, "a widget was opened where comms do not reach earlier views"
        for mark in (1, 2):
            msg_id = frontend.run(grow_cell(mark, thread_tries=False))
            # Sent while the cell ran (its parent), not from a thread after it.
            mine = [d["data"] for d in frontend.displays if d["parent"] == msg_id]
            assert len(mine) == 1, frontend.displays
            (data,) = mine
            assert f"_mark_{mark} = {mark}" in data["text/plain"]  # the cell's row
            assert "Redrawn after each cell, not live." in data["text/plain"]
            assert "Live" not in data["text/plain"]
            # A picture that every renderer redraws when replaced; no plotly figure, which
            # JupyterLab would keep as first drawn.
            assert "<svg" in data["text/html"] and f"after cell [{mark + 2}]" in data["text/html"]
            assert "application/vnd.plotly.v1+json" not in data
