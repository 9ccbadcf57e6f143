"""The node agent under attack: does an honest kernel still register, and what does it cost?

    sudo python benchmarks/agent_attack.py [--registrations 40] [--idle 2000]
                                           [--sockets 12000] [--flood-width 16]
                                           [--unread 100] [--json PATH]
                                           [--agent-tree DIR]
    sudo python benchmarks/agent_attack.py --namespaces 1040 [--beacon-bytes 64512]
                                           [--registrations 40] [--json PATH]
                                           [--agent-tree DIR]

Issue 37's goal, measured (root: a throwaway user, a network namespace, PID namespaces). The
agent runs as a process of its own (its RSS is read from ``/proc``), on a share directory and
on TCP at the host's end of a veth pair, with a node resolution of 4 MiB. Then, all at once,
one user (mallory, a real user):

- holds ``--idle`` idle TCP connections to it from a network namespace of hers (a pod);
- keeps ``--sockets`` sockets open in a second one (what makes the search for a TCP caller's
  process cost: the namespace's TCP table, and her processes' file descriptors);
- floods first lines from that second one, ``--flood-width`` connections at a time, each a
  beacon line on a new connection, again and again: each is admitted (her second pod has
  connections to spare) and makes the agent search 12,000 sockets;
- keeps ``--unread`` connections (from 5 PID namespaces of hers) that prove their process, ask
  for the resolution, and never read it.

Meanwhile an honest kernel, in a PID namespace of its own, registers ``--registrations`` times
over the Unix socket (a new connection each time, 50 ms apart): its seconds from connect to
answer, median and worst, against the same kernel with no attack in the same run; and the
agent's RSS before and at its peak during the attack. Goal: worst <= 1 s, median <= 50 ms,
RSS growth <= 20 MiB. ``--agent-tree DIR``: the agent from another checkout (``git archive
REV | tar -x -C DIR``), the rest from this one: the same attack on an agent from before.

``--namespaces N`` runs issue 45's attack instead (:func:`namespace_flood`): an ordinary user
mints N user and PID namespaces (``unshare --user --pid``, tests/hostile/minted_caller.py),
and from each proves her process honestly with a beacon of ``--beacon-bytes`` (padded under a
key the contract does not have). The agent writes its resolution as the exporter does (every
0.5 s while registrations change). Meanwhile a kernel of another user (in a container: a PID
namespace root made) registers ``--registrations`` times. Goal: every registration answered
``ok`` within 1 s, ``resolution.json`` <= 8 MiB at its largest, agent RSS growth <= 64 MiB.

``--http-flood`` runs issue 52's section instead (benchmarks/agent_attack_http.py): a slow HTTP
flood on the exporter, the agent in the same process, at the unit's 4096 open files.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALLER = Path(__file__).with_name("agent_attack_caller.py")
RESOLUTION_BYTES = 4 << 20


def serve(share: str, host: str) -> None:
    """The agent, as its own process (``--serve``): prints where it listens, runs until stdin
    closes."""
    from jax_nbmem.agent.server import AgentServer, Registry

    text = json.dumps({"schema": 1, "pad": "x" * RESOLUTION_BYTES})
    agent = AgentServer(share, Registry(), tcp=(host, 0), resolution=lambda pid: (1.0, text))
    agent.start()
    print(json.dumps({"path": agent.path, "port": agent.tcp_address[1]}), flush=True)
    sys.stdin.read()
    lookups = getattr(agent, "lookups", None)  # None: an agent from before they were
    counts = {"refused": agent.refused, "connections": agent.connections,
              "lines_judged": lookups and lookups.done}  # fmt: skip
    print(json.dumps(counts), flush=True)
    agent.stop()


def serve_published(share: str) -> None:
    """The agent that writes its resolution (``--serve-published``): prints its socket's path;
    when stdin closes, the largest resolution it wrote and the most kernels it held."""
    from jax_nbmem.agent.publish import ResolutionWriter, write_resolution
    from jax_nbmem.agent.server import AgentServer, Registry

    registry, changed, most = Registry(), threading.Event(), {"bytes": 0, "kernels": 0}
    agent = AgentServer(share, registry, on_change=changed.set)
    agent.start()
    writer, done = ResolutionWriter(), threading.Event()

    def publish() -> None:
        while not done.wait(0.5):
            if changed.is_set():
                changed.clear()
                proven = registry.proven()
                text = writer.text({}, proven, registry.viewer.view, interval_s=5.0)
                write_resolution(agent.directory, text)
                most["bytes"] = max(most["bytes"], len(text.encode()))
                most["kernels"] = max(most["kernels"], len(proven))

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    print(json.dumps({"path": agent.path}), flush=True)
    sys.stdin.read()
    done.set()
    thread.join()
    most["refused"] = agent.refused
    print(json.dumps(most), flush=True)
    agent.stop()


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


class Bench:
    """What the run made (user, namespace, veth, processes), undone by :meth:`close`."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen] = []
        self.user = f"jnatk{os.getpid() % 100000}"
        self.netns = [f"jnatk{os.getpid() % 100000}-{n}" for n in range(2)]
        self.veth = f"jnatk{os.getpid() % 100000}"[:11]
        self.network = f"10.{random.randrange(200, 255)}.{random.randrange(256)}"  # two /30s
        self.top = Path(tempfile.mkdtemp(prefix="jn-attack-"))

    def setup(self) -> None:
        _run("useradd", "-M", self.user)
        self.uid = f"{_id('-u', self.user)}:{_id('-g', self.user)}"
        self.top.chmod(0o755)
        self.share = self.top / "share"
        self.share.mkdir()
        self.share.chmod(0o1777)
        # Two pods of hers: one holds the idle connections, the other the sockets and the flood.
        for number, netns in enumerate(self.netns):
            veth, inner = f"{self.veth}{number}", "eth0"
            _run("ip", "netns", "add", netns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            _run("ip", "link", "set", f"{veth}p", "netns", netns)
            _run("ip", "addr", "add", f"{self.network}.{number * 4 + 1}/30", "dev", veth)
            _run("ip", "link", "set", veth, "up")
            inside = ["ip", "netns", "exec", netns, "ip"]
            _run(*inside, "link", "set", f"{veth}p", "name", inner)
            _run(*inside, "addr", "add", f"{self.network}.{number * 4 + 2}/30", "dev", inner)
            _run(*inside, "link", "set", inner, "up")
            _run(*inside, "link", "set", "lo", "up")
            _run(*inside, "route", "add", "default", "via", f"{self.network}.{number * 4 + 1}")

    def start(self, args: list[str], *, ready: bool = True, tree=ROOT) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        popen = subprocess.Popen(args, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
                                 cwd=ROOT, env=env, start_new_session=True)  # fmt: skip
        self.processes.append(popen)
        if ready:
            line = popen.stdout.readline().strip()
            if line != "READY":
                raise SystemExit(f"{args[:6]} did not start: {line!r}")
        return popen

    def caller(self, user: str, *args, netns: int | None = None, pid_ns: bool = False) -> list:
        prefix = ["ip", "netns", "exec", self.netns[netns]] if netns is not None else []
        prefix += ["unshare", "--pid", "--fork", "--mount-proc"] if pid_ns else []
        return [*prefix, sys.executable, str(CALLER), user, *map(str, args)]

    def close(self) -> None:
        for popen in self.processes:
            try:
                os.killpg(popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            popen.wait(30)
        for number, netns in enumerate(self.netns):
            subprocess.run(["ip", "link", "del", f"{self.veth}{number}"], capture_output=True)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        subprocess.run(["userdel", self.user], capture_output=True)
        shutil.rmtree(self.top, ignore_errors=True)


def _id(flag: str, user: str) -> str:
    return subprocess.run(["id", flag, user], capture_output=True, text=True).stdout.strip()


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _registrations(bench: Bench, path: str, count: int) -> dict:
    honest = bench.start(bench.caller("0:0", "kernel", path, count, pid_ns=True), ready=False)
    said = json.loads(honest.stdout.readline())
    seconds = said["seconds"]
    return {
        "median_ms": round(statistics.median(seconds) * 1000, 2),
        "worst_ms": round(max(seconds) * 1000, 2),
        "registered": f"{said['proven']} of {count}",
        "answers": said["answers"],
    }


# --- Issue 45: PID namespaces minted by one ordinary user ---------------------------------

MINTED = ROOT / "tests" / "hostile" / "minted_caller.py"
AS_USER = ROOT / "tests" / "hostile" / "as_user.py"


def namespace_flood(options) -> dict:
    """Issue 45's flood (see the module): its figures, as a dict."""
    names = [f"jnmint{os.getpid() % 100000}", f"jnhon{os.getpid() % 100000}"]
    top = Path(tempfile.mkdtemp(prefix="jn-minted-"))
    processes: list[subprocess.Popen] = []
    env = {**os.environ, "PYTHONPATH": str(options.agent_tree or ROOT)}
    bench = Bench()  # only its way of starting the honest kernel (and of stopping it)
    try:
        for name in names:
            _run("useradd", "-M", name)
        mallory, honest = ([_id("-u", n), _id("-g", n)] for n in names)
        top.chmod(0o755)
        share = top / "share"
        share.mkdir()
        share.chmod(0o1777)
        agent = subprocess.Popen([sys.executable, __file__, "--serve-published", str(share)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=env, start_new_session=True)  # fmt: skip
        processes.append(agent)
        path = json.loads(agent.stdout.readline())["path"]
        quiet = _kernel_of(bench, ":".join(honest), path, options.registrations)
        rss_before = _rss_mib(agent.pid)
        began = time.monotonic()
        flood = subprocess.Popen([sys.executable, str(AS_USER), *mallory, str(MINTED), path,
                                  str(options.namespaces), str(options.beacon_bytes)],
                                 stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                 start_new_session=True)  # fmt: skip
        processes.append(flood)
        said = Counter()
        peak, stop = [rss_before], threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                peak.append(_rss_mib(agent.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        for _ in range(options.namespaces):
            line = json.loads(flood.stdout.readline())
            said[next(iter(line))] += 1
        minted_s = time.monotonic() - began
        attacked = _kernel_of(bench, ":".join(honest), path, options.registrations)
        time.sleep(1.5)  # its last resolution written
        stop.set()
        sampler.join()
        agent.stdin.close()
        published = json.loads(agent.stdout.readline())
        on_disk = os.path.getsize(share / "agent" / "resolution.json")
    finally:
        for popen in processes:
            try:
                os.killpg(popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            popen.wait(60)
        for name in names:
            subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)
        bench.close()
    return {
        "attack": {"namespaces": options.namespaces, "beacon_bytes": options.beacon_bytes,
                   "answers": dict(said), "minted_s": round(minted_s, 1)},
        "quiet": quiet,
        "under_attack": attacked,
        "resolution_bytes": {"largest": published["bytes"], "last_on_disk": on_disk},
        "agent": {"most_kernels": published["kernels"], "refused": published["refused"]},
        "agent_rss_mib": {"before": round(rss_before, 1), "peak": round(max(peak), 1),
                          "growth": round(max(peak) - rss_before, 1)},
    }  # fmt: skip


def _kernel_of(bench: Bench, user: str, path: str, count: int) -> dict:
    """:func:`_registrations` by a kernel of ``user`` (UID:GID) in a container of its own."""
    honest = bench.start(bench.caller(user, "kernel", path, count, pid_ns=True), ready=False)
    said = json.loads(honest.stdout.readline())
    seconds = said["seconds"]
    return {
        "median_ms": round(statistics.median(seconds) * 1000, 2),
        "worst_ms": round(max(seconds) * 1000, 2),
        "registered": f"{said['proven']} of {count}",
        "answers": said["answers"],
    }


def _print_namespace_flood(result: dict) -> None:
    print(json.dumps(result, indent=2))
    print()
    print("| another user's kernel registering | median | worst | registered |")
    print("|---|---|---|---|")
    for name in ("quiet", "under_attack"):
        row = result[name]
        print(f"| {name.replace('_', ' ')} | {row['median_ms']} ms | {row['worst_ms']} ms | "
              f"{row['registered']} |")  # fmt: skip
    size, rss = result["resolution_bytes"], result["agent_rss_mib"]
    print(
        f"\nresolution.json: {size['largest'] / 2**20:.2f} MiB at its largest; agent RSS "
        f"{rss['before']} MiB before, {rss['peak']} MiB at peak (+{rss['growth']} MiB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registrations", type=int, default=40)
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--sockets", type=int, default=12000)
    parser.add_argument("--flood-width", type=int, default=16)
    parser.add_argument("--unread", type=int, default=100)
    parser.add_argument("--json")
    parser.add_argument("--agent-tree", help="run the agent from this checkout (a before)")
    parser.add_argument("--namespaces", type=int, help="issue 45's flood of minted namespaces")
    parser.add_argument("--beacon-bytes", type=int, default=63 * 1024)
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--serve-published", help=argparse.SUPPRESS)
    # Issue 52's section (agent_attack_http.py): a slow HTTP flood on the exporter.
    parser.add_argument(
        "--http-flood",
        action="store_true",
        help="the slow HTTP flood on the exporter at its unit's 4096 files",
    )
    parser.add_argument("--http-connections", type=int, default=5000)
    parser.add_argument("--scrapes", type=int, default=40)
    options = parser.parse_args()
    if options.serve:
        serve(*options.serve)
        return
    if options.serve_published:
        serve_published(options.serve_published)
        return
    if options.http_flood:
        from agent_attack_http import report, run

        result = run(options)
        report(result)
        if options.json:
            Path(options.json).write_text(json.dumps(result, indent=2))
        return
    if os.geteuid() != 0:
        raise SystemExit("agent_attack.py needs root (a user, namespaces, a veth pair)")
    if options.namespaces:
        result = namespace_flood(options)
        _print_namespace_flood(result)
        if options.json:
            Path(options.json).write_text(json.dumps(result, indent=2))
        return
    bench = Bench()
    try:
        bench.setup()
        agent = bench.start([sys.executable, __file__, "--serve", str(bench.share),
                             f"{bench.network}.1"], ready=False,
                            tree=options.agent_tree or ROOT)  # fmt: skip
        where = json.loads(agent.stdout.readline())
        path, port, host = where["path"], where["port"], f"{bench.network}.1"
        quiet = _registrations(bench, path, options.registrations)
        rss_before = _rss_mib(agent.pid)
        began = time.monotonic()
        bench.start(bench.caller(bench.uid, "idle", host, port, options.idle, netns=0))
        bench.start(bench.caller(bench.uid, "sockets", options.sockets, netns=1))
        bench.start(bench.caller(bench.uid, "flood", host, port, options.flood_width, netns=1))
        per_ns = max(1, options.unread // 20)  # 5 namespaces x per_ns processes x 4 connections
        for _ in range(5):
            bench.start(bench.caller(bench.uid, "unread", path, per_ns, 4, pid_ns=True))
        set_up_s = time.monotonic() - began
        peak, stop = [rss_before], threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                peak.append(_rss_mib(agent.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        attacked = _registrations(bench, path, options.registrations)
        stop.set()
        sampler.join()
        agent.stdin.close()
        counts = json.loads(agent.stdout.readline())
    finally:
        bench.close()
    result = {
        "attack": {
            "idle": options.idle,
            "sockets": options.sockets,
            "flood_width": options.flood_width,
            "unread": 5 * per_ns * 4,
            "set_up_s": round(set_up_s, 1),
        },  # fmt: skip
        "quiet": quiet,
        "under_attack": attacked,
        "agent_rss_mib": {
            "before": round(rss_before, 1),
            "peak": round(max(peak), 1),
            "growth": round(max(peak) - rss_before, 1),
        },  # fmt: skip
        "agent": counts,
    }
    print(json.dumps(result, indent=2))
    print()
    print("| an honest kernel's registration | median | worst | registered |")
    print("|---|---|---|---|")
    for name, row in (("quiet", quiet), ("under attack", attacked)):
        print(f"| {name} | {row['median_ms']} ms | {row['worst_ms']} ms | {row['registered']} |")
    rss = result["agent_rss_mib"]
    print(f"\nagent RSS: {rss['before']} MiB before, {rss['peak']} MiB at peak "
          f"(+{rss['growth']} MiB)")  # fmt: skip
    if options.json:
        Path(options.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
