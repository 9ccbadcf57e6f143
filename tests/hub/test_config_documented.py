"""The docs' jupyterhub_config.py is the one the hub tests run (docs/jupyterhub_config.py)."""

from tests.hub.conftest import CONFIG, documented_config
from tests.jupyterlab import REPO_ROOT


def test_the_docs_show_the_tested_config_verbatim():
    page = (REPO_ROOT / "docs" / "jupyterhub.md").read_text()
    assert f"```python\n{CONFIG.read_text()}```" in page
    compile(CONFIG.read_text(), str(CONFIG), "exec")  # and it is Python


def test_one_set_of_scopes_said_the_same_everywhere():
    from jax_nbmem.cli.command import _parser
    from jax_nbmem.cli.hubapi import SCOPES, SCOPES_TEXT

    c = documented_config({})
    (role,) = [r for r in c.JupyterHub.load_roles if r["name"] == "jax-nbmem-culler"]
    assert tuple(role["scopes"]) == SCOPES
    assert SCOPES_TEXT == f"the scopes {SCOPES[0]} and {SCOPES[1]}"
    page = (REPO_ROOT / "docs" / "jupyterhub.md").read_text()
    assert f"the scopes `{SCOPES[0]}` and `{SCOPES[1]}`" in page
    for other in ("admin:servers", "list:users", "admin:users"):
        assert other not in page and other not in CONFIG.read_text()
    shutdown = _parser()._subparsers._group_actions[0].choices["shutdown"]
    assert SCOPES_TEXT in " ".join(shutdown.format_help().split())


def test_the_config_as_pasted_lets_the_authenticator_s_users_log_in():
    """JupyterHub 5 and later refuse everyone without an allow setting; 4.x allowed everyone."""
    from jupyterhub.auth import PAMAuthenticator

    c = documented_config({})
    authenticator = PAMAuthenticator(config=c)
    assert authenticator.check_allowed("alice") is True
    assert 'c.Authenticator.allowed_users = {"alice", "bob"}' in CONFIG.read_text()  # the other way
