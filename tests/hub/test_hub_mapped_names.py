"""Issue 44 item 1: a real JupyterHub that runs hub user NAME as Unix user jupyter-NAME (TLJH).

The spawner is a ``LocalProcessSpawner`` that runs each hub user as the Unix user TLJH's
spawner would (``jupyter-`` + the hub name; TLJH's own is a SystemdSpawner, which needs
systemd as PID 1: its unit's cgroup is proven in tests/hostile/test_hub_records.py). The
culler's role has the scopes docs/jupyterhub.md's TLJH section gives it. Root's ``jax-nbmem
shutdown PID --yes --hub-url …`` stops alice's idle kernel through her server and logs it, the
hub user proven from the hub's record of her server (its PID, a real ancestor); a token
without ``admin:server_state`` is told that it lacks it; bob's kernel that claims to be
alice's stops nothing; the culler culls her idle kernel and names his only to say why not.
"""

from __future__ import annotations

import json
import secrets
import time

import psutil
import pytest

from jax_nbmem.cli.hubapi import SCOPES
from jax_nbmem.cli.hubowner import STATE_SCOPE
from tests.hub.conftest import running_hub
from tests.hub.test_hub import LATE_POOL, POOL, START_JAX, Kernel, _jax_nbmem, _on_gpu
from tests.waiting import wait_for

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(600)]

PLAIN_TOKEN = secrets.token_hex(24)  # the scopes of a hub whose Unix names are its hub names
TLJH_NAMES = f'''

# ---- tests/hub/test_hub_mapped_names.py: hub user NAME runs as Unix user jupyter-NAME ----
import pwd

from jupyterhub.spawner import LocalProcessSpawner


class TLJHNamedSpawner(LocalProcessSpawner):
    """Each hub user as the Unix user TLJH's spawner makes for them."""

    def _unix(self):
        return "jupyter-" + self.user.name

    def make_preexec_fn(self, name):
        return super().make_preexec_fn(self._unix())

    def user_env(self, env):
        entry = pwd.getpwnam(self._unix())
        env.update(USER=entry.pw_name, HOME=entry.pw_dir, SHELL=entry.pw_shell)
        return env


c.JupyterHub.spawner_class = TLJHNamedSpawner
(culler,) = [r for r in c.JupyterHub.load_roles if r["name"] == "jax-nbmem-culler"]
culler["scopes"] = {[*SCOPES, STATE_SCOPE]!r}
c.JupyterHub.services.append({{"name": "plain-admin", "api_token": {PLAIN_TOKEN!r}}})
c.JupyterHub.load_roles.append(
    {{"name": "plain-admin", "services": ["plain-admin"], "scopes": {list(SCOPES)!r}}}
)
'''


@pytest.fixture(scope="module")
def tljh_hub(simgpu_lib):
    """A hub of its own whose users run as jupyter-NAME (see the module)."""
    with running_hub(simgpu_lib, TLJH_NAMES, prefix="jnm-tljhub-", unix_prefix="jupyter-") as hub:
        yield hub


def test_the_hub_users_run_as_other_unix_users(tljh_hub):
    hub = tljh_hub
    kernel = Kernel(hub, hub.alice, "who.ipynb")
    try:
        assert psutil.Process(kernel.pid).username() == f"jupyter-{hub.alice.name}"
        assert kernel.run("import os; print(os.environ['JUPYTERHUB_USER'])").strip() == (
            hub.alice.name
        )
    finally:
        kernel.close()


def test_roots_stop_proves_alices_hub_user_from_the_hubs_record(tljh_hub):
    hub = tljh_hub
    alice, bob = hub.alice, hub.bob
    admin_log = hub.folder / "admin-stop.log"
    log = ["--yes", "--log", str(admin_log)]
    hog = Kernel(hub, alice, "hog.ipynb")
    liar = Kernel(hub, bob, "liar.ipynb")
    try:
        hog.run(START_JAX)
        liar.run(f"import os\nos.environ['JUPYTERHUB_USER'] = {alice.name!r}\n{START_JAX}")
        _on_gpu(hub, (hog, POOL))

        # Bob's kernel claims to be alice's: the hub's record of her server is no ancestor.
        rc, out = _jax_nbmem(hub, "shutdown", str(liar.pid), *log, token=hub.admin_token)
        assert rc == 1 and "nothing done" in out, out
        assert f"it claims hub user {alice.name}, but it runs as Unix user jupyter-{bob.name}" in (
            out
        )
        assert f"which is not one of PID {liar.pid}'s real ancestors" in out
        assert psutil.pid_exists(liar.pid) and psutil.pid_exists(hog.pid)

        # A token with the scopes a hub of same-named users needs is told what it lacks.
        rc, out = _jax_nbmem(hub, "shutdown", str(hog.pid), *log, token=PLAIN_TOKEN)
        assert rc == 1 and "nothing done" in out, out
        assert f"scope {STATE_SCOPE}, which this one lacks" in out
        assert psutil.pid_exists(hog.pid) and not admin_log.exists()

        rc, out = _jax_nbmem(hub, "shutdown", str(hog.pid), *log, token=hub.admin_token)
        assert rc == 0, out
        assert f"Stopped kernel PID {hog.pid}" in out and f"/user/{alice.name}/" in out
        assert f"hub user {alice.name} (Unix user jupyter-{alice.name})" in out
        assert "60.3 GiB came free" in out, out
        assert not psutil.pid_exists(hog.pid) and psutil.pid_exists(liar.pid)
        (entry,) = [json.loads(line) for line in admin_log.read_text().splitlines()]
        assert (entry["by"], entry["pid"], entry["hub_user"], entry["user"]) == (
            "root", hog.pid, alice.name, f"jupyter-{alice.name}")  # fmt: skip
        assert entry["kernel_id"] == hog.id and entry["gpu_bytes"] == {"0": POOL}
        assert "its spawner's PID" in entry["proven_owner"]["source"]
    finally:
        for kernel in (hog, liar):
            kernel.close()


def test_the_culler_culls_alices_idle_kernel_and_not_one_that_claims_to_be_hers(tljh_hub):
    hub = tljh_hub
    alice, bob = hub.alice, hub.bob
    admin_log = hub.folder / "admin-cull.log"
    hog = Kernel(hub, alice, "culled.ipynb")
    liar = Kernel(hub, bob, "claims.ipynb")
    try:
        hog.run(START_JAX)
        liar.run(f"import os\nos.environ['JUPYTERHUB_USER'] = {alice.name!r}\n{START_JAX}")
        _on_gpu(hub, (hog, POOL), (liar, LATE_POOL))
        time.sleep(1.2)  # idle for more than the limit
        cull = ["cull", "--once", "--idle", "1", "--warn", "1", "--log", str(admin_log),
                "--hub-url", hub.url]  # fmt: skip
        rc, out = _jax_nbmem(hub, *cull, token=hub.culler_token)
        assert rc == 0 and f"warned kernel PID {hog.pid}" in out, out
        assert f"not culling kernel PID {liar.pid}" in out
        assert f"it claims hub user {alice.name}, but it runs as Unix user jupyter-{bob.name}" in (
            out
        )
        assert f"warned kernel PID {liar.pid}" not in out
        time.sleep(1.2)
        rc, out = _jax_nbmem(hub, *cull, token=hub.culler_token)
        assert rc == 0 and f"culled: Stopped kernel PID {hog.pid}" in out, out
        assert f"/user/{alice.name}/" in out
        wait_for("her kernel gone", lambda: not psutil.pid_exists(hog.pid), 30)
        assert psutil.pid_exists(liar.pid)
        events = [json.loads(line) for line in admin_log.read_text().splitlines()]
        assert any(e.get("action") == "cull" and e["pid"] == hog.pid for e in events)
        assert not any(e.get("action") in ("warn", "cull") and e["pid"] == liar.pid
                       for e in events)  # fmt: skip
    finally:
        for kernel in (hog, liar):
            kernel.close()
