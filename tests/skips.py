"""Under CI a skip is a failure unless it is expected: the list below, each with its reason.

A test skips where something it needs is missing (root, a tool, a package). On a developer's
machine that is a fair answer; in CI it would be a silent hole: the run stays green while a part
of the suite never ran. So under ``CI`` (set to anything but ``""``, ``0``, ``false`` or ``no``)
the session fails for every skip that no entry of :data:`EXPECTED` matches, and the end of the
run lists what was skipped and why it may be.

An entry matches a skip by the test's node id (a prefix) and a fragment of the skip's reason;
``only_when`` names the environment variable whose presence makes it expected (the oldest floors'
run sets ``JAX_NBMEM_FLOORS=oldest``). Keep the list short: each entry is a part of the suite
that CI does not prove, and its ``why`` says why that is right.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

__all__ = ["EXPECTED", "ExpectedSkip", "SkipLedger", "in_ci"]


@dataclass(frozen=True)
class ExpectedSkip:
    """A skip CI accepts: where (node id prefix), what it says, and why that is right."""

    where: str
    reason_has: str
    why: str
    only_when: str | None = None

    def matches(self, nodeid: str, reason: str) -> bool:
        if self.only_when is not None and not os.environ.get(self.only_when):
            return False
        return nodeid.startswith(self.where) and self.reason_has in reason


EXPECTED: tuple[ExpectedSkip, ...] = (
    ExpectedSkip(
        "tests/gpu/test_nvml.py",
        "this machine has a real NVML library",
        "checks NVML's absence; it can only run where there is no driver (CI has none)",
    ),
    ExpectedSkip(
        "tests/cli/",
        "could not import 'prometheus_client",
        "the oldest floors' venv has the package's own dependencies, not the server extra",
        only_when="JAX_NBMEM_FLOORS",
    ),
    ExpectedSkip(
        "tests/cli/",
        "could not import 'bcrypt'",
        "the oldest floors' venv has the package's own dependencies, not the exporter-auth extra",
        only_when="JAX_NBMEM_FLOORS",
    ),
    ExpectedSkip(
        "tests/gpu/test_nvml.py",
        "could not import 'gpustat'",
        "the oldest floors' venv has the package's own dependencies, not the test extra",
        only_when="JAX_NBMEM_FLOORS",
    ),
    ExpectedSkip(
        "tests/record/test_export.py",
        "could not import 'pandas'",
        "the oldest floors' venv has the package's own dependencies; cells(frame=True) wants "
        "pandas, which is optional",
        only_when="JAX_NBMEM_FLOORS",
    ),
)


def in_ci() -> bool:
    """True where CI says it runs (``CI`` set to a true value, as the CI runner does)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class SkipLedger:
    """The session's skips, sorted into expected and not (a pytest plugin object)."""

    def __init__(self, expected: tuple[ExpectedSkip, ...] = EXPECTED) -> None:
        self.expected_rules = expected
        self.expected: list[tuple[str, str, ExpectedSkip]] = []
        self.unexpected: list[tuple[str, str]] = []

    def note(self, nodeid: str, reason: str) -> None:
        rule = next((r for r in self.expected_rules if r.matches(nodeid, reason)), None)
        if rule is None:
            self.unexpected.append((nodeid, reason))
        else:
            self.expected.append((nodeid, reason, rule))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.note(report.nodeid, _reason(report))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.note(report.nodeid, _reason(report))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if in_ci() and self.unexpected and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int) -> None:
        write = terminalreporter.write_line
        if self.expected:
            terminalreporter.section("expected skips")
            for nodeid, reason, rule in self.expected:
                write(f"{nodeid}: {reason} (expected: {rule.why})")
        if self.unexpected:
            terminalreporter.section("unexpected skips")
            verdict = "fail this CI run" if in_ci() else "would fail under CI"
            for nodeid, reason in self.unexpected:
                write(f"{nodeid}: {reason}")
            write(f"{len(self.unexpected)} unexpected skip(s) {verdict} (tests/skips.py)")
