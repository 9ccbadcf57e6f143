"""The server extension in a real Jupyter server, on the simulated GPU, with real kernels.

The status route, its authentication, the gauges on the server's own /metrics (parsed with
prometheus_client's parser), the shutdown route with its XSRF check, and a slow NVML that must
not hold up the server.
"""

import http.cookiejar
import json
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jax_nbmem.simgpu import GIB, SimState
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel
pytest_plugins = ("tests.jupyterlab",)


def call(server, path, method="GET", body=None, token=True, opener=None, headers=None):
    """(status, decoded body) of a request to the server; HTTP errors are answers too."""
    request = urllib.request.Request(
        f"{server.base_url}/{path.lstrip('/')}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            **({"Authorization": f"token {server.token}"} if token else {}),
            "Content-Type": "application/json",
            **(headers or {}),
        },
    )
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=15) as reply:
            text = reply.read().decode()
            status = reply.status
    except urllib.error.HTTPError as error:
        text, status = error.read().decode(), error.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def metrics(server) -> dict:
    """``{(name, frozenset(labels)): value}`` of the jax_nbmem samples on /metrics."""
    status, text = call(server, "metrics")
    assert status == 200, text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("jax_nbmem_"):
                found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def start_session(server, notebook: str, name: str | None = None) -> dict:
    """A notebook session; with *name*, as JupyterLab starts one (the kernel then gets the
    notebook's full path in ``$JPY_SESSION_NAME``)."""
    body = {"path": notebook, "type": "notebook", "kernel": {"name": "python3"}}
    status, session = call(
        server, "api/sessions", "POST", {**body, **({"name": name} if name else {})}
    )
    assert status == 201, session
    return session


def kernel_pids(server) -> dict[str, int]:
    """Kernel id → PID, as the extension's status reports them."""
    status, report = call(server, "jax-nbmem/api/status")
    if status != 200:
        return {}
    return {k["kernel_id"]: k["pid"] for k in report["kernels"] if k["pid"]}


@pytest.fixture
def gpu_server(start_lab_server, sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    return start_lab_server(env={**simgpu_env, "JAX_PLATFORMS": "cpu"})


def test_status_and_metrics_name_every_kernel_and_follow_a_shutdown(gpu_server, sim_state):
    server = gpu_server
    assert call(server, "jax-nbmem/api/status", token=False)[0] == 403
    first, second = start_session(server, "work/a.ipynb"), start_session(server, "b.ipynb")
    ids = (first["kernel"]["id"], second["kernel"]["id"])
    pids = wait_for(
        "both kernels' PIDs", lambda: (p := kernel_pids(server)) and all(i in p for i in ids) and p
    )
    state = SimState(sim_state.path).gpu(0, total=80 * GIB)
    state.process(0, pids[ids[0]], 10 * GIB).process(0, pids[ids[1]], 20 * GIB).write()

    def both_on_the_gpu():
        status, report = call(server, "jax-nbmem/api/status")
        on_gpu = {k["kernel_id"]: k for k in report.get("kernels", []) if k["gpu_memory_bytes"]}
        return report if set(ids) <= set(on_gpu) else None

    report = wait_for("both kernels on the GPU", both_on_the_gpu)
    kernels = {k["kernel_id"]: k for k in report["kernels"]}
    assert (
        kernels[ids[0]]["notebook"] == "work/a.ipynb" and kernels[ids[1]]["notebook"] == "b.ipynb"
    )
    assert kernels[ids[0]]["gpu_memory_bytes"] == 10 * GIB
    processes = {p["pid"]: p for p in report["processes"]}
    assert processes[pids[ids[0]]]["kind"] == "kernel"
    assert processes[pids[ids[0]]]["notebook_shown"] == "work/a.ipynb"
    assert report["server"]["age_s"] < 10 and report["server"]["problem"] is None
    # The same report as `jax-nbmem status --json`, plus kernels and server.
    assert {"nvml", "gpus", "processes", "warnings", "notes"} <= set(report)

    found = wait_for(
        "the kernels' gauges",
        lambda: (
            (m := metrics(server))
            and any(name == "jax_nbmem_kernel_gpu_memory_bytes" for name, _ in m)
            and m
        ),
    )
    uuid = report["gpus"][0]["uuid"]
    # Its own kernels only: the GPU-wide gauges are the node's (the exporter's), not a server's.
    assert not any(name.startswith("jax_nbmem_gpu_memory") for name, _ in found)
    assert found[("jax_nbmem_up", frozenset())] == 1.0
    mine = {
        dict(labels)["kernel_id"]: (dict(labels), value)
        for (name, labels), value in found.items()
        if name == "jax_nbmem_kernel_gpu_memory_bytes"
    }
    labels, value = mine[ids[0]]
    assert value == 10 * GIB
    assert labels["notebook"] == "work/a.ipynb" and labels["gpu_uuid"] == labels["UUID"] == uuid
    assert labels["user"] and labels["pid"] == str(pids[ids[0]])
    kinds = {dict(labels)["kind"] for (name, labels) in found if name == "jax_nbmem_warnings"}
    assert "blocking-preallocation" in kinds

    # Shut the second kernel down through the extension: it leaves the metrics.
    status, answer = call(server, f"jax-nbmem/api/kernels/{ids[1]}/shutdown", "POST", {})
    assert status == 200 and answer == {"kernel_id": ids[1], "stopped": True}
    assert call(server, f"jax-nbmem/api/kernels/{ids[1]}/shutdown", "POST", {})[0] == 404
    SimState(sim_state.path).gpu(0, total=80 * GIB).process(0, pids[ids[0]], 10 * GIB).write()
    wait_for(
        "the stopped kernel to leave the metrics",
        lambda: not any(dict(labels).get("kernel_id") == ids[1] for _, labels in metrics(server)),
    )
    assert ids[1] not in {k["id"] for k in call(server, "api/kernels")[1]}


def test_a_cookie_login_needs_the_xsrf_token_to_shut_a_kernel_down(gpu_server):
    server = gpu_server
    kernel_id = start_session(server, "c.ipynb")["kernel"]["id"]
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    # The board page, opened with the token once, logs the browser in (cookies, as a person).
    status, page = call(server, f"jax-nbmem/?token={server.token}", token=False, opener=opener)
    assert status == 200 and "GPU board" in page
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    path = f"jax-nbmem/api/kernels/{kernel_id}/shutdown"
    assert call(server, path, "POST", {}, token=False, opener=opener)[0] == 403  # no XSRF
    assert kernel_id in {k["id"] for k in call(server, "api/kernels")[1]}
    status, answer = call(
        server, path, "POST", {}, token=False, opener=opener, headers={"X-XSRFToken": xsrf}
    )
    assert status == 200 and answer["stopped"], answer


@pytest.mark.timeout(300)
def test_fifty_kernels_and_a_slow_nvml_never_hold_up_the_server(
    start_lab_server, sim_state, simgpu_env, tmp_path
):
    # Kernels that only sleep: the server starts and lists them like any other.
    spec = tmp_path / "kernels" / "share" / "jupyter" / "kernels" / "sleeper"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", "import time; time.sleep(600)", "{connection_file}"],
        "display_name": "sleeper", "language": "python",
    }))  # fmt: skip
    sim_state.gpu(0, total=80 * GIB).slow("processes", 2.0).write()  # NVML takes 2 s
    env = {
        **simgpu_env,
        "JAX_PLATFORMS": "cpu",
        "JUPYTER_PATH": str(tmp_path / "kernels" / "share" / "jupyter"),
    }
    server = start_lab_server(env=env)
    for _ in range(50):
        status, kernel = call(server, "api/kernels", "POST", {"name": "sleeper"})
        assert status == 201, kernel
    report = wait_for(
        "a snapshot of the 50 kernels",
        lambda: (
            (r := call(server, "jax-nbmem/api/status"))[0] == 200
            and len(r[1]["kernels"]) == 50
            and r[1]
        ),
    )
    assert report["server"]["refresh_took_s"] >= 2.0  # the slow NVML was in it

    def timed(path):
        began = time.perf_counter()
        status, _ = call(server, path)
        assert status == 200
        return time.perf_counter() - began

    # Requests during three refreshes (each 2 s in NVML) never wait for NVML: a bound in
    # seconds that any machine meets; the figures (median and max in ms) are measured by
    # benchmarks/serving_costs.py.
    slowest = 0.0
    end = time.monotonic() + 6
    while time.monotonic() < end:
        slowest = max(slowest, timed("jax-nbmem/api/status"), timed("api/kernels"))
    assert slowest < 1.5, f"a request took {slowest:.2f} s: it waited for the 2 s NVML"


def test_the_scope_says_whose_processes_the_metrics_carry():
    from jax_nbmem.server.extension import JaxNbMemServer, _stale_after, metrics_snapshot

    class Monitor:
        def snapshot(self):
            return {"server": {"taken_at": 5.0, "refresh_took_s": 0.1},
                    "kernels": [{"pid": 11}, {"pid": None}, {"pid": 12}]}  # fmt: skip

    ours = metrics_snapshot(Monitor(), "kernels")
    assert ours.own_pids == frozenset({11, 12}) and ours.taken_at == 5.0 and ours.took_s == 0.1
    assert metrics_snapshot(Monitor(), "node").own_pids is None  # the whole node
    assert JaxNbMemServer().metrics_scope == "kernels"
    assert _stale_after(JaxNbMemServer()) == 10.0  # max(3 × 2 s, the 10 s deadline)


def test_the_panels_plotly_js_is_served_to_logged_in_users_once_per_browser(gpu_server):
    import http.client
    from pathlib import Path

    from jax_nbmem.server.handlers import plotly_dir

    expected = (plotly_dir() / "plotly.min.js").read_bytes()
    path = "/jax-nbmem/static/plotly.min.js"

    def get(headers: dict) -> http.client.HTTPResponse:
        connection = http.client.HTTPConnection("127.0.0.1", gpu_server.port, timeout=15)
        connection.request("GET", path, headers=headers)
        reply = connection.getresponse()
        reply.body = reply.read()
        connection.close()
        return reply

    anonymous = get({})
    assert anonymous.status in (302, 403) and b"plotly" not in anonymous.body
    token = {"Authorization": f"token {gpu_server.token}"}
    reply = get(token)
    assert reply.status == 200 and reply.body == expected
    assert reply.getheader("Content-Type").startswith("text/javascript")
    assert "no-cache" in reply.getheader("Cache-Control")
    again = get({**token, "If-None-Match": reply.getheader("Etag")})
    assert again.status == 304 and not again.body  # the browser's copy is still good
    assert Path(plotly_dir()).name == "package_data"
