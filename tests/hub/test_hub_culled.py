"""Issue 34: the documented culler's count reaches the documented Prometheus.

The culler runs exactly as docs/jupyterhub_config.py starts it as a hub service (with its
waits cut to seconds and, as the docs say to once its log is right, without --dry-run); the
node exporter runs as docs/metrics.md says (TLS and basic auth from a web-config file), and
Debian's prometheus scrapes it with the docs' "JupyterHub node" job. Alice's idle kernel that
holds a preallocated pool is warned, then culled through her server, and Prometheus reads the
cull in ``jax_nbmem_culled_kernels_total{reason="idle-preallocated"}`` from the exporter's
job: the culler keeps its count in the shared directory, where the exporter reads it.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import psutil
import pytest
import yaml

from jax_nbmem.node.agent_client import AGENT_DIR
from jax_nbmem.node.notices import read_counts
from tests.cli.test_webconfig import PASSWORD, make_web_config
from tests.deploy.prometheus import Prometheus, tool
from tests.deploy.test_prometheus import readme_scrape_config
from tests.hub.conftest import documented_config
from tests.hub.test_hub import POOL, START_JAX, Kernel, _on_gpu
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel


def _sooner(command: list[str]) -> list[str]:
    """The documented command with its waits in seconds and without --dry-run."""
    command = list(command)
    for option, value in (("--idle", "1"), ("--warn", "3"), ("--every", "1")):
        command[command.index(option) + 1] = value
    command.remove("--dry-run")
    return command


@pytest.mark.timeout(300)
def test_the_documented_culler_is_counted_where_the_documented_prometheus_scrapes(hub, tmp_path):
    tool("prometheus")
    c = documented_config({"JAX_NBMEM_HUB_URL": hub.url, "JAX_NBMEM_SHARE_DIR": str(hub.share_dir)})
    (service,) = [s for s in c.JupyterHub.services if s["name"] == "jax-nbmem-culler"]
    before = read_counts([str(hub.share_dir)])  # an earlier test's culler may have counted
    before = before.counts["idle-preallocated"] if before else 0

    web = make_web_config(tmp_path / "tls")
    (tmp_path / "password").write_text(PASSWORD)
    exporter = subprocess.Popen(
        [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
         "--interval", "0.5", "--share-dir", str(hub.share_dir), "--defer-to-servers",
         "--web.config.file", str(web)],
        env=hub.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    prometheus = culler = None
    hog = Kernel(hub, hub.alice, "culled.ipynb")
    try:
        line = exporter.stdout.readline()
        assert line.startswith("jax-nbmem exporter: serving https://"), line
        scrape = readme_scrape_config("jupyterhub node")
        (node,) = [job for job in scrape["scrape_configs"] if job["job_name"] == "jax_nbmem"]
        node["tls_config"]["ca_file"] = str(web.parent / "cert.pem")
        node["basic_auth"]["password_file"] = str(tmp_path / "password")
        node["static_configs"] = [{"targets": [line.split("//", 1)[1].split("/", 1)[0]]}]
        scrape["scrape_configs"] = [node]  # the users' servers are not what this is about
        scrape["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s"}
        prometheus = Prometheus(yaml.safe_dump(scrape), tmp_path / "prometheus")

        hog.run(START_JAX)
        _on_gpu(hub, (hog, POOL))
        culler = subprocess.Popen(
            _sooner(service["command"]),
            env={**hub.env, "JUPYTERHUB_API_TOKEN": hub.culler_token,
                 "JAX_NBMEM_ADMIN_LOG": str(tmp_path / "admin.log")},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

        def counted():
            found = prometheus.query("jax_nbmem_culled_kernels_total")
            by_reason = {s["reason"]: (s["job"], v) for s, v in found}
            return by_reason.get("idle-preallocated", (None, 0))[1] == before + 1 and by_reason

        by_reason = wait_for("the cull counted in Prometheus", counted, 90, 0.5)
        assert by_reason == {
            "idle-preallocated": ("jax_nbmem", before + 1.0),
            "idle-over-share": ("jax_nbmem", 0.0),
        }, by_reason
        assert not psutil.pid_exists(hog.pid)
    finally:
        said = ""
        if culler is not None:
            culler.terminate()
            said = culler.communicate(timeout=15)[0]
        if prometheus is not None:
            prometheus.stop()
        exporter.send_signal(signal.SIGTERM)
        exporter.wait(15)
        # The agent's resolution stays after it stops (every kernel is told the agent stopped):
        # the hub's later tests are about a node without one.
        shutil.rmtree(hub.share_dir / AGENT_DIR, ignore_errors=True)
        hog.close()
    assert f"culled: Stopped kernel PID {hog.pid}" in said, said
    events = [json.loads(x) for x in (tmp_path / "admin.log").read_text().splitlines()]
    assert any(e.get("action") == "cull" and e["pid"] == hog.pid for e in events)
