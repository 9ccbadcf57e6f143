"""The docs' jupyterhub_config.py is the one the hub tests run (docs/jupyterhub_config.py)."""

from tests.hub.conftest import CONFIG
from tests.jupyterlab import REPO_ROOT


def test_the_docs_show_the_tested_config_verbatim():
    page = (REPO_ROOT / "docs" / "jupyterhub.md").read_text()
    assert f"```python\n{CONFIG.read_text()}```" in page
    compile(CONFIG.read_text(), str(CONFIG), "exec")  # and it is Python
