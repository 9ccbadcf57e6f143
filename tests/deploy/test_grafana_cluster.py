"""The cluster dashboard: every node at once, and kernels in pods joined to their owner and GPU.

Its queries are parsed by promtool, and run by Debian's Prometheus over two simulated nodes
(real exporters, benchmarks/cluster_sizing.py's) with kube-state-metrics' and dcgm-exporter's
series beside them: every panel answers, the pods' panel with owner and GPU model.
"""

import http.server
import json
import re
import threading

import pytest
import yaml

from jax_nbmem.metrics.metrics import FAMILIES
from tests.deploy.prometheus import REPO, RULES, Prometheus, promtool
from tests.waiting import wait_for

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


def _sizing():
    """benchmarks/cluster_sizing.py as a module (its simulated nodes serve this test)."""
    import importlib.util

    path = REPO / "benchmarks" / "cluster_sizing.py"
    spec = importlib.util.spec_from_file_location("cluster_sizing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def neighbours(tmp_path):
    """Two simulated nodes' exporters, and kube-state-metrics' and dcgm-exporter's stand-ins."""
    sizing = _sizing()
    nodes = sizing.start_nodes(2, 2, 3)  # real exporters: node-0 and node-1, 2 GPUs x 3 pods
    page = ["# TYPE kube_pod_owner gauge", "# TYPE DCGM_FI_DEV_FB_USED gauge"]
    for seed in range(2):
        report = sizing.kubernetes_report(2, 3, seed)
        for process in report["processes"]:
            pod = process["container"]["pod"]
            owner = 'owner_kind="<none>",owner_name="<none>",owner_is_controller="<none>"'
            page.append(f'kube_pod_owner{{namespace="jhub",pod="{pod}",uid="u-{pod}",{owner}}} 1')
        for gpu in report["gpus"]:
            labels = f'gpu="{gpu["index"]}",UUID="{gpu["uuid"]}",Hostname="node-{seed}"'
            page.append(f'DCGM_FI_DEV_FB_USED{{{labels},modelName="NVIDIA H100 80GB HBM3"}} 40000')
    body = ("\n".join(page) + "\n").encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the base's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield [url.split("/")[2] for _, url in nodes], f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        for process, _ in nodes:
            process.terminate()
            process.wait(30)


@pytest.mark.timeout(180)
def test_every_panel_answers_over_two_nodes_with_the_neighbours_series(tmp_path, neighbours):
    exporters, stand_in = neighbours
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [RULES.name],
        "scrape_configs": [
            {"job_name": "jax_nbmem", "honor_labels": True,
             "static_configs": [{"targets": exporters}]},
            {"job_name": "neighbours", "static_configs": [{"targets": [stand_in]}]},
        ],
    }  # fmt: skip
    prometheus = Prometheus(yaml.safe_dump(config), tmp_path / "prometheus")
    try:
        wait_for(
            "both nodes' kernels joined to their pods",
            lambda: len(prometheus.query("pod_gpu:jax_nbmem_kernel_gpu_memory_bytes:sum")) == 12,
            timeout=60,
        )
        for title, expr in exprs():
            answer = prometheus.query(expr.replace("$node", ".*"))
            assert answer, (title, expr)
        nodes = prometheus.query("node:jax_nbmem_kernel_gpu_memory_bytes:sum")
        assert sorted(labels["Hostname"] for labels, _ in nodes) == ["node-0", "node-1"]
        (pods,) = [p for p in BOARD["panels"] if p["title"].startswith("Pods' kernels")]
        rows = prometheus.query(pods["targets"][0]["expr"].replace("$node", ".*"))
        assert {(r["owner_kind"], r["modelName"]) for r, _ in rows} == {
            ("<none>", "NVIDIA H100 80GB HBM3")
        }
    finally:
        prometheus.stop()
