"""The tls overlay end to end: the rendered Secrets and arguments run the real exporter.

The exporter is started with the agent container's rendered arguments, its web-config Secret
written where the container mounts it (here a folder), on the simulated GPU. Then it is asked as
the rendered ServiceMonitor would ask it (the CA, server name, user and password of the scrape
Secret) and as the kubelet's probes would (HTTPS, /healthz, no password).
"""

import base64
import socket
import ssl

import pytest

from jax_nbmem.simgpu import GIB
from tests.cli.test_exporter import running_exporter
from tests.deploy.kubernetes import closed_port, containers, one, pod_environment, render
from tests.waiting import wait_for

pytest.importorskip("prometheus_client")


def secret_files(secret: dict, folder):
    folder.mkdir(parents=True)
    for name, value in secret["data"].items():
        (folder / name).write_bytes(base64.b64decode(value))
    return folder


def get(port: int, path: str, ca, server_name: str, user=None, password=None):
    """(status, body) of a GET over TLS to 127.0.0.1:port, verified for ``server_name``."""
    context = ssl.create_default_context(cafile=str(ca))
    request = f"GET {path} HTTP/1.0\r\nHost: {server_name}\r\n"
    if user is not None:
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        request += f"Authorization: Basic {pair}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=server_name) as tls:
            tls.sendall((request + "\r\n").encode())
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


@pytest.mark.timeout(120)
def test_the_rendered_secrets_serve_tls_and_basic_auth_as_the_service_monitor_asks(
    tmp_path, sim_state, simgpu_env
):
    objects = render(tmp_path / "render", "tls")
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    agent = containers(objects)["agent"]
    (mount,) = [m for m in agent["volumeMounts"] if m["name"] == "web"]
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "web"]
    web = secret_files(secrets[volume["secret"]["secretName"]], tmp_path / "web")
    args = [a.replace(mount["mountPath"], str(web)) for a in agent["args"]]
    args[args.index("--listen") + 1] = "0.0.0.0:0"
    args[args.index("--agent-listen") + 1] = "127.0.0.1:0"
    args[args.index("--share-dir") + 1] = str(tmp_path / "share")
    (tmp_path / "share").mkdir()
    endpoint = one(objects, "ServiceMonitor")["spec"]["endpoints"][0]
    scrape = secret_files(secrets[endpoint["basicAuth"]["password"]["name"]], tmp_path / "scrape")
    name = endpoint["tlsConfig"]["serverName"]
    user = (scrape / endpoint["basicAuth"]["username"]["key"]).read_text()
    password = (scrape / endpoint["basicAuth"]["password"]["key"]).read_text()
    ca = scrape / endpoint["tlsConfig"]["ca"]["secret"]["key"]
    probe = agent["livenessProbe"]["httpGet"]
    assert (probe["scheme"], endpoint["scheme"]) == ("HTTPS", "https")
    sim_state.gpu(0, total=80 * GIB).write()
    # As in a pod (--kubernetes on refuses to start outside one): the API's address, here one
    # that does not answer (its state is said, not fatal), and the node's name.
    env = {**simgpu_env, **pod_environment(agent), "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(closed_port())}  # fmt: skip
    with running_exporter(env, *args) as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        path = endpoint["path"]
        assert get(port, path, ca, name)[0] == 401
        assert get(port, path, ca, name, user, "wrong")[0] == 401
        status, text = get(port, path, ca, name, user, password)
        assert status == 200 and "jax_nbmem_up" in text
        status, said = wait_for(
            "a fresh look", lambda: (h := get(port, probe["path"], ca, name))[0] == 200 and h
        )
        assert said == "jax-nbmem exporter: ok: a fresh look at the node\n"
