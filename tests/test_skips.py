"""A skip under CI fails the run unless tests/skips.py expects it; elsewhere it is only listed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.jupyterlab import REPO_ROOT

_CONFTEST = textwrap.dedent(
    """
    from tests.skips import ExpectedSkip, SkipLedger

    def pytest_configure(config):
        expected = (ExpectedSkip("test_it.py::test_expected", "no widget", "a reason"),)
        config.pluginmanager.register(SkipLedger(expected), "ledger")
    """
)

_TESTS = textwrap.dedent(
    """
    import pytest

    def test_runs():
        assert True

    def test_expected():
        pytest.skip("no widget here")

    def test_surprise():
        pytest.skip("iproute2 is missing")
    """
)


def _run(folder, ci: str | None, select: str, files: tuple[str, ...] = ("test_it.py",)):
    (folder / "conftest.py").write_text(_CONFTEST)
    (folder / "test_it.py").write_text(_TESTS)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", select, *files],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_an_unexpected_skip_fails_under_ci_and_is_named(tmp_path):
    done = _run(tmp_path, "true", "runs or surprise")
    assert done.returncode == 1, done.stdout
    assert "test_it.py::test_surprise: iproute2 is missing" in done.stdout
    assert "1 unexpected skip(s) fail this CI run" in done.stdout


def test_an_expected_skip_passes_under_ci_and_says_why(tmp_path):
    done = _run(tmp_path, "true", "runs or expected")
    assert done.returncode == 0, done.stdout
    assert "test_it.py::test_expected: no widget here (expected: a reason)" in done.stdout


def test_outside_ci_a_skip_is_listed_not_failed(tmp_path):
    for ci in (None, "false"):
        done = _run(tmp_path, ci, "runs or surprise")
        assert done.returncode == 0, done.stdout
        assert "1 unexpected skip(s) would fail under CI" in done.stdout


def test_a_failing_run_keeps_its_own_exit_code(tmp_path):
    (tmp_path / "test_more.py").write_text("def test_broken():\n    assert False\n")
    done = _run(tmp_path, "true", "surprise or broken", ("test_it.py", "test_more.py"))
    assert done.returncode == 1, done.stdout
    assert "1 failed" in done.stdout
