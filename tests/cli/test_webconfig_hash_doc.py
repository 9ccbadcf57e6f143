"""docs/metrics.md's way to make the web config's bcrypt hash, run as the page shows it.

The page's command (Python's bcrypt, no Apache ``htpasswd``) reads the password and prints the
hash; that hash, in a web config as the page's example puts it, admits exactly that password
(the exporter's own check, :func:`jax_nbmem.cli.webconfig.load_web_config`).
"""

from __future__ import annotations

import base64
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from jax_nbmem.cli.webconfig import load_web_config

bcrypt = pytest.importorskip("bcrypt")  # jax_nbmem[exporter-auth], as the page says
PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
PASSWORD = "correct horse battery staple"


def _page_command() -> str:
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
                if "bcrypt.hashpw" in b]  # fmt: skip
    (line,) = [x for x in block.splitlines() if "bcrypt.hashpw" in x]
    return line


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_the_page_s_hash_command_makes_a_hash_the_exporter_accepts(tmp_path):
    line = _page_command()
    assert line.startswith("/opt/jax_nbmem/bin/python -c ")
    argv = [sys.executable, *shlex.split(line)[1:]]  # the test's Python for the unit's
    # No terminal (a session of its own): getpass reads the password from stdin, as a pipe.
    done = subprocess.run(argv, input=PASSWORD + "\n", capture_output=True, text=True,
                          timeout=60, start_new_session=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    hashed = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\$2b\$10\$[./A-Za-z0-9]{53}", hashed), hashed
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    web = load_web_config(str(path))
    assert web.authorized(_basic("prometheus", PASSWORD))
    assert not web.authorized(_basic("prometheus", PASSWORD + "x"))
