"""Issue 44's gap: a kernel of a named server is stopped through that server.

With ``c.JupyterHub.allow_named_servers``, a hub user runs servers besides her default one,
each at ``/user/NAME/SERVER/``. Root's ``jax-nbmem shutdown`` (and the culler, which stops
the same way) asked her default server, which does not list that kernel, and refused ("not
on the list"). It asks each of her servers the hub records, with a token the hub issues for
that one server alone, and stops the kernel through the server whose own list has it.
"""

from __future__ import annotations

import json

import psutil
import pytest

from tests.hub.conftest import Hub
from tests.hub.test_hub import POOL, START_JAX, Kernel, _jax_nbmem, _on_gpu
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel

SERVER = "second"


def _named_server_ready(hub: Hub, user) -> bool:
    status, model = hub.api("GET", f"users/{user.name}")
    server = (model or {}).get("servers", {}).get(SERVER) if status == 200 else None
    return bool(server and server.get("ready"))


@pytest.mark.timeout(420)
def test_root_stops_a_kernel_of_a_named_server_through_that_server(hub, tmp_path):
    alice = hub.alice
    status, answer = hub.api("POST", f"users/{alice.name}/servers/{SERVER}")
    assert status in (201, 202), (status, answer)
    kernel = None
    try:
        wait_for("her named server", lambda: _named_server_ready(hub, alice), 180, 0.5)
        kernel = Kernel(hub, alice, "named.ipynb", server=SERVER)
        kernel.run(START_JAX)
        _on_gpu(hub, (kernel, POOL))
        admin_log = tmp_path / "admin.log"
        rc, out = _jax_nbmem(hub, "shutdown", str(kernel.pid), "--log", str(admin_log),
                             token=hub.admin_token)  # fmt: skip
        assert rc == 0, out
        assert f"Stopped kernel PID {kernel.pid}" in out, out
        assert f"/user/{alice.name}/{SERVER}/" in out, out
        assert not psutil.pid_exists(kernel.pid)
        status, listed = hub.server(alice, "GET", f"{SERVER}/api/kernels")
        assert status == 200 and kernel.id not in {k["id"] for k in listed}, listed
        (entry,) = [json.loads(line) for line in admin_log.read_text().splitlines()]
        assert (entry["how"], entry["hub_user"], entry["kernel_id"]) == (
            "server",
            alice.name,
            kernel.id,
        )
        # The token her named server was sent was issued for it alone, and revoked once used.
        status, tokens = hub.api("GET", f"users/{alice.name}/tokens")
        assert status == 200, tokens
        assert not [t for t in tokens["api_tokens"] if "jax-nbmem" in (t.get("note") or "")]
    finally:
        if kernel is not None:
            kernel.close()
        hub.api("DELETE", f"users/{alice.name}/servers/{SERVER}", {"remove": True})
