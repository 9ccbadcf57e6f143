"""A stand-in Jupyter server, run as a test's Unix user: what root's ``jax-nbmem shutdown`` sees.

Like jupyter_server it writes its runtime file (``jpserver-<pid>.json`` in the user's runtime
folder, with its port and token), lists its kernels at ``GET api/kernels`` and shuts one down
at ``DELETE api/kernels/<id>`` (token checked), and starts each kernel as a child with
``$JPY_PARENT_PID`` set. Each kernel looks like one from the host
(``... -m ipykernel_launcher -f kernel-<id>.json``); what a hostile user controls is hers to
set: the kernel's environment, the id its command line names, and a beacon it writes.

``argv[1]``: JSON ``{"token", "deletes" (a file each DELETE's id is appended to), "share"
(where beacons go), "kernels": [{"id", "command_line_id", "env", "beacon"}]}``, and what a
hostile server may do besides: ``"requests"`` (a file each request's method and path is
appended to), ``"host"``/``"port"`` (where it listens; default 127.0.0.1, any port),
``"file_host"`` (the address its runtime file names instead), ``"redirect"`` (``api/kernels``
answers 302 to this URL), ``"trickle_s"`` (``api/kernels`` sends its answer one byte every so
many seconds). Prints one JSON line, ``{"pid", "port", "kernels": {id: pid}}``, once it
serves; stdlib only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLEEPER = "import time; time.sleep(3600)"


def _start_kernel(spec: dict, runtime: str, share: str) -> subprocess.Popen:
    line_id = spec.get("command_line_id") or spec["id"]
    argv = [sys.executable, "-c", SLEEPER, "-m", "ipykernel_launcher",
            "-f", os.path.join(runtime, f"kernel-{line_id}.json")]  # fmt: skip
    env = {**os.environ, "JPY_PARENT_PID": str(os.getpid()), **spec.get("env", {})}
    kernel = subprocess.Popen(argv, env=env)
    if spec.get("beacon"):
        _write_beacon(kernel.pid, spec["beacon"], share)
    return kernel


def _write_beacon(pid: int, claims: dict, share: str) -> None:
    """A beacon file for ``pid``, written by its own user: everything in it is a claim."""
    with open(f"/proc/{pid}/stat") as f:
        ticks = int(f.read().rpartition(")")[2].split()[19])
    with open("/proc/stat") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
    content = {"schema": 1, "pid": pid, "started_at": boot + ticks / os.sysconf("SC_CLK_TCK"),
               "user": os.environ.get("USER", ""), "kernel_id": None, "notebook": "x.ipynb",
               "mode_requested": "on", "mode_in_effect": "on", "pool_fraction": 0.75,
               "gpus": {}, "cell_running": False, "last_cell_finished_at": time.time() - 7200,
               "written_at": time.time(), **claims}  # fmt: skip
    path = os.path.join(share, f"jax_nbmem-beacon-{pid}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(content, f)
    os.chmod(path + ".tmp", 0o644)
    os.replace(path + ".tmp", path)


def main() -> None:
    config = json.loads(sys.argv[1])
    token = config["token"]
    runtime = os.path.join(os.path.expanduser("~"), ".local", "share", "jupyter", "runtime")
    os.makedirs(runtime, exist_ok=True)
    kernels = {s["id"]: _start_kernel(s, runtime, config["share"]) for s in config["kernels"]}

    class Handler(BaseHTTPRequestHandler):
        def _allowed(self) -> bool:
            if config.get("requests"):
                with open(config["requests"], "a") as f:
                    f.write(f"{self.command} {self.path}\n")
            if self.headers.get("Authorization") == f"token {token}":
                return True
            self.send_response(403)
            self.end_headers()
            return False

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if not self._allowed():
                return
            if config.get("redirect"):
                self.send_response(302)
                self.send_header("Location", config["redirect"])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            listed = [{"id": k, "name": "python3", "execution_state": "idle"}
                      for k, p in kernels.items() if p.poll() is None]  # fmt: skip
            body = json.dumps(listed).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not config.get("trickle_s"):
                self.wfile.write(body)
                return
            try:
                for byte in body:  # each read gets its byte well within any per-read timeout
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(config["trickle_s"])
            except OSError:
                pass  # cut off by the caller's deadline

        def do_DELETE(self) -> None:  # noqa: N802
            if not self._allowed():
                return
            kernel_id = self.path.rstrip("/").rpartition("/")[2]
            with open(config["deletes"], "a") as f:
                f.write(kernel_id + "\n")
            kernel = kernels.get(kernel_id)
            if kernel is None or kernel.poll() is not None:
                self.send_response(404)
            else:
                kernel.terminate()
                kernel.wait()
                self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((config.get("host", "127.0.0.1"), config.get("port", 0)), Handler)
    port = server.server_address[1]
    named = config.get("file_host") or config.get("host", "127.0.0.1")
    runtime_file = os.path.join(runtime, f"jpserver-{os.getpid()}.json")
    with open(runtime_file, "w") as f:
        json.dump({"url": f"http://{named}:{port}/", "hostname": named, "port": port,
                   "token": token, "pid": os.getpid(), "base_url": "/", "secure": False,
                   "root_dir": os.path.expanduser("~")}, f)  # fmt: skip
    print(json.dumps({"pid": os.getpid(), "port": port,
                      "kernels": {k: p.pid for k, p in kernels.items()}}), flush=True)  # fmt: skip
    try:
        server.serve_forever()
    finally:
        os.unlink(runtime_file)
        for kernel in kernels.values():
            kernel.kill()


if __name__ == "__main__":
    main()
