"""The Grafana dashboard: a node variable, an all-nodes view, the GPU table, the dcgm join."""

import json

from tests.deploy.prometheus import REPO

BOARD = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())


def exprs(panel):
    return [target["expr"] for target in panel["targets"]]


def test_a_node_and_a_gpu_variable_filter_every_per_gpu_panel():
    names = {v["name"]: v for v in BOARD["templating"]["list"]}
    assert "Hostname" in names["node"]["query"]["query"] and names["node"]["includeAll"]
    assert "$node" in names["gpu"]["query"]["query"]
    for panel in BOARD["panels"]:
        for expr in exprs(panel):
            if "jax_nbmem_kernel_" in expr and "by (Hostname)" not in expr:
                assert "$gpu" in expr, (panel["title"], expr)


def test_an_all_nodes_view_a_gpu_table_and_the_dcgm_join_in_bytes():
    titles = {panel["title"]: panel for panel in BOARD["panels"]}
    (nodes,) = [p for t, p in titles.items() if t.startswith("All nodes")]
    assert exprs(nodes) == ["sum by (Hostname) (jax_nbmem_kernel_gpu_memory_bytes)"]
    (table,) = [p for p in BOARD["panels"] if p["type"] == "table"]
    assert any('kind="blocking-preallocation"' in e for e in exprs(table))
    (dcgm,) = [p for p in BOARD["panels"] if any("DCGM_FI_DEV_FB_USED" in e for e in exprs(p))]
    (join,) = exprs(dcgm)
    assert "DCGM_FI_DEV_FB_USED * 1048576" in join and "on (UUID)" in join
    assert "label_replace" not in json.dumps(BOARD)
    (idle,) = [p for t, p in titles.items() if t.startswith("Idle kernels")]
    assert "on (UUID, pid)" in exprs(idle)[0]  # per GPU: a two-GPU kernel shows where it holds
