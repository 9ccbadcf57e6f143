"""The README's jupyterhub_config.py is the one the hub tests run (docs/jupyterhub_config.py)."""

from tests.hub.conftest import CONFIG
from tests.jupyterlab import REPO_ROOT


def test_the_readme_shows_the_tested_config_verbatim():
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"```python\n{CONFIG.read_text()}```" in readme
    compile(CONFIG.read_text(), str(CONFIG), "exec")  # and it is Python
