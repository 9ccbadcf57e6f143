"""Turning the server extension off for one user, with the commands docs/jupyterlab.md gives.

Since jupyter_server 2.16, ``jupyter server extension enable/disable NAME --user`` refuses a
name that the user's own config does not mention yet ("could not be found"), whatever is
installed: the package's switch is in the environment's config, not the user's. Once the
user's file names it, both commands work; ``list`` then shows it off for that user.
"""

import json
import os
import subprocess
import sys

SWITCH = {"ServerApp": {"jpserver_extensions": {"jax_nbmem.server": False}}}


def _jupyter(config_dir, *args) -> str:
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", "server", "extension", *args],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return done.stdout + done.stderr


def _user_section(listing: str, config_dir) -> str:
    """The lines `jupyter server extension list` prints under the user's config dir."""
    section = listing.split(f"Config dir: {config_dir}", 1)[1]
    return section.split("Config dir:", 1)[0]


def test_a_user_turns_the_extension_off_and_on_with_their_own_config(tmp_path):
    config_dir = tmp_path / "user-config"
    # The name the command itself writes: later toggles rewrite this one file.
    switch = config_dir / "jupyter_server_config.d" / "jax_nbmem.server.json"
    switch.parent.mkdir(parents=True)
    switch.write_text(json.dumps(SWITCH))  # the file docs/jupyterlab.md has users write
    listing = _jupyter(config_dir, "list")
    assert "jax_nbmem.server disabled" in _user_section(listing, config_dir).replace(
        "\x1b[31m", ""
    ).replace("\x1b[0m", "")
    enabled = _jupyter(config_dir, "enable", "jax_nbmem.server", "--user")
    assert "successfully enabled" in enabled, enabled
    assert json.loads(switch.read_text())["ServerApp"]["jpserver_extensions"] == {
        "jax_nbmem.server": True
    }
    disabled = _jupyter(config_dir, "disable", "jax_nbmem.server", "--user")
    assert "successfully disabled" in disabled, disabled
    assert json.loads(switch.read_text()) == SWITCH
