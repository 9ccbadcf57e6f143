"""The cluster dashboard: every node at once, and kernels in pods joined to their owner and GPU."""

import json
import re

import yaml

from jax_nbmem.tenants.metrics import FAMILIES
from tests.deploy.prometheus import REPO, RULES, promtool

BOARD = json.loads((REPO / "deploy" / "grafana-cluster-dashboard.json").read_text())
RECORDED = {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"]
            for r in g["rules"] if "record" in r}  # fmt: skip
# Neighbours' series the board joins to: dcgm-exporter's, kube-state-metrics', Prometheus's.
THEIRS = {"DCGM_FI_DEV_FB_USED", "kube_pod_owner", "up"}


def exprs():
    return [(p["title"], t["expr"]) for p in BOARD["panels"] for t in p["targets"]]


def test_every_query_parses_and_every_series_it_reads_is_exported_recorded_or_a_neighbour_s(
    tmp_path,
):
    rules = [{"record": f"board:query_{i}:test", "expr": expr.replace("$node", ".*")}
             for i, (_, expr) in enumerate(exprs())]  # fmt: skip
    path = tmp_path / "board.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "board", "rules": rules}]}))
    done = promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    for title, expr in exprs():
        series = set(re.findall(r"\b(jax_nbmem_\w+|\w+:\w+:\w+|DCGM_\w+|kube_\w+|up)\b", expr))
        assert series, (title, expr)
        unknown = series - set(FAMILIES) - RECORDED - THEIRS
        assert not unknown, (title, unknown)


def test_a_node_variable_filters_and_the_per_node_table_reads_the_recording_rules():
    (node,) = [v for v in BOARD["templating"]["list"] if v["name"] == "node"]
    assert node["includeAll"] and "Hostname" in node["query"]["query"]
    for title, expr in exprs():
        if "Hostname" in expr or "node:" in expr or "gpu:" in expr:
            assert "$node" in expr, (title, expr)
    (table,) = [p for p in BOARD["panels"] if p["title"].startswith("Every node")]
    assert any("node:jax_nbmem_kernel_gpu_memory_bytes:sum" in t["expr"] for t in table["targets"])


def test_the_pods_panel_joins_kernels_to_owner_and_gpu_through_the_recording_rule():
    (pods,) = [p for p in BOARD["panels"] if p["title"].startswith("Pods' kernels")]
    first, share = (t["expr"] for t in pods["targets"])
    assert first.startswith("pod_gpu:jax_nbmem_kernel_gpu_memory_bytes:sum")
    assert "on (UUID)" in share and "DCGM_FI_DEV_FB_USED * 1048576" in share
