"""What serving costs while idle, and while NVML is slow: the figures tests do not assert.

    python benchmarks/serving_costs.py [--idle-s 15] [--slow-s 6] [--json PATH]

Two rows, each on the simulated GPU (built here with gcc):

* **the exporter idle**: ``jax-nbmem exporter`` at its default 5 s interval on one GPU, its
  own CPU time (user + system) over ``--idle-s`` seconds after its first scrape, as a share of
  one core (the goal: under 0.5%);
* **the server's status route under a slow NVML**: JupyterLab with the server extension and 50
  kernels that only sleep, NVML's process listing taking 2 s, and for ``--slow-s`` seconds
  ``GET /jax-nbmem/api/status`` and ``GET /api/kernels`` back to back: each request's time,
  median and max (the goal: the median from the cache, under 0.2 s; no request ever waits the
  2 s of NVML, so the max stays under 0.5 s).

The suite keeps only what holds on any machine (the route answers while NVML hangs, in
seconds); these figures depend on the machine and its load, so they are measured here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jax_nbmem import simgpu  # noqa: E402
from tests.jupyterlab import running_lab  # noqa: E402
from tests.waiting import wait_for  # noqa: E402

GIB = 1 << 30


def _environment(folder: Path, state: simgpu.SimState) -> dict:
    library = simgpu.build(folder / "lib")
    return simgpu.env_for_subprocess(library.parent, state.path)


def exporter_idle(folder: Path, idle_s: float) -> dict:
    state = simgpu.SimState(folder / "idle.state").gpu(0, total=80 * GIB)
    state.write()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0"],
        env=_environment(folder, state), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        url = ""
        while "serving " not in url:
            url = exporter.stdout.readline()
            if not url:
                raise RuntimeError("the exporter ended before it served")
        url = url.split("serving ", 1)[1].strip()
        urllib.request.urlopen(url, timeout=10).read()
        process = psutil.Process(exporter.pid)
        time.sleep(2)  # its start-up and first scrape behind it
        before, began = sum(process.cpu_times()[:2]), time.monotonic()
        time.sleep(idle_s)
        share = (sum(process.cpu_times()[:2]) - before) / (time.monotonic() - began)
    finally:
        exporter.terminate()
        exporter.wait(15)
    return {"exporter_idle_core_percent": round(100 * share, 3), "over_s": idle_s}


def _get(server, path: str) -> float:
    request = urllib.request.Request(
        f"{server.base_url}/{path}", headers={"Authorization": f"token {server.token}"}
    )
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=15) as reply:
        reply.read()
    return time.perf_counter() - began


def status_under_slow_nvml(folder: Path, slow_s: float) -> dict:
    spec = folder / "kernels" / "share" / "jupyter" / "kernels" / "sleeper"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", "import time; time.sleep(600)", "{connection_file}"],
        "display_name": "sleeper", "language": "python",
    }))  # fmt: skip
    state = simgpu.SimState(folder / "slow.state").gpu(0, total=80 * GIB).slow("processes", 2.0)
    state.write()
    env = {
        **_environment(folder, state),
        "JAX_PLATFORMS": "cpu",
        "JUPYTER_PATH": str(folder / "kernels" / "share" / "jupyter"),
    }
    with running_lab(folder / "root", folder / "state", env=env) as server:
        for _ in range(50):
            request = urllib.request.Request(
                f"{server.base_url}/api/kernels", method="POST",
                data=json.dumps({"name": "sleeper"}).encode(),
                headers={"Authorization": f"token {server.token}"},
            )  # fmt: skip
            urllib.request.urlopen(request, timeout=30).read()

        def fifty_listed():
            request = urllib.request.Request(
                f"{server.base_url}/jax-nbmem/api/status",
                headers={"Authorization": f"token {server.token}"},
            )
            with urllib.request.urlopen(request, timeout=15) as reply:
                return len(json.loads(reply.read())["kernels"]) == 50

        wait_for("a snapshot of the 50 kernels", fifty_listed, timeout=120)
        status_s, kernels_s = [], []
        end = time.monotonic() + slow_s
        while time.monotonic() < end:
            status_s.append(_get(server, "jax-nbmem/api/status"))
            kernels_s.append(_get(server, "api/kernels"))
    return {
        "status_ms_median": round(1000 * statistics.median(status_s), 1),
        "status_ms_max": round(1000 * max(status_s), 1),
        "api_kernels_ms_max": round(1000 * max(kernels_s), 1),
        "requests": len(status_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-s", type=float, default=15.0)
    parser.add_argument("--slow-s", type=float, default=6.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jnm-serving-") as folder:
        rows = {
            "exporter_idle": exporter_idle(Path(folder), args.idle_s),
            "status_under_slow_nvml": status_under_slow_nvml(Path(folder), args.slow_s),
        }
    for name, row in rows.items():
        print(f"{name}: " + ", ".join(f"{key} {value}" for key, value in row.items()))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
