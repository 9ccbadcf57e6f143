"""agent_attack.py's ``--http-flood`` section: a slow HTTP flood on the exporter (issue 52).

    sudo python benchmarks/agent_attack.py --http-flood [--http-connections 5000]
                                           [--registrations 40] [--scrapes 40]
                                           [--agent-tree DIR] [--json PATH]

Root's exporter, the node agent in the same process, runs as the unit runs it: its own process
with ``LimitNOFILE=4096`` (deploy/jax-nbmem-exporter.service), on a share directory. One user
(a real, throwaway one) keeps ``--http-connections`` connections to its HTTP port, each with a
request she never finishes (tests/hostile/slow_http.py: a header line every 2 s, a connection
opened again whenever one is closed), from six processes. Meanwhile an honest kernel, in a PID
namespace of its own, registers with the agent ``--registrations`` times (a new connection
each time), and ``/metrics`` is fetched ``--scrapes`` times (a new connection each time): the
seconds to each answer, median and worst, against the same with no flood. Goal: every
registration and every scrape answered, the worst in <= 1 s. Also: the exporter's open files
and CPU seconds during the flood, and how often it logged an accept failure.
``--agent-tree DIR``: the exporter from another checkout (a before).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOW_HTTP = ROOT / "tests" / "hostile" / "slow_http.py"
AS_USER = ROOT / "tests" / "hostile" / "as_user.py"
UNIT_FILES = 4096
FLOOD_PROCESSES = 6


def _unit_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (UNIT_FILES, UNIT_FILES))


def _stats(seconds: list[float], asked: int) -> dict:
    answered = [s for s in seconds if s is not None]
    return {
        "answered": f"{len(answered)} of {asked}",
        "median_ms": round(statistics.median(answered) * 1000, 1) if answered else None,
        "worst_ms": round(max(answered) * 1000, 1) if answered else None,
        "slowest_ms": [round(s * 1000, 1) for s in sorted(answered)[-3:]],
    }


def _scrapes(url: str, count: int) -> dict:
    seconds = []
    for _ in range(count):
        began = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                reply.read()
            seconds.append(time.monotonic() - began)
        except OSError:
            seconds.append(None)
        time.sleep(0.05)
    return _stats(seconds, count)


def _registrations(socket_path: str, count: int, tree: Path) -> dict:
    caller = [sys.executable, str(ROOT / "benchmarks" / "agent_attack_caller.py"), "0:0",
              "kernel", socket_path, str(count)]  # fmt: skip
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *caller],
                          capture_output=True, text=True, timeout=40 * count + 60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(tree)})  # fmt: skip
    said = json.loads(done.stdout.splitlines()[0])
    return {**_stats(said["seconds"], count), "registered": f"{said['proven']} of {count}"}


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(options) -> dict:
    """The section's figures (see the module)."""
    if os.geteuid() != 0:
        raise SystemExit("agent_attack.py --http-flood needs root (a user, a PID namespace)")
    tree = Path(options.agent_tree or ROOT)
    user = f"jnhttp{os.getpid() % 100000}"
    top = Path(tempfile.mkdtemp(prefix="jn-http-flood-"))
    processes: list[subprocess.Popen] = []
    subprocess.run(["useradd", "-M", user], check=True, capture_output=True)
    try:
        top.chmod(0o755)
        share = top / "share"
        share.mkdir()
        share.chmod(0o1777)
        log = top / "exporter.log"
        with open(log, "w") as stderr:
            exporter = subprocess.Popen(
                [sys.executable, "-m", "jax_nbmem.cli", "exporter", "--listen", "127.0.0.1:0",
                 "--share-dir", str(share), "--interval", "1"],
                stdout=subprocess.PIPE, stderr=stderr, text=True, preexec_fn=_unit_limit,
                cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},  # -m: cwd comes first
            )  # fmt: skip
        processes.append(exporter)
        url = exporter.stdout.readline().split("serving ", 1)[1].strip()
        socket_path = str(share / "agent" / "agent.sock")
        quiet = {"registration": _registrations(socket_path, options.registrations, tree),
                 "scrape": _scrapes(url, options.scrapes)}  # fmt: skip
        ids = [subprocess.run(["id", flag, user], capture_output=True, text=True).stdout.strip()
               for flag in ("-u", "-g")]  # fmt: skip
        port = url.split(":")[2].split("/")[0]
        each = options.http_connections // FLOOD_PROCESSES
        for _ in range(FLOOD_PROCESSES):
            processes.append(subprocess.Popen(
                ["prlimit", f"--nofile={each + 64}", sys.executable, str(AS_USER), *ids,
                 str(SLOW_HTTP), "127.0.0.1", port, str(each)],
                stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
            ))  # fmt: skip
        began = time.monotonic()
        for flood in processes[1:]:
            flood.stdout.readline()  # {"opened": N}: each has tried its share
        set_up_s = time.monotonic() - began
        peak_files, stop = [0], threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                peak_files.append(len(os.listdir(f"/proc/{exporter.pid}/fd")))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        cpu_before, clock = _cpu_s(exporter.pid), time.monotonic()
        attacked = {"registration": _registrations(socket_path, options.registrations, tree),
                    "scrape": _scrapes(url, options.scrapes)}  # fmt: skip
        cpu = (_cpu_s(exporter.pid) - cpu_before) / (time.monotonic() - clock)
        stop.set()
        sampler.join()
    finally:
        for process in processes:
            process.kill()
            process.wait(30)
        subprocess.run(["userdel", user], capture_output=True)
        said = log.read_text() if (top / "exporter.log").exists() else ""
        shutil.rmtree(top, ignore_errors=True)
    return {
        "flood": {"connections": options.http_connections, "processes": FLOOD_PROCESSES,
                  "exporter_files_limit": UNIT_FILES, "set_up_s": round(set_up_s, 1)},
        "quiet": quiet,
        "under_flood": attacked,
        "exporter": {"peak_open_files": max(peak_files), "cpu_share": round(cpu, 2),
                     "accept_failed_lines": said.count("accept failed")},
    }  # fmt: skip


def report(result: dict) -> None:
    """The section's table, after its JSON."""
    print(json.dumps(result, indent=2))
    print("\n| slow HTTP flood | registration median | worst | scrape median | worst | answered |")
    print("|---|---|---|---|---|---|")
    for name, row in (("quiet", result["quiet"]), ("under flood", result["under_flood"])):
        reg, scrape = row["registration"], row["scrape"]
        print(f"| {name} | {reg['median_ms']} ms | {reg['worst_ms']} ms | "
              f"{scrape['median_ms']} ms | {scrape['worst_ms']} ms | "
              f"{reg['registered']}, {scrape['answered']} |")  # fmt: skip
    exporter = result["exporter"]
    print(f"\nexporter: {exporter['peak_open_files']} open files at peak (limit {UNIT_FILES}), "
          f"{exporter['cpu_share']} of a core, {exporter['accept_failed_lines']} 'accept failed' "
          "lines")  # fmt: skip
