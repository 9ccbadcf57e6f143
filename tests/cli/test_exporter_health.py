"""The exporter's /healthz, which a kubelet's probes ask: fresh, starting, stale; no password."""

import urllib.error
import urllib.request

import pytest

from jax_nbmem.simgpu import GIB
from tests.cli.test_exporter import running_exporter, wait_for

pytest.importorskip("prometheus_client")


def health(url: str, **fetch_args) -> tuple[int, str]:
    """``(status, body)`` of the exporter's /healthz next to its /metrics ``url``."""
    try:
        with urllib.request.urlopen(url.replace("/metrics", "/healthz"), timeout=10,
                                    **fetch_args) as reply:  # fmt: skip
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.timeout(120)
def test_healthz_is_200_while_fresh_and_503_with_the_reason_once_nvml_hangs(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    with running_exporter(simgpu_env, "--interval", "0.5", "--stale-after", "2") as url:
        status, said = wait_for("a fresh look", lambda: (h := health(url))[0] == 200 and h)
        assert said == "jax-nbmem exporter: ok: a fresh look at the node\n"
        sim_state.slow("any", 60).write()  # every NVML call now hangs for a minute
        status, said = wait_for("stale", lambda: (h := health(url))[0] == 503 and h, timeout=20)
        assert said.startswith("jax-nbmem exporter: stale: no fresh look at the node for ")


@pytest.mark.timeout(120)
def test_healthz_says_starting_before_the_first_look(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).slow("any", 60).write()  # the first look never ends
    with running_exporter(simgpu_env, "--interval", "0.5") as url:
        assert health(url) == (503, "jax-nbmem exporter: starting: no look at the node yet\n")


@pytest.mark.timeout(120)
def test_healthz_needs_no_password_where_the_metrics_do(tmp_path, sim_state, simgpu_env):
    from tests.cli.test_webconfig import fetch, make_web_config

    web_config = make_web_config(tmp_path / "web")
    ca = web_config.parent / "cert.pem"
    sim_state.gpu(0, total=80 * GIB).write()
    with running_exporter(simgpu_env, "--listen", "0.0.0.0:0", "--web.config.file",
                          str(web_config)) as url:  # fmt: skip
        url = "https://127.0.0.1:" + url.rsplit(":", 1)[1]
        assert fetch(url, ca)[0] == 401
        status, said = wait_for("a fresh look", lambda: (h := fetch(
            url.replace("/metrics", "/healthz"), ca))[0] == 200 and h)  # fmt: skip
        assert said == "jax-nbmem exporter: ok: a fresh look at the node\n"
