"""The administrator's token as docs/jupyterhub.md mints it: a service with exactly two scopes.

The page's commands make the token file (root's only), its lines go at the end of the docs'
jupyterhub_config.py, and a real hub (no user servers: only its API is asked) says what the
token may do: ``GET /hub/api/user`` lists the token's scopes as the hub expands them, which
must be exactly what the command's scopes (:data:`~jax_nbmem.cli.hubapi.SCOPES`) expand to in
this JupyterHub.
"""

from __future__ import annotations

import json
import re
import stat
import subprocess

from jax_nbmem.cli.hubapi import SCOPES
from tests.hub.conftest import request, running_hub
from tests.jupyterlab import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "jupyterhub.md"
TOKEN_FILE = "/etc/jupyterhub/jax-nbmem/admin.token"


def _recipe() -> tuple[str, str]:
    """(the page's shell lines that make the token file, its config lines)."""
    page = PAGE.read_text()
    config = page.split("<!-- admin-token-recipe -->\n```python\n", 1)[1].split("```", 1)[0]
    before = page.split("<!-- admin-token-recipe -->", 1)[0]
    shell = re.findall(r"```bash\n(.*?)```", before, re.S)[-1]
    assert TOKEN_FILE in shell and TOKEN_FILE in config
    return shell, config


def _after_recipe() -> str:
    """The page's shell block after the recipe: how the administrator checks and uses it."""
    after = PAGE.read_text().split("<!-- admin-token-recipe -->", 1)[1]
    return re.findall(r"```bash\n(.*?)```", after, re.S)[0]


def _expanded(scopes) -> set[str]:
    from jupyterhub.scopes import expand_scopes

    return set(expand_scopes(set(scopes)))


def test_the_documented_recipe_gives_a_token_of_exactly_the_command_s_scopes(simgpu_lib, tmp_path):
    shell, config = _recipe()
    folder = tmp_path / "etc-jupyterhub"
    token_path = str(folder / "jax-nbmem" / "admin.token")
    subprocess.run(
        ["bash", "-euc", shell.replace("/etc/jupyterhub", str(folder))], check=True, timeout=60
    )
    assert stat.S_IMODE((folder / "jax-nbmem").stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "jax-nbmem" / "admin.token").stat().st_mode) == 0o600
    token = (folder / "jax-nbmem" / "admin.token").read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    with running_hub(
        simgpu_lib, "\n" + config.replace(TOKEN_FILE, token_path), "jnm-hubtok-", servers=False
    ) as hub:
        status, me = request(hub.url + "/hub/api/user", token=token)
        assert status == 200, (status, me)
        assert (me["kind"], me["name"]) == ("service", "jax-nbmem-admin")
        assert f'"scopes": {json.dumps(list(SCOPES))}' in config
        assert set(me["scopes"]) == _expanded(SCOPES), me["scopes"]
        # Not a scope more: it cannot list users, nor start or stop a server.
        assert request(hub.url + "/hub/api/users", token=token)[0] == 403
        reply = request(hub.url + f"/hub/api/users/{hub.alice.name}/server", "POST", token=token)
        assert reply[0] == 403, reply
        # The page's own check, its curl line with this hub's address and token file.
        (curl,) = [x for x in _after_recipe().splitlines() if x.startswith("curl ")]
        curl = curl.replace(TOKEN_FILE, token_path).replace("http://127.0.0.1:8000", hub.url)
        done = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and json.loads(done.stdout) == me, done.stdout + done.stderr
        # And it finds a user's server record, which is what `jax-nbmem shutdown` asks first.
        status, model = request(hub.url + f"/hub/api/users/{hub.alice.name}", token=token)
        assert status == 200 and "servers" in model, (status, model)
