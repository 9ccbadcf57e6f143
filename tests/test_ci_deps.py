"""Issue 49: the test command's deps scripts, as a user who is not root and has no sudo.

A stock Debian user's PATH has no /usr/sbin or /sbin, so the scripts once thought useradd and
dockerd missing and reached for a sudo that was not there: ``bash scripts/test.sh`` stopped
before pytest ran. Now each script looks in /usr/sbin and /sbin too, and where nobody can
install it says what is missing and how an administrator installs it, and lets pytest run (the
tests that need it skip with their reason), except under CI, which must prove every test.
The user is a throwaway one (root makes it); its PATH is Debian's default for users.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.jupyterlab import REPO_ROOT
from tests.users import add_user, remove_user

USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
DEPS = ("system", "browser", "prometheus", "podman", "docker")


@pytest.fixture(scope="module")
def stock_user():
    if os.geteuid() != 0:
        pytest.skip("makes a throwaway user, which needs root")
    if shutil.which("useradd") is None:
        pytest.skip("no useradd to make a throwaway user")
    user = add_user("nbci")
    folder = Path(tempfile.mkdtemp(prefix="jax_nbmem-ci-"))
    folder.chmod(0o755)
    shutil.copytree(REPO_ROOT / ".ci", folder / ".ci")
    try:
        yield user, folder
    finally:
        remove_user(user)
        shutil.rmtree(folder, ignore_errors=True)


def _as(user, folder: Path, script: str, *, ci: str = "") -> subprocess.CompletedProcess:
    env = {"PATH": USER_PATH, "HOME": str(user.home), "CI": ci}
    return subprocess.run(
        ["bash", "-c", script], cwd=folder, env=env, user=user.uid, group=user.gid,
        extra_groups=[], capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_tools_in_sbin_are_found_without_sbin_on_the_path(stock_user):
    user, folder = stock_user
    assert not Path("/usr/bin/useradd").exists() and Path("/usr/sbin/useradd").exists()
    done = _as(user, folder, "command -v useradd || echo absent; source .ci/apt.sh; have useradd")
    assert done.stdout.startswith("absent"), done.stdout  # the user's own PATH lacks it
    assert done.returncode == 0, done.stderr  # the scripts find it


@pytest.mark.parametrize("deps", DEPS)
def test_where_everything_is_installed_the_script_says_so_without_root(stock_user, deps):
    user, folder = stock_user
    if deps in ("podman", "docker") and shutil.which(deps) is None:
        pytest.skip(f"{deps} is not installed here")
    done = _as(user, folder, f"bash .ci/{deps}-deps.sh")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "already installed" in done.stdout and "sudo" not in done.stderr


def test_what_nobody_can_install_is_listed_and_pytest_may_run(stock_user):
    user, folder = stock_user
    script = (
        "source .ci/apt.sh; apt_install jax-nbmem-no-such-package || "
        "not_installed demo-deps 'the frobnicator' jax-nbmem-no-such-package; echo not reached"
    )
    done = _as(user, folder, script)
    assert done.returncode == 0, done.stderr
    assert "not reached" not in done.stdout and "apt-get" not in done.stdout
    assert "demo-deps: missing: the frobnicator" in done.stderr
    assert "not root and has no sudo" in done.stderr
    assert "apt-get install --no-install-recommends jax-nbmem-no-such-package" in done.stderr
    assert "skip, each saying why" in done.stderr

    under_ci = _as(user, folder, script, ci="true")
    assert under_ci.returncode == 1, under_ci.stderr
    assert "CI proves every test" in under_ci.stderr


def test_root_may_install(stock_user):
    _, folder = stock_user
    done = subprocess.run(
        ["bash", "-c", "source .ci/apt.sh; may_install"], cwd=folder, env={"PATH": USER_PATH},
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0
