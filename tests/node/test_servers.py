"""A real Jupyter server: its notebook sessions name kernels; dead servers cost nothing; shutdown.

The server runs on a free loopback port with a token and a runtime folder of its own, as
``jupyter server`` does for a user; notebooks are opened through its REST API as JupyterLab
opens them.
"""

import http.server
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from types import SimpleNamespace

import psutil
import pytest

from jax_nbmem.gpu.nvml import GpuMemory, GpuProcess
from jax_nbmem.node.servers import SessionIndex, find_servers, kernel_sessions, shutdown_kernel
from jax_nbmem.tenants.attribution import attribute
from tests.ipython_session import clean_environ
from tests.kernels import running_kernel
from tests.waiting import wait_for

pytestmark = pytest.mark.kernel

GiB = 1 << 30
GPUS = [GpuMemory(0, "GPU-0", "Simulated GPU", 16 * GiB, 2 * GiB, 14 * GiB)]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(server, method, endpoint, body=None):
    request = urllib.request.Request(
        server.url + endpoint,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


def _answers(server):
    # The runtime file can appear a moment before the server listens.
    try:
        return _call(server, "GET", "api/status") is not None
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    (root / "work").mkdir()
    runtime = tmp_path_factory.mktemp("runtime")
    token = secrets.token_hex(24)
    env = clean_environ()
    env["JUPYTER_RUNTIME_DIR"] = str(runtime)
    log = open(tmp_path_factory.mktemp("log") / "server.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={_free_port()}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        found = wait_for("the server's runtime file", lambda: find_servers(str(runtime)))[0]
        wait_for("the server to answer", lambda: _answers(found))
        yield SimpleNamespace(info=found, token=token, root=root, runtime=str(runtime))
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


def _open_notebook(server, path):
    """Open a notebook as JupyterLab does; return (session id, kernel id, kernel pid)."""
    session = _call(
        server.info,
        "POST",
        "api/sessions",
        {
            "path": path,
            "name": os.path.basename(path),
            "type": "notebook",
            "kernel": {"name": "python3"},
        },
    )
    kernel_id = session["kernel"]["id"]

    def kernel_pid():
        with_connection_file = f"kernel-{kernel_id}.json"
        for child in psutil.Process(server.info.pid).children(recursive=True):
            try:
                arguments = child.cmdline()
            except psutil.Error:  # a short-lived helper that is already a zombie, or gone
                continue
            if any(arg.endswith(with_connection_file) for arg in arguments):
                return child.pid
        return None

    return session["id"], kernel_id, wait_for("the kernel process", kernel_pid)


@pytest.fixture(scope="module")
def notebook(server):
    return _open_notebook(server, "work/train.ipynb")


def test_a_running_server_is_found_without_showing_its_token(server):
    servers = find_servers(server.runtime)

    assert [s.url for s in servers] == [server.info.url]
    assert server.info.url.startswith("http://127.0.0.1:") and server.info.url.endswith("/")
    assert servers[0].root_dir == str(server.root)
    assert servers[0].pid is not None and psutil.pid_exists(servers[0].pid)
    assert server.token not in repr(servers) and server.token not in str(servers)


def test_a_renamed_notebook_is_named_by_its_server(server, notebook):
    session_id, kernel_id, kernel_pid = notebook
    index = kernel_sessions(runtime_dir=server.runtime, max_age=0)
    assert index.unreachable == ()
    assert index.get(kernel_id).notebook == str(server.root / "work" / "train.ipynb")
    assert index.get(kernel_id).execution_state in ("idle", "starting", "busy")

    # The user renames the notebook in JupyterLab: the server follows, the kernel's own
    # JPY_SESSION_NAME keeps the name it started with.
    _call(server.info, "PATCH", f"api/sessions/{session_id}", {"path": "work/renamed.ipynb"})
    assert psutil.Process(kernel_pid).environ()["JPY_SESSION_NAME"].endswith("train.ipynb")
    index = kernel_sessions(runtime_dir=server.runtime, max_age=0)

    tenant = attribute(
        [GpuProcess(kernel_pid, 0, GiB)], GPUS, sessions=index, check_device_files=False
    )[0]

    assert (tenant.kind, tenant.kernel_id) == ("kernel", kernel_id)
    assert tenant.notebook == str(server.root / "work" / "renamed.ipynb")
    assert tenant.notebook_shown == "work/renamed.ipynb"  # as the server shows it
    assert tenant.server_url == server.info.url
    assert tenant.idle_s is not None and tenant.idle_s >= 0
    assert server.token not in repr(tenant) and server.token not in json.dumps(tenant.to_dict())


def test_attribution_asks_the_servers_itself_when_a_kernel_is_found(server, notebook, monkeypatch):
    _, kernel_id, kernel_pid = notebook
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", server.runtime)

    tenant = attribute([GpuProcess(kernel_pid, 0, GiB)], GPUS, check_device_files=False)[0]

    assert tenant.kernel_id == kernel_id and tenant.server_url == server.info.url


def test_answers_are_reused_for_a_few_seconds(server, notebook):
    first = kernel_sessions(runtime_dir=server.runtime, max_age=0)
    assert kernel_sessions(runtime_dir=server.runtime) is first
    assert kernel_sessions(runtime_dir=server.runtime, max_age=0) is not first


def test_dead_and_silent_servers_cost_no_exception(server, notebook, tmp_path, capsys):
    _, kernel_id, _ = notebook
    shutil.copy(server.info.runtime_file, tmp_path)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts connections into its backlog, never answers
    dead_port = _free_port()
    secret = secrets.token_hex(24)
    stale = {"url": f"http://127.0.0.1:{dead_port}/", "token": secret, "pid": os.getpid()}
    quiet = {"url": f"http://127.0.0.1:{silent.getsockname()[1]}/", "token": secret}
    gone = {"url": "http://127.0.0.1:9/", "token": secret, "pid": _exited_pid()}
    for name, info in [
        ("jpserver-1.json", stale),
        ("nbserver-2.json", quiet),
        ("jpserver-3.json", gone),
    ]:
        (tmp_path / name).write_text(json.dumps({**info, "pid": info.get("pid", os.getpid())}))
    try:
        index = kernel_sessions(runtime_dir=str(tmp_path), timeout=0.5, max_age=0)
    finally:
        silent.close()

    assert index.get(kernel_id) is not None  # the live server still answered
    assert len(index.unreachable) == 2  # the file of an exited server is not even tried
    assert any(f":{dead_port}/" in why for why in index.unreachable)
    assert any("did not answer within 0.5 s" in why for why in index.unreachable)
    shown = repr(index) + "".join(index.unreachable) + "".join(capsys.readouterr())
    assert secret not in shown and server.token not in shown


def test_the_token_travels_only_in_a_header(tmp_path):
    seen = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            body = b"[]"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    secret = secrets.token_hex(24)
    info = {"url": f"http://127.0.0.1:{listener.server_port}/lab/", "token": secret}
    (tmp_path / "jpserver-7.json").write_text(json.dumps({**info, "pid": os.getpid()}))
    try:
        index = kernel_sessions(runtime_dir=str(tmp_path), max_age=0)
    finally:
        listener.shutdown()
        listener.server_close()

    assert index.unreachable == () and dict(index.kernels) == {}
    assert sorted(seen) == [
        ("/lab/api/kernels", f"token {secret}"),
        ("/lab/api/sessions", f"token {secret}"),
    ]


def _exited_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait(30)
    return process.pid


def test_shutdown_refuses_what_is_not_our_kernel(server):
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        listed = [GpuProcess(plain.pid, 0, GiB), GpuProcess(os.getpid(), 0, GiB)]
        tenants = attribute(listed, GPUS, sessions=SessionIndex({}), check_device_files=False)

        refused = shutdown_kernel(plain.pid, tenants, confirm=True)
        assert (refused.done, refused.how) == (False, None)
        assert "is not a Jupyter kernel" in refused.message
        assert plain.poll() is None

        itself = shutdown_kernel(os.getpid(), tenants, confirm=True)
        assert not itself.done and "this kernel" in itself.message
        elsewhere = shutdown_kernel(_exited_pid(), tenants, confirm=True)
        assert not elsewhere.done and "not among the processes using the GPU" in elsewhere.message
    finally:
        plain.kill()
        plain.wait(10)


@pytest.mark.skipif(os.geteuid() != 0, reason="starting another user's process needs root")
def test_shutdown_refuses_another_users_process():
    theirs = subprocess.Popen(["sleep", "120"], user="nobody")
    try:
        tenants = attribute(
            [GpuProcess(theirs.pid, 0, GiB)],
            GPUS,
            sessions=SessionIndex({}),
            check_device_files=False,
        )
        assert tenants[0].user == "nobody"

        refused = shutdown_kernel(theirs.pid, tenants, confirm=True)

        assert not refused.done and "belongs to user nobody" in refused.message
        assert theirs.poll() is None
    finally:
        theirs.kill()
        theirs.wait(10)


def test_shutdown_goes_through_the_kernels_server_once_confirmed(server):
    _, kernel_id, kernel_pid = _open_notebook(server, "work/scratch.ipynb")
    index = kernel_sessions(runtime_dir=server.runtime, max_age=0)
    tenants = attribute(
        [GpuProcess(kernel_pid, 0, GiB)], GPUS, sessions=index, check_device_files=False
    )

    asked = shutdown_kernel(kernel_pid, tenants, confirm=False, runtime_dir=server.runtime)
    assert (asked.done, asked.how) == (False, "server")
    assert (
        asked.message.startswith("Would shut down kernel PID") and "scratch.ipynb" in asked.message
    )
    kernel = psutil.Process(kernel_pid)
    assert kernel.is_running()

    done = shutdown_kernel(kernel_pid, tenants, confirm=True, runtime_dir=server.runtime)

    assert (done.done, done.how) == (True, "server")
    assert server.token not in done.message
    _, alive = psutil.wait_procs([kernel], timeout=30)
    assert alive == []
    assert kernel_id not in [k["id"] for k in _call(server.info, "GET", "api/kernels")]


def test_shutdown_signals_a_kernel_no_server_knows():
    with running_kernel() as (manager, _):
        pid = manager.provisioner.process.pid
        tenants = attribute(
            [GpuProcess(pid, 0, GiB)], GPUS, sessions=SessionIndex({}), check_device_files=False
        )
        assert tenants[0].kind == "kernel" and tenants[0].server_url is None

        done = shutdown_kernel(pid, tenants, confirm=True)

        assert (done.done, done.how) == (True, "signal")
        # Stopped: gone, or a zombie waiting for its parent (the kernel manager) to reap it.
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


class _Trickler:
    """A 'Jupyter server' that answers one byte every 0.3 s, forever: slow, never silent."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn):
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000
        with conn:
            for byte in reply:
                if self.stop.wait(0.3):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def close(self):
        self.stop.set()
        self.listener.close()


def _asking_threads():
    return [t for t in threading.enumerate() if t.name.startswith("jax-nbmem-jpy")]


def test_a_trickling_server_costs_one_deadline_and_leaves_nothing_behind(tmp_path):
    trickler = _Trickler()
    info = {"url": f"http://127.0.0.1:{trickler.port}/", "token": "t", "pid": os.getpid()}
    (tmp_path / "jpserver-5.json").write_text(json.dumps(info))
    own = psutil.Process()

    def our_requests():  # client sockets to the trickler (its own accepted ones are not ours)
        return [
            c for c in own.net_connections(kind="tcp") if c.raddr and c.raddr.port == trickler.port
        ]

    try:
        for _ in range(4):
            began = time.monotonic()
            index = kernel_sessions(runtime_dir=str(tmp_path), timeout=0.6, max_age=0)
            took = time.monotonic() - began
            assert took < 0.6 + 2.0, took  # one deadline (and some grace), however it trickles
            assert any("did not answer within 0.6 s" in why for why in index.unreachable)
            assert _asking_threads() == []
        # One connection per query: no request kept going in the background.
        assert trickler.connections == 4
        assert our_requests() == []
    finally:
        trickler.close()


def test_a_server_at_another_address_is_never_sent_its_token(tmp_path):
    # 192.0.2.1 is a documentation address: contacting it would hang until the deadline.
    secret = secrets.token_hex(24)
    info = {"url": "http://192.0.2.1:8888/", "hostname": "192.0.2.1", "port": 8888,
            "token": secret, "pid": os.getpid()}  # fmt: skip
    (tmp_path / "jpserver-6.json").write_text(json.dumps(info))
    began = time.monotonic()
    index = kernel_sessions(runtime_dir=str(tmp_path), timeout=1.0, max_age=0)
    assert time.monotonic() - began < 0.5  # refused at once, not tried
    (why,) = index.unreachable
    assert "not asked" in why and "not on this machine's loopback" in why
    assert secret not in why


def test_a_server_on_every_address_or_a_unix_socket_is_asked_on_this_machine(tmp_path):
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"[]"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    listener = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    path = str(tmp_path / "jupyter.sock")
    unix = http.server.ThreadingHTTPServer(path, Answer, bind_and_activate=False)
    unix.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.socket.bind(path)
    unix.socket.listen(4)
    unix.server_address = ("localhost", 0)  # what the handler reports as the client
    threading.Thread(target=unix.serve_forever, daemon=True).start()
    wildcard = {"url": f"http://myhost:{listener.server_port}/", "hostname": "0.0.0.0",
                "port": listener.server_port, "token": "t", "pid": os.getpid()}  # fmt: skip
    on_socket = {"sock": path, "url": "http://localhost:0/", "token": "t", "pid": os.getpid()}
    (tmp_path / "jpserver-8.json").write_text(json.dumps(wildcard))
    (tmp_path / "jpserver-9.json").write_text(json.dumps(on_socket))
    try:
        index = kernel_sessions(runtime_dir=str(tmp_path), timeout=2.0, max_age=0)
        assert index.unreachable == ()
        assert {s.url.split(":")[0] for s in find_servers(str(tmp_path))} == {"http", "http+unix"}
    finally:
        for server in (listener, unix):
            server.shutdown()
            server.server_close()
