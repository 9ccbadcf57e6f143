"""The exporter off loopback: TLS and basic auth from a web-config file, or --insecure."""

import base64
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from jax_nbmem.simgpu import GIB
from tests.cli.test_exporter import running_exporter

bcrypt = pytest.importorskip("bcrypt")
pytest.importorskip("prometheus_client")

PASSWORD = "s3cret-scrape"


def exporter_run(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "jax_nbmem.cli", "exporter", *args],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


@pytest.fixture
def web_config(tmp_path):
    """A web-config file with a self-signed certificate for 127.0.0.1 and one user."""
    return make_web_config(tmp_path)


def make_web_config(tmp_path):
    """``web.yml`` (and ``cert.pem``, ``key.pem``) in tmp_path; user prometheus, PASSWORD."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is missing, so no certificate can be made")
    tmp_path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem"),
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    hashed = "$2y$" + hashed[4:]  # as htpasswd writes it
    path = tmp_path / "web.yml"
    path.write_text(
        "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n"
    )
    return path


def fetch(url, ca, user=None, password=None):
    context = ssl.create_default_context(cafile=str(ca)) if url.startswith("https") else None
    headers = {}
    if user is not None:
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {pair}"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_off_loopback_without_tls_and_auth_is_refused_with_the_reason():
    done = exporter_run("--listen", "0.0.0.0:0")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "needs TLS and basic auth from --web.config.file" in done.stderr
    assert "--insecure" in done.stderr


@pytest.mark.parametrize(
    ("content", "reason"),
    [("tls_server_config:\n  cert_file: nowhere.pem\n  key_file: nowhere.pem\n",
      "cannot load the certificate"),
     ("basic_auth_users:\n  prometheus: plain-text\n", "no bcrypt hash"),
     ("listen: 1\n", "unknown keys listen"),
     ("tls_server_config: [1]\n", "tls_server_config wants")],
)  # fmt: skip
def test_a_bad_web_config_is_refused_with_its_reason(tmp_path, content, reason):
    path = tmp_path / "web.yml"
    path.write_text(content)
    done = exporter_run("--listen", "127.0.0.1:0", "--web.config.file", str(path))
    assert done.returncode == 2 and reason in done.stderr and "Traceback" not in done.stderr


@pytest.mark.timeout(120)
def test_tls_and_basic_auth_guard_the_metrics(web_config, sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    ca = web_config.parent / "cert.pem"
    with running_exporter(simgpu_env, "--listen", "0.0.0.0:0", "--web.config.file",
                          str(web_config)) as url:  # fmt: skip
        assert url.startswith("https://")
        url = "https://127.0.0.1:" + url.rsplit(":", 1)[1]
        assert fetch(url, ca)[0] == 401
        assert fetch(url, ca, "prometheus", "wrong")[0] == 401
        assert fetch(url, ca, "someone", PASSWORD)[0] == 401
        status, text = fetch(url, ca, "prometheus", PASSWORD)
        assert status == 200 and "jax_nbmem_up" in text
        assert fetch(url, ca, "prometheus", PASSWORD)[0] == 200  # the remembered pair
        with pytest.raises(OSError):  # plain HTTP gets no answer (refused or reset)
            fetch(url.replace("https:", "http:"), ca, "prometheus", PASSWORD)


@pytest.mark.timeout(120)
def test_insecure_is_explicit_and_said(sim_state, simgpu_env):
    sim_state.gpu(0, total=80 * GIB).write()
    with running_exporter(simgpu_env, "--listen", "0.0.0.0:0", "--insecure") as url:
        port = url.rsplit(":", 1)[1]
        status, text = fetch(f"http://127.0.0.1:{port}", None)
        assert status == 200 and "jax_nbmem_up" in text
