"""Issue 51 item 8: the administrator's pages say what the package and its code say.

docs/versions.md names each declared floor as pyproject.toml declares it; docs/upgrade.md names
each file the product leaves outside its environment where the code puts it.
"""

from __future__ import annotations

import re

import tomllib

from jax_nbmem.cli.stop import admin_log_path
from jax_nbmem.node.sharedir import DEFAULT_SHARE_DIR
from jax_nbmem.simgpu.shared import STARTUP_NAME
from tests.jupyterlab import REPO_ROOT

PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def _floors() -> dict[str, str]:
    declared = [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["server"],
                *PROJECT["optional-dependencies"]["test"]]  # fmt: skip
    floors = {}
    for requirement in declared:
        found = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?>=([0-9.]+)", requirement)
        if found:
            floors[found[1]] = found[2]
    return floors


def test_the_versions_page_says_each_floor_as_declared():
    page = (REPO_ROOT / "docs" / "versions.md").read_text()
    floors = _floors()
    assert PROJECT["requires-python"] == ">=3.10" and "3.10 and newer" in page
    for name in (
        "jax",
        "ipython",
        "ipykernel",
        "ipywidgets",
        "anywidget",
        "plotly",
        "nvidia-ml-py",
        "jupyter_server",
        "prometheus_client",
        "kubernetes-validate",
    ):
        assert f"`{name}` ≥ {floors[name]}" in page, name
    assert f"JupyterHub | {floors['jupyterhub']} and newer" in page
    oldest = (REPO_ROOT / "scripts" / "test-oldest.sh").read_text()
    assert f'"jax=={floors["jax"]}"' in oldest and f"and {floors['jax']} itself" in page


def test_the_uninstall_page_names_what_stays_where_the_code_puts_it(monkeypatch):
    page = (REPO_ROOT / "docs" / "upgrade.md").read_text()
    monkeypatch.delenv("JAX_NBMEM_ADMIN_LOG", raising=False)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert f"`{admin_log_path()}` (root)" in page
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", "/home/alice")
    shown = str(admin_log_path()).replace("/home/alice", "~")
    assert f"`{shown}` (a user)" in page
    assert f"`{DEFAULT_SHARE_DIR}`" in page and f"`{STARTUP_NAME}`" in page
    unit = (REPO_ROOT / "deploy" / "jax-nbmem-exporter.service").read_text()
    assert "EnvironmentFile=-/etc/default/jax-nbmem-exporter" in unit
    assert "/etc/tmpfiles.d/jax_nbmem.conf" in unit and "ExecStart=/opt/jax_nbmem/" in unit
    for path in ("/etc/systemd/system/jax-nbmem-exporter.service",
                 "/etc/tmpfiles.d/jax_nbmem.conf", "/etc/default/jax-nbmem-exporter",
                 "/opt/jax_nbmem"):  # fmt: skip
        assert f"`{path}`" in page, path
    assert "jax-nbmem kernel remove NAME" in page and "jax-nbmem kernel list" in page


def test_every_test_the_verification_page_names_exists():
    page = (REPO_ROOT / "docs" / "verification.md").read_text()
    named = set(re.findall(r"`(tests/[\w/]+\.py)`", page))
    assert len(named) >= 20
    assert sorted(path for path in named if not (REPO_ROOT / path).is_file()) == []
