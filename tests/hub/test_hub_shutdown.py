"""Issue 34: `jax-nbmem shutdown` from a hub user's own kernel, through a real JupyterHub.

JupyterHub gives every process of a user's server its token and hub address
(`$JUPYTERHUB_API_TOKEN`, `$JUPYTERHUB_API_URL`), so the command run there sees a hub token
without an administrator's `--hub-url`. Alice runs it from one of her kernels, as she would in
a cell (`!jax-nbmem shutdown PID`): for bob's kernel she is told it is not hers, and why, and
nothing happens; for her own it says what it would do (`--dry-run`), then stops it through her
own server, which then no longer lists it (it was not killed under the server, which would
restart it).
"""

from __future__ import annotations

import json

import psutil
import pytest

from tests.hub.conftest import Hub
from tests.hub.test_hub import Kernel
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel

RUN_THE_COMMAND = """\
import json, subprocess, sys
def jax_nbmem(*args):
    done = subprocess.run([sys.executable, "-m", "jax_nbmem.cli", *args],
                          capture_output=True, text=True, timeout=90)
    print(json.dumps([done.returncode, done.stdout + done.stderr]))
"""


def _from(kernel: Kernel, *args: str) -> tuple[int, str]:
    out = kernel.run(f"jax_nbmem(*{list(args)!r})", timeout=120)
    code, said = json.loads(out.strip().splitlines()[-1])
    return code, said


def _kernel_ids(hub: Hub, user) -> set[str]:
    status, kernels = hub.server(user, "GET", "api/kernels")
    assert status == 200, (status, kernels)
    return {k["id"] for k in kernels}


@pytest.mark.timeout(300)
def test_a_hub_user_stops_her_own_kernel_and_is_told_bobs_is_not_hers(hub):
    alice, bob = hub.alice, hub.bob
    asker = Kernel(hub, alice, "ask.ipynb")
    hers = Kernel(hub, alice, "hers.ipynb")
    his = Kernel(hub, bob, "his.ipynb")
    try:
        for kernel in (hers, his):
            kernel.run("%load_ext jax_nbmem")
        asker.run(RUN_THE_COMMAND)
        env = json.loads(asker.run("import os, json; print(json.dumps(dict(os.environ)))"))
        assert env.get("JUPYTERHUB_API_TOKEN") and env.get("JUPYTERHUB_SERVICE_URL")

        # Bob's kernel: not hers, with the reason; nothing done.
        code, said = _from(asker, "shutdown", str(his.pid))
        assert code == 1, said
        assert f"PID {his.pid} is a kernel of user {bob.name}, not yours" in said, said
        assert f"you are hub user {alice.name}" in said and "nothing done" in said
        assert "read:servers and tokens" in said
        assert psutil.pid_exists(his.pid) and his.id in _kernel_ids(hub, bob)

        # Her own kernel: --dry-run only says; then through her own server.
        own_url = env["JUPYTERHUB_SERVICE_URL"]
        code, said = _from(asker, "shutdown", str(hers.pid), "--dry-run")
        assert code == 0 and f"Would stop kernel PID {hers.pid}" in said, said
        assert f"through its Jupyter server {own_url}" in said and psutil.pid_exists(hers.pid)
        code, said = _from(asker, "shutdown", str(hers.pid), "--json")
        assert code == 0, said
        answer = json.loads(said)
        assert (answer["done"], answer["how"], answer["server"]) == (True, "server", own_url)
        assert answer["hub_user"] == alice.name and answer["kernel_id"] == hers.id
        wait_for("her kernel gone", lambda: not psutil.pid_exists(hers.pid), 30)
        assert hers.id not in _kernel_ids(hub, alice)  # shut down by her server, not restarted
        assert psutil.pid_exists(his.pid)
    finally:
        for kernel in (asker, hers, his):
            kernel.close()
