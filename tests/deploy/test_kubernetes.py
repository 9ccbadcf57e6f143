"""deploy/kubernetes/: rendered by the real `kubectl kustomize`, every object validated offline.

Kubernetes' own kinds with `kubernetes-validate --strict`; the Prometheus Operator's against
its CRDs (cloudcoil-models-prometheus-operator, .ci/k8s-deps.sh); a kind with no schema fails.
Every option and variable given to `jax-nbmem` is one the CLI has; the PrometheusRule carries
the shipped rules (promtool checks and tests them as rendered) and the ConfigMap the shipped
dashboards. No cluster runs here: what a cluster would do is on paper (docs/containers.md).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from tests.deploy.kubernetes import KUBERNETES, cli_errors, containers, one, render
from tests.deploy.prometheus import REPO, RULE_TESTS, RULES, promtool

OVERLAYS = [None, "z2jh", "tls"]  # None: the base alone
CORE_GROUPS = {"v1", "apps/v1", "rbac.authorization.k8s.io/v1", "networking.k8s.io/v1"}
OPERATOR_GROUP = "monitoring.coreos.com/"
SCHEMAS = REPO / "build" / "k8s-schemas"
KUBERNETES_VERSIONS = ["1.30", "1.37"]


@pytest.fixture(scope="module", params=OVERLAYS, ids=lambda o: o or "base")
def rendered(request, tmp_path_factory):
    return render(tmp_path_factory.mktemp("render"), request.param)


def kubernetes_validate(objects, tmp_path, version):
    """`kubernetes-validate --strict` of ``objects``: (exit status, its output)."""
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    done = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version, str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def crd_validate(objects):
    """The CRD validator's verdict on each of ``objects`` (tests/deploy/crd_validate.py)."""
    if not (SCHEMAS / "cloudcoil" / "models" / "prometheus_operator").is_dir():
        # A skip that says what to run; under CI it fails the run all the same (tests/skips.py).
        pytest.skip("the Prometheus Operator's CRD models are missing: run .ci/k8s-deps.sh")
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "deploy" / "crd_validate.py")],
        input=json.dumps(objects), capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(SCHEMAS), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_generated_files_of_the_base_are_current():
    done = subprocess.run(
        [sys.executable, str(KUBERNETES / "generate.py"), "--check"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_object_is_kubernetes_own_or_the_prometheus_operator_s(rendered):
    for obj in rendered:
        api = obj["apiVersion"]
        assert api in CORE_GROUPS or api.startswith(OPERATOR_GROUP), (api, obj["kind"])


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_kinds_pass_kubernetes_validate_strict(rendered, tmp_path, version):
    core = [o for o in rendered if o["apiVersion"] in CORE_GROUPS]
    code, said = kubernetes_validate(core, tmp_path, version)
    assert code == 0, said
    assert "WARN" not in said and "ERROR" not in said, said  # a missing schema is a failure
    for obj in core:
        assert f"passed for resource {obj['kind'].lower()}/{obj['metadata']['name']}" in said


def test_kubernetes_validate_strict_refuses_a_field_kubernetes_does_not_have(tmp_path):
    objects = render(tmp_path, None)
    daemonset = copy.deepcopy(one(objects, "DaemonSet"))
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privilegd"] = False
    code, said = kubernetes_validate([daemonset], tmp_path, KUBERNETES_VERSIONS[-1])
    assert code != 0 and "privilegd" in said, said


def test_prometheus_operator_kinds_pass_the_operator_s_crds(rendered):
    theirs = [o for o in rendered if o["apiVersion"].startswith(OPERATOR_GROUP)]
    assert {o["kind"] for o in theirs} == {"ServiceMonitor", "PrometheusRule"}
    for verdict in crd_validate(theirs):
        assert verdict["errors"] == [], verdict


def test_the_crd_check_refuses_unknown_fields_wrong_types_and_kinds_without_a_schema(tmp_path):
    objects = render(tmp_path, None)
    monitor = copy.deepcopy(one(objects, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["honourLabels"] = True
    rule = copy.deepcopy(one(objects, "PrometheusRule"))
    rule["spec"]["groups"][0]["interval"] = 60
    unknown = {"apiVersion": "monitoring.coreos.com/v1", "kind": "GpuMonitor",
               "metadata": {"name": "x"}, "spec": {}}  # fmt: skip
    verdicts = crd_validate([monitor, rule, unknown])
    assert "spec.endpoints[0].honourLabels: not a field" in verdicts[0]["errors"][0]
    assert verdicts[1]["errors"][0].startswith("spec.groups.0.interval")
    assert verdicts[2]["errors"] == [
        "no schema for monitoring.coreos.com/v1 GpuMonitor in cloudcoil-models-prometheus-operator"
    ]


def test_every_option_and_variable_given_to_jax_nbmem_exists_in_its_cli(rendered):
    given = containers(rendered)
    assert set(given) == {"agent", "culler"}
    assert given["agent"]["command"][:2] == ["jax-nbmem", "exporter"]
    assert given["culler"]["command"][:2] == ["jax-nbmem", "cull"]
    for container in given.values():
        assert cli_errors(container) == []


def test_the_cli_check_fails_for_an_option_or_a_variable_that_does_not_exist(tmp_path):
    agent = copy.deepcopy(containers(render(tmp_path, None))["agent"])
    agent["args"] += ["--no-such-option", "0.0.0.0:9842"]
    agent["env"] += [{"name": "JAX_NBMEM_NO_SUCH_VARIABLE", "value": "9842"}]
    errors = cli_errors(agent)
    assert "agent: jax-nbmem exporter has no option --no-such-option" in errors
    assert "agent: nothing reads $JAX_NBMEM_NO_SUCH_VARIABLE" in errors


def test_the_prometheus_rule_is_the_shipped_rules_and_passes_promtool(rendered, tmp_path):
    spec = one(rendered, "PrometheusRule")["spec"]
    assert spec == {"groups": yaml.safe_load(RULES.read_text())["groups"]}
    # The rendered rules themselves, checked and unit-tested as Prometheus would load them.
    (tmp_path / RULES.name).write_text(yaml.safe_dump(spec))
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    checked = promtool("check", "rules", str(tmp_path / RULES.name))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", str(tmp_path / RULE_TESTS.name))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_dashboards_config_map_carries_the_shipped_dashboards(rendered):
    (board,) = [o for o in rendered if o["kind"] == "ConfigMap"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's label
    assert board["data"] == {
        "jax-nbmem.json": (REPO / "deploy" / "grafana-dashboard.json").read_text(),
        "jax-nbmem-cluster.json": (REPO / "deploy" / "grafana-cluster-dashboard.json").read_text(),
    }
