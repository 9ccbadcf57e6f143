"""Issue 22, end to end through a real JupyterHub's proxy: two users on one simulated GPU.

Alice's idle kernels preallocate; bob's kernel is warned by her beacon, naming her; bob's
board (Chromium, logged in with his cookie) shows her kernels without a shut-down button and
keeps refreshing (XSRF on every fetch); hers offers the button and it works; requests without
a login or with bob's token are refused; root's ``jax-nbmem shutdown`` stops her kernel
through her server and logs it, and refuses what it cannot do; the culler in dry-run names
her idle blocking kernel and not her busy one, then warns it (its own status says so), lets
it go when it runs a cell, and culls it through her server after a warning, counted.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from jax_nbmem.simgpu import GIB, SimState
from tests.hub.conftest import PASSWORD, Hub, HubUser, request
from tests.jupyterlab import chromium_page, screenshot
from tests.kernels import execute, ready_client
from tests.waiting import wait_for

pytestmark = [pytest.mark.kernel, pytest.mark.browser]

POOL = 60 * GIB + (300 << 20)  # what a preallocating JAX holds on an 80 GiB card
LATE_POOL = int(0.75 * 80 * GIB * 0.9**13) + (300 << 20)  # a pool taken when the GPU was full
START_JAX = "%load_ext jax_nbmem\nimport jax.numpy as jnp\njnp.ones(1).block_until_ready()"


class Kernel:
    """A kernel of one of the hub's users, started through the proxy, driven over ZMQ."""

    def __init__(self, hub: Hub, user: HubUser, notebook: str, server: str = "") -> None:
        """``server``: the name of one of the user's named servers ("" the default)."""
        status, session = hub.server(
            user, "POST", f"{server}/api/sessions" if server else "api/sessions",
            {"path": notebook, "type": "notebook", "kernel": {"name": "python3"}},
        )  # fmt: skip
        assert status == 201, (status, session)
        self.user, self.notebook = user, notebook
        self.id = session["kernel"]["id"]
        connection = user.runtime_dir() / f"kernel-{self.id}.json"
        wait_for("its connection file", connection.exists, 60)
        self.pid = wait_for("its process", lambda: _pid_of(self.id), 30)
        self.client = ready_client(str(connection), lambda: psutil.pid_exists(self.pid), 90)

    def run(self, code: str, timeout: float = 90) -> str:
        out, error = execute(self.client, code, timeout)
        assert error is None, out
        return out

    def status(self) -> dict:
        code = "import json, jax_nbmem\nprint(json.dumps(dict(jax_nbmem.status()), default=str))"
        return json.loads(self.run(code).strip().splitlines()[-1])

    def close(self) -> None:
        self.client.stop_channels()


def _pid_of(kernel_id: str) -> int | None:
    for process in psutil.process_iter(["cmdline"]):
        if any(f"kernel-{kernel_id}.json" in arg for arg in process.info["cmdline"] or ()):
            return process.pid
    return None


def _on_gpu(hub: Hub, *held: tuple[Kernel, int]) -> None:
    state = SimState(hub.state_path).gpu(0, total=80 * GIB)
    for kernel, size in held:
        state.process(0, kernel.pid, size, ends_with_process=True)
    state.write()


def _jax_nbmem(hub: Hub, *args: str, token: str | None = None, timeout: float = 60):
    env = dict(hub.env)
    env.pop("JUPYTERHUB_API_TOKEN", None)
    if token:
        env["JUPYTERHUB_API_TOKEN"] = token
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def _login(page, hub: Hub, user: HubUser) -> None:
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", user.name)
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url(re.compile(rf"/user/{user.name}/"), timeout=60_000)


def _board(page, hub: Hub, user: HubUser) -> list:
    """Open ``user``'s board; returns the list the API answers seen are appended to."""
    answers: list = []

    def seen(reply):
        if "/jax-nbmem/api/" in reply.url:
            answers.append((reply.url.rsplit("/", 1)[1], reply.status))

    page.on("response", seen)
    page.goto(f"{hub.url}/user/{user.name}/jax-nbmem/")
    page.get_by_role("region", name="GPU 0").wait_for(timeout=60_000)
    return answers


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.timeout(420)
def test_two_users_on_one_gpu_behind_the_hub(hub, tmp_path):
    alice, bob = hub.alice, hub.bob
    admin_log = hub.folder / "admin.log"
    hog = Kernel(hub, alice, "hog.ipynb")
    hog.run(START_JAX)
    mine = Kernel(hub, bob, "mine.ipynb")
    mine.run("%load_ext jax_nbmem\n%jaxalloc off")
    _on_gpu(hub, (hog, POOL))

    # Bob's kernel is warned about alice's, by her beacon, naming her.
    def warned(kernel, pid):
        report = kernel.status()
        found = [w for w in report["warnings"] if w["kind"] == "blocking-preallocation"]
        seen = [p for p in report["processes"] if p["pid"] == pid]
        return found and seen and (found, seen[0])

    (warning, *_), seen = wait_for("bob warned of alice's kernel", lambda: warned(mine, hog.pid))
    assert (seen["source"], seen["hub_user"], seen["user"]) == ("beacon", alice.name, alice.name)
    assert warning["pid"] == hog.pid and f"user {alice.name}" in warning["message"]
    assert f"Ask its owner ({alice.name})" in warning["message"]
    assert f"jax-nbmem shutdown {hog.pid} --yes" in warning["message"]
    refused = mine.run(f"%jaxmem shutdown {hog.pid}")
    assert f"belongs to user {alice.name}" in refused and psutil.pid_exists(hog.pid)

    # Unauthenticated and cross-user requests are refused.
    status_path = f"{hub.url}/user/{alice.name}/jax-nbmem/api/status"
    assert request(status_path)[0] == 403
    status, bob_token = hub.api("POST", f"users/{bob.name}/tokens", {"note": "test"})
    assert status in (200, 201), bob_token
    assert request(status_path, token=bob_token["token"])[0] == 403
    assert (
        request(f"{hub.url}/user/{bob.name}/jax-nbmem/api/status", token=bob_token["token"])[0]
        == 200
    )

    # Bob's board through the proxy, with his login cookie: alice's kernel, no button.
    with chromium_page(tmp_path / "bob") as page:
        page.goto(f"{hub.url}/user/{alice.name}/jax-nbmem/")  # not logged in: the hub's login
        assert "/hub/login" in page.url
        _login(page, hub, bob)
        answers = _board(page, hub, bob)
        row = page.get_by_role("row").filter(has_text=str(hog.pid))
        row.wait_for(timeout=30_000)
        assert alice.name in row.inner_text() and "60.3 GiB" in row.inner_text()
        assert row.get_by_role("button").count() == 0
        # Two refreshes more (Playwright hands the page's events over while it is called).
        wait_for("two more refreshes", lambda: page.evaluate("0") == 0 and len(answers) >= 6, 30)
        assert page.locator("#problem").inner_text() == ""
        assert len(answers) >= 6 and all(code == 200 for _, code in answers), answers
        screenshot(page, "hub-board-bob")

    # Alice's board offers the button for her blocking kernel, and it works.
    with chromium_page(tmp_path / "alice") as page:
        _login(page, hub, alice)
        _board(page, hub, alice)
        page.get_by_role("button", name=f"Shut down PID {hog.pid}").click(timeout=30_000)
        page.get_by_role("button", name=f"Confirm: shut down PID {hog.pid}").click()
        page.get_by_role("status").filter(has_text=f"Stopped kernel PID {hog.pid}").wait_for(
            timeout=30_000
        )
    wait_for("her kernel gone", lambda: not psutil.pid_exists(hog.pid), 30)
    hog.close()

    # Root's administrator's stop, through her server, logged; and what it refuses.
    hog = Kernel(hub, alice, "hog2.ipynb")
    hog.run(START_JAX)
    _on_gpu(hub, (hog, POOL))
    log = ["--log", str(admin_log)]
    rc, out = _jax_nbmem(hub, "shutdown", str(hub.process.pid), *log, token=hub.admin_token)
    assert rc == 1 and "is not a Jupyter kernel" in out and "nothing done" in out
    dead = f"http://127.0.0.1:{_free_port()}"
    rc, out = _jax_nbmem(
        hub, "shutdown", str(hog.pid), "--hub-url", dead, *log, token=hub.admin_token
    )
    assert rc == 1 and "does not answer" in out and "nothing done" in out, out
    rc, out = _jax_nbmem(hub, "shutdown", str(hog.pid), *log, token=bob_token["token"])
    assert rc == 1 and "the token may not" in out and "read:servers" in out, out
    assert "nothing done" in out
    assert psutil.pid_exists(hog.pid) and not admin_log.exists()
    rc, out = _jax_nbmem(hub, "shutdown", str(hog.pid), *log, token=hub.admin_token)
    assert rc == 0, out
    assert f"Stopped kernel PID {hog.pid}" in out and f"/user/{alice.name}/" in out
    assert "60.3 GiB came free" in out, out
    assert not psutil.pid_exists(hog.pid)
    (entry,) = [json.loads(line) for line in admin_log.read_text().splitlines()]
    assert (entry["by"], entry["pid"], entry["hub_user"], entry["kernel_id"]) == (
        "root",
        hog.pid,
        alice.name,
        hog.id,
    )
    assert entry["gpu_bytes"] == {"0": POOL} and entry["how"] == "server" and entry["at"]
    # Her server was sent a token the hub issued for it alone (the administrator's went to the
    # hub only), and that token is revoked once used.
    assert f"Service test-admin requested API token for {alice.name}" in hub.log_tail(2000)
    status, tokens = hub.api("GET", f"users/{alice.name}/tokens")
    assert status == 200, tokens
    assert not [t for t in tokens["api_tokens"] if "jax-nbmem" in (t.get("note") or "")], tokens
    rc, out = _jax_nbmem(hub, "shutdown", str(hog.pid), *log, token=hub.admin_token)
    assert rc == 1 and "nothing done" in out  # it exited meanwhile
    hog.close()

    # The culler: dry-run names the idle blocking kernel, not the busy one.
    hog = Kernel(hub, alice, "hog3.ipynb")
    hog.run(START_JAX)
    busy = Kernel(hub, alice, "busy.ipynb")
    busy.run(START_JAX)
    _on_gpu(hub, (hog, POOL), (busy, LATE_POOL))
    busy.client.execute("import time; time.sleep(120)")
    wait_for("the busy kernel's beacon", lambda: _busy(hub, busy.pid), 20)
    time.sleep(1.2)  # idle for more than the limit
    cull = ["cull", "--once", "--idle", "1", "--warn", "3", *log, "--hub-url", hub.url]
    rc, out = _jax_nbmem(hub, *cull, "--dry-run")  # no token: the dry run says so, and stops
    assert rc == 2 and "no hub API token" in out and "checked by --dry-run" in out, out
    rc, out = _jax_nbmem(hub, *cull, "--dry-run", token=hub.culler_token)
    assert rc == 0, out
    assert f"would warn kernel PID {hog.pid}" in out and "nothing done" in out, out
    assert str(busy.pid) not in out
    assert not list(hub.share_dir.glob("jax_nbmem-cull-*"))

    # Warned: its own status says when; it runs a cell, and is let go.
    rc, out = _jax_nbmem(hub, *cull, token=hub.culler_token)
    assert rc == 0 and f"warned kernel PID {hog.pid}" in out, out
    pending = [w for w in hog.status()["warnings"] if w["kind"] == "cull-pending"]
    assert pending and "unless it runs a cell" in pending[0]["message"], pending
    assert re.search(r"shut down at \d\d:\d\d", pending[0]["message"])
    time.sleep(3.2)
    rc, out = _jax_nbmem(hub, *cull, token=hub.culler_token)
    assert "it ran a cell" in out and psutil.pid_exists(hog.pid), out

    # Left idle after its warning, it is culled through her server, and counted.
    port = _free_port()
    service = subprocess.Popen(
        [sys.executable, "-m", "jax_nbmem.cli", "cull", "--every", "1", "--idle", "1",
         "--warn", "3", *log, "--hub-url", hub.url, "--listen", f"127.0.0.1:{port}"],
        env={**hub.env, "JUPYTERHUB_API_TOKEN": hub.culler_token},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for("the idle kernel culled", lambda: not psutil.pid_exists(hog.pid), 60, 0.5)
        metrics = wait_for("its count", lambda: _culled(port), 15)
        assert metrics == {"idle-preallocated": 1.0, "idle-over-share": 0.0}, metrics
    finally:
        service.terminate()
        output = service.communicate(timeout=15)[0]
    assert f"culled: Stopped kernel PID {hog.pid}" in output, output
    assert psutil.pid_exists(busy.pid) and str(busy.pid) not in output
    events = [json.loads(line) for line in admin_log.read_text().splitlines()]
    assert any(e.get("action") == "cull" and e["pid"] == hog.pid for e in events)
    assert not list(hub.share_dir.glob("jax_nbmem-cull-*"))
    hub.server(alice, "POST", f"api/kernels/{busy.id}/interrupt")  # so that it stops at once
    for kernel in (hog, busy, mine):
        kernel.close()


def _busy(hub: Hub, pid: int) -> bool:
    path = hub.share_dir / f"jax_nbmem-beacon-{pid}.json"
    try:
        return json.loads(path.read_text()).get("cell_running") is True
    except (OSError, ValueError):
        return False


def _culled(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    found = dict(re.findall(r'jax_nbmem_culled_kernels_total\{reason="([^"]+)"\} (\S+)', text))
    counts = {reason: float(value) for reason, value in found.items()}
    return counts if counts.get("idle-preallocated") else None
