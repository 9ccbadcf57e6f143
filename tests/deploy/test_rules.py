"""The shipped Prometheus rules: promtool checks them and runs their unit tests."""

from tests.deploy.prometheus import RULE_TESTS, RULES, promtool


def test_the_rules_are_valid():
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 10 rules found" in done.stdout


def test_the_rules_unit_tests_pass():
    # The two-GPU kernel preallocated on one, the join across an exporter and a server, the
    # recording rules, a target down, a stale snapshot, NVML down, no exporter at all, and on
    # Kubernetes kernels in pods joined to their owner (kube-state-metrics) and GPU (dcgm).
    done = promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
