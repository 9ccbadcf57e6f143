"""The docs' TLJH file (docs/tljh_jax_nbmem.py): shown verbatim, and it grants what is needed.

Its culler role's scopes are the ones a hub that maps names needs (:data:`~jax_nbmem.cli.
hubapi.SCOPES` and :data:`~jax_nbmem.cli.hubowner.STATE_SCOPE`), the ones the mapped-names hub
test gives its culler (tests/hub/test_hub_mapped_names.py); the token it registers is the one
in the culler unit's environment file.
"""

from unittest import mock

from traitlets.config import Config

from jax_nbmem.cli.hubapi import SCOPES
from jax_nbmem.cli.hubowner import STATE_SCOPE
from tests.jupyterlab import REPO_ROOT

TLJH = REPO_ROOT / "docs" / "tljh_jax_nbmem.py"


def test_the_docs_show_the_tljh_file_verbatim():
    page = (REPO_ROOT / "docs" / "jupyterhub.md").read_text()
    assert f"```python\n{TLJH.read_text()}```" in page
    assert f"`{STATE_SCOPE}`, besides `{SCOPES[0]}` and\n`{SCOPES[1]}`" in page


def test_the_tljh_file_registers_the_culler_with_the_scopes_a_mapping_hub_needs(tmp_path):
    env = tmp_path / "culler.env"
    env.write_text("JUPYTERHUB_API_TOKEN=0123abcd\n")
    c = Config()
    c.JupyterHub.services = []
    c.JupyterHub.load_roles = []
    with mock.patch.dict("os.environ", {"JAX_NBMEM_CULLER_ENV": str(env)}):
        exec(TLJH.read_text(), {"get_config": lambda: c, "__file__": str(TLJH)})
    assert c.JupyterHub.services == [{"name": "jax-nbmem-culler", "api_token": "0123abcd"}]
    (role,) = c.JupyterHub.load_roles
    assert role["services"] == ["jax-nbmem-culler"]
    assert role["scopes"] == [*SCOPES, STATE_SCOPE]
    added = c.Spawner.environment.get_value({"LANG": "C"})  # on top of TLJH's own
    assert added == {"LANG": "C", "JAX_NBMEM_SHARE_DIR": "/var/tmp/jax_nbmem"}
