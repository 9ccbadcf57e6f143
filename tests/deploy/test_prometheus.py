"""The metrics against a real Prometheus: the docs' scrape config, the rules, the dashboard.

Debian's prometheus scrapes, every second, the node exporter (TLS and basic auth, as the
docs' "JupyterHub node" config says, with ``--defer-to-servers``), a Jupyter server with
two kernels on the simulated GPU (one preallocated, one ``off``), and a dcgm-exporter stand-in
(a static page with dcgm's labels, in MiB); a neighbour process that is no kernel holds memory
too. Then, through Prometheus's HTTP API: every byte counted once over all targets, every
dashboard expression and every rule answering as expected, the dcgm join's ratio, and — with
NVML hung, then gone — health saying so within two scrapes and no warning reading 0.
"""

import http.server
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from jax_nbmem.simgpu import GIB, SimState
from tests.cli.test_webconfig import PASSWORD, make_web_config
from tests.deploy.prometheus import REPO, RULES, Prometheus, promtool, tool
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel
pytest_plugins = ("tests.jupyterlab",)

MIB = 1024**2
SCRAPE_S = 1.0
EXPORTER_INTERVAL_S = 0.5
STALE_AFTER_S = 3.0
# The server's horizon, max(3 × refresh, deadline): loose enough for a loaded machine.
SERVER_STALE_AFTER_S = 3.0
# What the simulated GPU's processes hold: the truth a sum over targets must give.
PRE, OFF, NEIGHBOUR = 60 * GIB, 2 * GIB, 5 * GIB


def readme_scrape_config(name: str) -> dict:
    """The YAML block after ``<!-- scrape-config: NAME -->`` in the docs' metrics page."""
    text = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    match = re.search(rf"<!-- scrape-config: {name} -->\s*```yaml\n(.*?)```", text, re.S)
    assert match, f"no scrape config {name!r} in docs/metrics.md"
    return yaml.safe_load(match.group(1))


def dashboard_expressions() -> list[tuple[str, str]]:
    """(where, expr) of every query in the Grafana dashboard: variables, panels, annotations."""
    board = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    found = []
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") == "query" and query:
            found.append((f"variable {variable['name']}", query))
    for annotation in board.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            found.append((f"annotation {annotation['name']}", annotation["expr"]))
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    return found


def substitute(expr: str) -> str:
    """The expression as Grafana sends it with every variable on "All" (a regex)."""
    expr = re.sub(r"label_values\((.*),\s*(\w+)\)$", r"group by (\2) (\1)", expr.strip())
    expr = re.sub(r"\$__(rate_)?interval", "1m", expr)
    expr = re.sub(r'=~"\$\{?\w+\}?"', '=~".*"', expr)
    expr = re.sub(r'="\$\{?\w+\}?"', '=~".*"', expr)
    return expr


class _Dcgm(http.server.BaseHTTPRequestHandler):
    page = b""

    def do_GET(self):  # noqa: N802 (the base's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args):
        pass


@pytest.fixture
def dcgm():
    """A dcgm-exporter stand-in: set ``dcgm.page``; its address is ``dcgm.address``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dcgm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.address = f"127.0.0.1:{server.server_port}"
    yield server
    server.shutdown()


def kernelspecs(root: Path) -> Path:
    """IPython kernels that import jax at start (their maps say JAX): preallocating, and off."""
    for name, env in (("jaxpre", {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.75"}),
                      ("jaxoff", {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})):  # fmt: skip
        spec = root / "share" / "jupyter" / "kernels" / name
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                     "--IPKernelApp.exec_lines=import jax"],
            "display_name": name, "language": "python", "env": env,
        }))  # fmt: skip
    return root / "share" / "jupyter"


def server_call(server, path, method="GET", body=None):
    request = urllib.request.Request(
        f"{server.base_url}/{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=15) as reply:
        return json.loads(reply.read())


def check_metrics(url: str, **kwargs) -> str:
    """What promtool check metrics says of the jax_nbmem_* families at ``url``."""
    import ssl

    context = ssl.create_default_context(cafile=kwargs.pop("ca")) if "ca" in kwargs else None
    request = urllib.request.Request(url, headers=kwargs.pop("headers", {}))
    with urllib.request.urlopen(request, timeout=10, context=context) as reply:
        text = reply.read().decode()
    assert "jax_nbmem_up" in text
    done = promtool("check", "metrics", stdin=text)
    return "\n".join(
        line for line in (done.stdout + done.stderr).splitlines() if "jax_nbmem" in line
    )


@pytest.mark.timeout(240)
def test_prometheus_sees_each_byte_once_and_health_when_nvml_fails(
    start_lab_server, sim_state, simgpu_env, tmp_path, dcgm
):
    tool("prometheus")
    share = tmp_path / "share"
    share.mkdir(mode=0o1777)
    config = tmp_path / "jupyter-config"
    config.mkdir()
    settings = {"refresh_interval": EXPORTER_INTERVAL_S, "refresh_deadline": SERVER_STALE_AFTER_S}
    (config / "jupyter_server_config.json").write_text(json.dumps({"JaxNbMemServer": settings}))
    sim_state.gpu(0, total=80 * GIB).write()
    env = {
        **simgpu_env,
        "JAX_PLATFORMS": "cpu",
        "JAX_NBMEM_SHARE_DIR": str(share),
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_PATH": str(kernelspecs(tmp_path / "k")),
    }
    lab = start_lab_server(env=env)
    ids = {}
    for notebook, kernel in (("work/pre.ipynb", "jaxpre"), ("off.ipynb", "jaxoff")):
        body = {"path": notebook, "type": "notebook", "kernel": {"name": kernel}}
        session = server_call(lab, "api/sessions", "POST", body)
        ids[notebook] = session["kernel"]["id"]
    pids = wait_for("the kernels' PIDs", lambda: (
        (k := {k["kernel_id"]: k["pid"] for k in
               server_call(lab, "jax-nbmem/api/status")["kernels"] if k["pid"]})
        and len(k) == 2 and k))  # fmt: skip
    pre, off = pids[ids["work/pre.ipynb"]], pids[ids["off.ipynb"]]
    neighbour = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    state = SimState(sim_state.path).gpu(0, total=80 * GIB)
    state.process(0, pre, PRE).process(0, off, OFF).process(0, neighbour.pid, NEIGHBOUR).write()
    truth = PRE + OFF + NEIGHBOUR

    web = make_web_config(tmp_path / "tls")
    (tmp_path / "password").write_text(PASSWORD)
    (tmp_path / "token").write_text(lab.token)
    exporter = subprocess.Popen(
        [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
         "--interval", str(EXPORTER_INTERVAL_S), "--stale-after", str(STALE_AFTER_S),
         "--share-dir", str(share), "--defer-to-servers", "--web.config.file", str(web)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    prometheus = None
    try:
        line = exporter.stdout.readline()
        assert line.startswith("jax-nbmem exporter: serving https://"), line
        exporter_address = line.split("//", 1)[1].split("/", 1)[0]
        uuid = server_call(lab, "jax-nbmem/api/status")["gpus"][0]["uuid"]
        hostname = socket.gethostname()
        fb_used_mib = truth // MIB  # dcgm's FB_USED is nvidia-smi's used: reserved apart
        dcgm.RequestHandlerClass.page = (
            "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
            f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{uuid}",device="nvidia0",'
            f'modelName="NVIDIA H200 (simulated)",Hostname="{hostname}"}} {fb_used_mib}\n'
        ).encode()

        scrape = readme_scrape_config("jupyterhub node")
        jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
        node, servers = jobs["jax_nbmem"], jobs["jax_nbmem_servers"]
        node["tls_config"]["ca_file"] = str(web.parent / "cert.pem")
        node["basic_auth"]["password_file"] = str(tmp_path / "password")
        node["static_configs"] = [{"targets": [exporter_address]}]
        servers["metrics_path"] = "/metrics"  # no hub in front of this server
        servers["authorization"]["credentials_file"] = str(tmp_path / "token")
        servers["static_configs"] = [{"targets": [f"127.0.0.1:{lab.port}"]}]
        scrape["scrape_configs"].append(
            {"job_name": "dcgm", "static_configs": [{"targets": [dcgm.address]}]}
        )
        scrape["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s",
                            "evaluation_interval": "1s"}  # fmt: skip
        scrape["rule_files"] = [RULES.name]
        prometheus = Prometheus(yaml.safe_dump(scrape), tmp_path / "prometheus")

        def everything_in():
            up = {t["labels"]["job"]: t["health"] for t in prometheus.targets()}
            kernels = prometheus.query("count by (job) (jax_nbmem_kernel_gpu_memory_bytes)")
            warned = prometheus.query('jax_nbmem_warnings{kind="blocking-preallocation"} > 0')
            ready = up == {"jax_nbmem": "up", "jax_nbmem_servers": "up", "dcgm": "up"}
            # Steady: the server's two kernels from it (once it claims them), the rest from the
            # exporter; a handover between two scrapes is over within one scrape.
            counts = {s["job"]: v for s, v in kernels}
            want = {"jax_nbmem_servers": 2, "jax_nbmem": 1}
            return ready and counts == want and warned and up

        wait_for("every target up with every kernel", everything_in, timeout=60)

        # One source per fact: each process once, the sum the simulated GPU's truth, at every
        # moment of a few scrapes — unless a source said it could not speak then (its scrape
        # failed, or its snapshot was stale): its series are then absent by design, and the sum
        # short. Never more than the truth, and never short with every source up and fresh.
        began = time.time()
        time.sleep(4 * SCRAPE_S)
        end = time.time() - SCRAPE_S  # every scrape before this is in

        def over_window(expr: str) -> dict[float, float]:
            data = prometheus.api("query_range", query=expr, start=began, end=end, step="250ms")
            return {float(t): float(v) for r in data["result"] for t, v in r["values"]}

        sums = over_window("sum(jax_nbmem_kernel_gpu_memory_bytes)")
        sources = '{job=~"jax_nbmem|jax_nbmem_servers"}'
        speaking = over_window(f"min(up{sources}) * min(jax_nbmem_up{sources})")
        moments = sorted(set(sums) | set(speaking))
        unexplained = [t for t in moments if sums.get(t) != truth and speaking.get(t) == 1]
        print(json.dumps({"moments": len(moments), "truth": list(sums.values()).count(truth),
                          "a_source_down_or_stale": len(moments) - len(speaking)
                          + list(speaking.values()).count(0)}))  # fmt: skip
        assert truth in sums.values() and max(sums.values()) == truth, (sums, speaking)
        assert not unexplained, [(t, sums.get(t)) for t in unexplained]
        assert (
            prometheus.query("count by (UUID, pid) (jax_nbmem_kernel_gpu_memory_bytes) > 1") == []
        )
        by_pid = {s["pid"]: s for s, _ in prometheus.query("jax_nbmem_kernel_gpu_memory_bytes")}
        assert by_pid[str(pre)]["job"] == "jax_nbmem_servers"
        assert by_pid[str(pre)]["notebook"] == "work/pre.ipynb" and by_pid[str(pre)]["UUID"] == uuid
        assert by_pid[str(neighbour.pid)]["job"] == "jax_nbmem"
        assert prometheus.query('jax_nbmem_gpu_memory_used_bytes{job="jax_nbmem_servers"}') == []
        ((_, used),) = prometheus.query("sum(jax_nbmem_gpu_memory_used_bytes)")
        assert used == truth  # R510+ drivers: used is the processes', reserved apart
        prealloc = {s["pid"]: v for s, v in prometheus.query("jax_nbmem_kernel_preallocated")}
        assert prealloc[str(pre)] == 1 and prealloc[str(off)] == 0

        # The dcgm join: bytes against MiB × 1048576, on UUID, without relabelling.
        ((labels, ratio),) = prometheus.query(
            "sum by (UUID) (jax_nbmem_kernel_gpu_memory_bytes) / on (UUID) group_left "
            "(Hostname, modelName) sum by (UUID, Hostname, modelName) "
            "(DCGM_FI_DEV_FB_USED * 1048576)"
        )
        assert ratio == pytest.approx(truth / (fb_used_mib * MIB)) and labels["Hostname"]

        # Every rule as Prometheus evaluates it: the recordings, and no alert firing now...
        rules = yaml.safe_load(RULES.read_text())["groups"]
        for rule in (r for group in rules for r in group["rules"]):
            answer = prometheus.query(rule["expr"])
            if "kube_pod_owner" in rule["expr"]:
                continue  # kernels in pods: none here (jax_nbmem.rules.test.yml tests it)
            if "record" in rule:
                assert answer, rule["record"]
            else:
                assert answer == [], (rule["alert"], answer)
        recorded = []

        def per_node():
            query = "node:jax_nbmem_kernel_gpu_memory_bytes:sum"
            recorded.append([(s.get("Hostname"), v) for s, v in prometheus.query(query)])
            return recorded[-1] == [(socket.gethostname(), truth)]

        # The rule group runs every second, after its scrapes.
        wait_for("the recording rules", per_node, timeout=10)
        # ... and the idle alert's joins, with its hour cut to nothing: the preallocated kernel
        # that blocks, once, on its GPU; not the off kernel, not the neighbour.
        (idle,) = [r for g in rules for r in g["rules"] if r.get("alert", "").endswith("BlocksGpu")]
        blocking = prometheus.query(idle["expr"].replace("> 3600", ">= 0"))
        parts = [prometheus.query(q) for q in (
            "jax_nbmem_kernel_idle_seconds", "jax_nbmem_kernel_preallocated",
            'jax_nbmem_warnings{kind="blocking-preallocation"}')]  # fmt: skip
        assert [(s["pid"], s["UUID"]) for s, _ in blocking] == [(str(pre), uuid)], parts

        # Every dashboard expression, its variables on "All", answers (JAX's own counters come
        # from beacons, which these kernels, without jax_nbmem loaded, do not write).
        for where, expr in dashboard_expressions():
            if "jax_nbmem_kernel_jax_" not in expr:
                assert prometheus.query(substitute(expr)), (where, substitute(expr))

        # promtool lints what both sources serve.
        assert check_metrics(f"https://{exporter_address}/metrics", ca=str(web.parent / "cert.pem"),
                             headers={"Authorization": "Basic " + __import__("base64").b64encode(
                                 f"prometheus:{PASSWORD}".encode()).decode()}) == ""  # fmt: skip
        assert check_metrics(f"{lab.base_url}/metrics",
                             headers={"Authorization": f"token {lab.token}"}) == ""  # fmt: skip

        def health():
            up = {s["job"]: v for s, v in prometheus.query("jax_nbmem_up")}
            nvml = {s["job"]: (s["reason"], v) for s, v in prometheus.query("jax_nbmem_nvml_up")}
            zeros = prometheus.query("jax_nbmem_warnings == 0")
            gpu = prometheus.query("jax_nbmem_kernel_gpu_memory_bytes")
            return up, nvml, zeros, gpu

        within = SERVER_STALE_AFTER_S + 2 * SCRAPE_S + 1.5  # the horizon, two scrapes, slack
        # NVML hangs: every call takes 4 s. Both sources go stale and withhold their series.
        SimState(sim_state.path).gpu(0, total=80 * GIB).process(0, pre, PRE).process(
            0, off, OFF).process(0, neighbour.pid, NEIGHBOUR).slow("any", 4).write()  # fmt: skip
        began = time.monotonic()
        stale = {"jax_nbmem": 0, "jax_nbmem_servers": 0}
        up, nvml, zeros, gpu = wait_for(
            "both sources stale", lambda: (h := health())[0] == stale and h, timeout=20
        )
        took_hung = time.monotonic() - began
        assert nvml == {"jax_nbmem": ("stale", 0), "jax_nbmem_servers": ("stale", 0)}
        assert zeros == [] and gpu == []
        # NVML gone: the driver is not loaded. Fresh snapshots say so; still no 0 warning.
        SimState(sim_state.path).gpu(0, total=80 * GIB).no_driver().write()
        began = time.monotonic()
        up, nvml, zeros, gpu = wait_for("NVML down on both", lambda: (
            (h := health())[1] == {"jax_nbmem": ("driver_not_loaded", 0),
                                   "jax_nbmem_servers": ("driver_not_loaded", 0)} and h),
            timeout=30)  # fmt: skip
        took_gone = time.monotonic() - began
        assert up == {"jax_nbmem": 1, "jax_nbmem_servers": 1}
        assert zeros == [] and gpu == []
        assert prometheus.query('jax_nbmem_warnings{kind="blocking-preallocation"}') == []
        print(json.dumps({"stale_seen_after_s": round(took_hung, 1),
                          "nvml_down_seen_after_s": round(took_gone, 1)}))  # fmt: skip
        assert took_hung < within
        # The hung call (4 s) must end before the sources can look again.
        assert took_gone < 4 + within
    finally:
        if prometheus is not None:
            prometheus.stop()
        exporter.send_signal(signal.SIGTERM)
        exporter.wait(15)
        neighbour.kill()
        neighbour.wait()
