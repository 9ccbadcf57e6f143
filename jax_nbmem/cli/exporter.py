"""``jax-nbmem exporter``: the GPU metrics of a whole node, for Prometheus.

For bare-metal shared GPU nodes without a Jupyter server per user: one process (run it as
root or a service user, who can read every user's processes) takes a status snapshot every
``interval`` seconds on a thread of its own (NVML, attribution, the beacons of the shared
directory) and serves it at ``/metrics`` in Prometheus's text format. A scrape reads the last
snapshot only; it never waits for NVML. It listens on one address, loopback by default; any
other address needs TLS and basic auth from a web-config file (:mod:`.webconfig`) or an
explicit ``--insecure``. Its HTTP side is bounded (:mod:`.exporter_http`: a cap on
connections, a deadline per request), so that no client takes the descriptors the node agent
in the same process needs.

It is the node's one source (docs/metrics.md): every GPU and every process on it, less the
kernels a Jupyter server publishes itself when told ``--defer-to-servers`` (see
:mod:`jax_nbmem.tenants.publishers`). Its health is in its metrics: a snapshot older than
``stale_after`` seconds makes ``jax_nbmem_up`` 0 and takes the GPU-derived series away, its age
counted from the start of the refresh under way if one is (a slow refresh on a loaded machine
is not stale, a hung NVML is); its own ``process_*`` figures are there too. ``/healthz`` says
the same for probes (a kubelet's): 200 while the last snapshot is fresh, 503 and why before
the first one or once it is stale; it needs no password and tells nothing else.

With a share directory it is also the node agent (docs/containers.md, "The node agent"): it
listens on ``S/agent/agent.sock`` where kernels in containers prove who they are
(:mod:`jax_nbmem.agent.server`); at each refresh its metrics use the proven kernels' modes
and idle times, it writes ``S/agent/resolution.json`` (every NVML PID and every proven
kernel, with its container) and clears what dead kernels left. ``agent=False`` (the
command's ``--no-agent``) leaves that out.

On Kubernetes (docs/containers.md, "Kubernetes: how kernels reach the node agent") users' pods
have neither the host's PID namespace nor the share directory: ``agent_listen`` (the
command's ``--agent-listen HOST:PORT``, the node's address) makes the agent listen on TCP
too, where a kernel is proven by the host process that holds its socket and reads the
node's resolution over the same connection; without a share directory it listens on TCP
alone. In a pod (``kubernetes="auto"``, the default) it names pods from the Kubernetes API
(:mod:`jax_nbmem.agent.kubepods`): the pods of ``node_name`` (``--node-name``,
``$JAX_NBMEM_NODE_NAME``); ``pod_names_visible`` (``--pod-names-visible``) says which
namespaces' pod names a kernel may read.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from urllib.parse import parse_qs

from jax_nbmem import guide
from jax_nbmem.agent.cgroups import ContainerNames
from jax_nbmem.agent.hostproof import HostProof
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.agent.kubepods import NoPods, PodDirectory
from jax_nbmem.agent.publish import (
    ResolutionWriter,
    clean_dead,
    write_resolution,
)
from jax_nbmem.agent.server import AgentDirError, AgentServer, Registry
from jax_nbmem.cli.exporter_http import HttpFront, HttpLimits, within_descriptors
from jax_nbmem.cli.exporter_settings import (  # the command's names, as before
    DEFAULT_LISTEN,
    ENV_NODE_NAME,
    ExporterSettings,
    is_loopback,
    parse_listen,
)
from jax_nbmem.metrics.culled import culled_collector
from jax_nbmem.metrics.exposition import ScrapeCache
from jax_nbmem.metrics.metrics import Snapshot, is_fresh
from jax_nbmem.node.beacons import beacon_dirs
from jax_nbmem.node.notices import CullCounts, read_counts
from jax_nbmem.node.sharedir import DEFAULT_SHARE_DIR, ENV_SHARE_DIR, find_share_dir
from jax_nbmem.tenants.publishers import published_pids
from jax_nbmem.tenants.status import collect
from jax_nbmem.text import printable

__all__ = [
    "DEFAULT_AGENT_PORT",
    "DEFAULT_LISTEN",
    "ENV_NODE_NAME",
    "Exporter",
    "ExporterSettings",
    "is_loopback",
    "parse_listen",
]

log = logging.getLogger("jax_nbmem.exporter")  # at INFO on stderr when run as a command

DEFAULT_AGENT_PORT = 9842  # 9840: metrics, 9841: the culler's metrics
PROVEN_LOG_EVERY_S = 600.0  # the count of proven kernels in the log, at least this often


class Exporter:
    """The snapshot thread and the HTTP server (see the module)."""

    def __init__(
        self, settings: ExporterSettings | None = None, *, pods: PodDirectory | NoPods | None = None
    ):
        """``settings``: the command's options, already checked (default: every default).

        ``pods`` stands for the Kubernetes API's pods (default: as ``--kubernetes`` says).
        """
        settings = ExporterSettings() if settings is None else settings
        self.settings = settings
        self._latest: Snapshot | None = None
        self._culled: CullCounts | None = None  # the node's culler's counts (shared directory)
        self._looking_since: float | None = None  # when the refresh under way began
        self._stop = threading.Event()
        self.snapshots = 0
        self.agent: AgentServer | None = None
        self._agent_problem: str | None = None
        self._proven_said: tuple[int | None, float] = (None, 0.0)  # (count, when) last logged
        self.pods = pods if pods is not None else settings.pod_directory()
        self.viewer = HostViewer(names=ContainerNames(pods=self.pods))
        self._resolution = ResolutionWriter(settings.visibility)
        self.http_limits = HttpLimits()

    def latest(self) -> Snapshot | None:
        """The last snapshot, or None before the first."""
        return self._latest

    def take_snapshot(self) -> Snapshot:
        """A status report of the node now, with the processes left to their servers."""
        taken_at, began = time.time(), time.monotonic()
        self._start_agent_when_possible()
        host = None
        registrations = {}
        if self.agent is not None:
            views: dict = {}
            registrations = self.agent.registry.proven(views)
            host = HostProof.from_registry(registrations, self.viewer, views)
            self._say_proven(len(registrations), taken_at)
        report = dict(collect(share_dir=self.settings.share_dir, host=host))
        if self.pods is not None:
            report["kubernetes"] = self.pods.health()
        if self.agent is not None:
            self._publish(report, registrations, host)
        deferred = frozenset()
        if self.settings.defer_to_servers:
            deferred = frozenset(published_pids(beacon_dirs(self.settings.share_dir)))
        took = round(time.monotonic() - began, 4)
        return Snapshot(report, taken_at, took, deferred_pids=deferred)

    def _say_proven(self, count: int, now: float) -> None:
        """Log how many kernels the agent proves: when it changes, else every 10 minutes."""
        said, at = self._proven_said
        if count != said or now - at >= PROVEN_LOG_EVERY_S:
            log.info("jax-nbmem exporter: the node agent proves %d kernel%s now", count,
                     "" if count == 1 else "s")  # fmt: skip
            self._proven_said = (count, now)

    def _shared(self) -> str | None:
        # The command found it already (flag, variable, default); built otherwise, the variable.
        return find_share_dir(self.settings.share_dir, default=None).path

    def start_agent(self) -> None:
        """Start the node agent's socket if a share directory is there (see the module).

        AgentDirError when its directory is unsafe or another agent serves it; a share
        directory not there yet is logged, and the agent starts once it is.
        """
        shared = self._shared()
        if not self.settings.agent or self.agent is not None:
            return
        if shared is None and self.settings.agent_tcp is None:
            return
        if shared is not None and not os.path.isdir(shared):
            return  # said by _say_share_dir; tried again at each refresh
        server = AgentServer(shared, Registry(self.viewer), tcp=self.settings.agent_tcp,
                             resolution=self._resolution_for)  # fmt: skip
        server.start()
        self.agent = server
        where = [w for w in (server.path, server.tcp_address and _shown(server.tcp_address)) if w]
        log.info(
            "jax-nbmem exporter: acting as the node agent for kernels in containers: socket %s; "
            "resolution in %s",
            printable(" and TCP ".join(where)),
            printable(server.directory or "none (TCP alone: kernels ask for it)"),
        )  # fmt: skip

    def _resolution_for(self, pid: int) -> tuple[float, str] | None:
        """(written_at, the node's resolution as host PID ``pid``'s namespace may see it)."""
        seen = self.viewer.view(pid)
        namespace = seen.container.namespace if seen and seen.container else None
        return self._resolution.latest_for(namespace)

    def _start_agent_when_possible(self) -> None:
        try:
            self.start_agent()
            self._agent_problem = None
        except AgentDirError as error:
            if str(error) != self._agent_problem:
                log.error("jax-nbmem exporter: no node agent: %s", printable(error))
            self._agent_problem = str(error)

    def _publish(self, report: dict, registrations: dict, host: HostProof) -> None:
        """Write the resolution and clear what dead kernels left; a failure is logged."""
        if self.pods is not None:
            self._resolution.extra_agent = {"kubernetes": report["kubernetes"]}
        interval_s = self.settings.interval
        text = self._resolution.text(report, registrations, host.view, interval_s=interval_s)
        if self.agent.directory:  # else TCP alone (no share directory): readers ask the agent
            full = self._resolution.full_text()  # pods' names hidden from the file's readers
            try:
                write_resolution(self.agent.directory, text, None if full == text else full)
            except OSError as error:
                log.warning("jax-nbmem exporter: cannot write the resolution: %s", printable(error))
            clean_dead(self.agent.share_dir, [r.key for r in registrations.values()])
        self.viewer.forget([*registrations, *(p["pid"] for p in report.get("processes", []))])

    def _refresh_forever(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self._looking_since = time.time()
            try:
                self._latest = self.take_snapshot()
                self.snapshots += 1
            except Exception:
                log.warning("jax-nbmem exporter: a snapshot failed", exc_info=True)
            shared = self._shared()
            self._culled = read_counts([shared]) if shared else None
            self._looking_since = None
            self._stop.wait(max(0.0, self.settings.interval - (time.monotonic() - began)))

    def serve(self, ready=None) -> None:
        """Serve until SIGTERM or SIGINT (or :meth:`stop`); ``ready(url)`` once listening."""
        app = self._wsgi_app()
        settings = self.settings
        # Bounded (exporter_http): no user's connections take the descriptors the agent needs.
        limits = within_descriptors(self.http_limits)
        if limits != self.http_limits:
            log.warning("jax-nbmem exporter: at most %d HTTP connections at once (a quarter of "
                        "the open-files limit; the rest stay the node agent's)",
                        limits.max_connections)  # fmt: skip
        server = HttpFront(settings.host, settings.port, app, tls=settings.web.tls, limits=limits)
        self._server = server
        self._say_share_dir()
        try:
            self.start_agent()  # an unsafe agent directory stops it here, said
        except AgentDirError:
            server.server_close()
            raise
        if self.pods is not None:
            self.pods.start()
        refresher = threading.Thread(target=self._refresh_forever, name="jax-nbmem-exporter")
        refresher.daemon = True
        refresher.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: threading.Thread(target=server.shutdown).start())
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        scheme = "https" if settings.web.tls is not None else "http"
        url = f"{scheme}://{host}:{server.server_port}/metrics"
        if settings.insecure and not is_loopback(settings.host) and settings.web.users is None:
            log.warning(
                "jax-nbmem exporter: --insecure: anyone who reaches %s reads it", printable(url)
            )
        if ready is not None:
            ready(url)
        try:
            server.serve_forever(poll_interval=0.5)
        finally:
            self._stop.set()
            server.server_close()
            if self.agent is not None:
                self.agent.stop()
            if self.pods is not None:
                self.pods.stop()

    def _wsgi_app(self):
        """The HTTP face: /metrics (ours and the process's own), /healthz, else 401 or 404."""
        from prometheus_client import (
            CollectorRegistry,
            PlatformCollector,
            ProcessCollector,
            make_wsgi_app,
        )

        registry = CollectorRegistry(auto_describe=True)
        # Our families are written by a ScrapeCache (fast with thousands of samples, and once
        # per snapshot); the registry holds the exporter's own process_* figures.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        # The culler's count, from its file in the shared directory (read with each snapshot).
        registry.register(culled_collector(lambda: self._culled))
        own = make_wsgi_app(registry)
        written = ScrapeCache(self.settings.stale_after_s)

        def app(environ, start_response):
            if environ.get("PATH_INFO") == "/healthz":
                return self._health(start_response)
            if not self.settings.web.authorized(environ.get("HTTP_AUTHORIZATION")):
                start_response("401 Unauthorized", [
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("WWW-Authenticate", 'Basic realm="jax-nbmem exporter"'),
                ])  # fmt: skip
                return [b"jax-nbmem exporter: a user and password are needed\n"]
            if environ.get("PATH_INFO") in ("/metrics", "/metrics/"):
                return self._metrics(environ, start_response, written, own)
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"jax-nbmem exporter: the metrics are at /metrics\n"]

        return app

    def _metrics(self, environ, start_response, written: ScrapeCache, own) -> list[bytes]:
        from prometheus_client import CONTENT_TYPE_LATEST

        names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        # Staleness counts from the refresh under way, if any: a slow one (a loaded machine)
        # keeps the last snapshot fresh, a hung one not. Read before latest().
        looking_since = self._looking_since
        body = written.text(
            self.latest(), set(names) if names else None, looking_since=looking_since
        )
        captured = {}

        def keep(status, headers, exc_info=None):
            captured["status"], captured["headers"] = status, headers

        plain = {k: v for k, v in environ.items() if k != "HTTP_ACCEPT_ENCODING"}
        rest = b"".join(own(plain, keep))  # uncompressed, to follow our own text
        start_response(captured["status"], [("Content-Type", CONTENT_TYPE_LATEST)])
        return [body + rest]

    def _health(self, start_response) -> list[bytes]:
        # Before the auth check: a kubelet's probe has no password, and this says only whether
        # the last look is fresh (NVML down is no ill health: it is in /metrics).
        snapshot, looking_since = self.latest(), self._looking_since
        now = time.time()
        if is_fresh(snapshot, now, self.settings.stale_after_s, looking_since):
            status, text = "200 OK", "ok: a fresh look at the node"
        elif snapshot is None:
            status, text = "503 Service Unavailable", "starting: no look at the node yet"
        else:
            since = max(snapshot.taken_at, looking_since or 0)
            status = "503 Service Unavailable"
            text = f"stale: no fresh look at the node for {now - since:.0f} s (a hung NVML?)"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [f"jax-nbmem exporter: {text}\n".encode()]

    def _say_share_dir(self) -> None:
        """Log where beacons are read from: a missing shared directory is never silent."""
        shared = self._shared()
        if not shared:
            log.warning(
                "jax-nbmem exporter: no --share-dir (nor $%s, nor %s): other users' kernels are "
                "judged without their beacons and no node agent runs (%s; %s)",
                printable(ENV_SHARE_DIR),
                printable(DEFAULT_SHARE_DIR),
                printable(guide.page("shared-node.md", "On a shared GPU server")),
                printable(guide.page("containers.md")),
            )
        elif not os.path.isdir(shared) or not os.access(shared, os.R_OK | os.X_OK):
            log.warning(
                "jax-nbmem exporter: the share directory %s is missing or unreadable: no "
                "beacon is read from it until it is there (deploy/jax-nbmem-exporter.tmpfiles)",
                printable(shared),
            )

    def stop(self) -> None:
        """Stop serving (from another thread)."""
        self._stop.set()
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()


def _shown(address: tuple[str, int]) -> str:
    host, port = address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
