"""The ServiceMonitor's scrape settings, as Prometheus itself applies them to the agent's series.

The Prometheus Operator turns the ServiceMonitor into a scrape job whose targets carry the
agent pod's own `namespace`, `pod` and `container` labels; that translation is on paper
(docs/containers.md). What follows from the endpoint's `honorLabels` and `relabelings` is
checked here with Debian's prometheus: a static target with the labels the operator gives, the
endpoint's relabelings as they are rendered, and an agent stand-in whose series name a user's
pod (a kernel) or none (a GPU, a process in no pod).
"""

import http.server
import re
import threading

import pytest
import yaml

from tests.deploy.kubernetes import one, render
from tests.deploy.prometheus import Prometheus
from tests.waiting import wait_for

AGENT = {"namespace": "jax-nbmem", "pod": "jax-nbmem-agent-x7k2p", "container": "agent",
         "service": "jax-nbmem-agent", "endpoint": "metrics"}  # fmt: skip
SERIES = (
    b"# TYPE jax_nbmem_kernel_gpu_memory_bytes gauge\n"
    b'jax_nbmem_kernel_gpu_memory_bytes{UUID="GPU-k",pid="41",container="notebook",'
    b'pod="jupyter-ada",namespace="jhub"} 3000\n'
    b'jax_nbmem_kernel_gpu_memory_bytes{UUID="GPU-k",pid="44"} 700\n'
)


def snake(key: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group().lower(), key)


@pytest.fixture
def agent_stand_in():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the base's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(SERIES)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.timeout(120)
def test_honor_labels_and_the_labeldrop_keep_the_user_s_pod_and_pin_the_agent_s_on_nothing(
    tmp_path, agent_stand_in
):
    endpoint = one(render(tmp_path, None), "ServiceMonitor")["spec"]["endpoints"][0]
    relabel = [{snake(k): v for k, v in r.items()} for r in endpoint["relabelings"]]
    without_drop = [r for r in relabel if r["action"] != "labeldrop"]
    without_drop.append({"target_label": "job", "replacement": "control"})
    jobs = []
    for name, rules in (("monitor", relabel), ("control", without_drop)):
        jobs.append({
            "job_name": name, "scrape_interval": "1s", "honor_labels": endpoint["honorLabels"],
            "static_configs": [{"targets": [agent_stand_in], "labels": AGENT}],
            "relabel_configs": rules,
        })  # fmt: skip
    prometheus = Prometheus(yaml.safe_dump({"scrape_configs": jobs}), tmp_path / "prometheus")
    try:
        query = "jax_nbmem_kernel_gpu_memory_bytes"
        found = wait_for("both jobs scraped", lambda: len(r := prometheus.query(query)) == 4 and r)
    finally:
        prometheus.stop()
    by_job_pid = {(labels["job"], labels["pid"]): labels for labels, _ in found}
    kernel, process = by_job_pid[("jax_nbmem", "41")], by_job_pid[("jax_nbmem", "44")]
    assert (kernel["pod"], kernel["namespace"], kernel["container"]) == (
        "jupyter-ada", "jhub", "notebook",
    )  # fmt: skip
    assert not {"pod", "namespace", "container"} & set(process)  # in no pod: said so
    assert "exported_pod" not in kernel
    # Without the labeldrop the agent's own pod is pinned on the process in no pod.
    assert by_job_pid[("control", "44")]["pod"] == AGENT["pod"]
    assert by_job_pid[("control", "41")]["pod"] == "jupyter-ada"  # honorLabels still wins
