"""``jax-nbmem exporter``: the GPU metrics of a whole node, for Prometheus.

For bare-metal shared GPU nodes without a Jupyter server per user: one process (run it as
root or a service user, who can read every user's processes) takes a status snapshot every
``interval`` seconds on a thread of its own (NVML, attribution, the beacons of the shared
directory) and serves it at ``/metrics`` in Prometheus's text format. A scrape reads the last
snapshot only; it never waits for NVML. It listens on one address, loopback by default.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import socketserver
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from jax_nbmem.tenants.metrics import prometheus_collector
from jax_nbmem.tenants.status import collect

__all__ = ["DEFAULT_LISTEN", "Exporter", "parse_listen"]

log = logging.getLogger("jax_nbmem")

DEFAULT_LISTEN = "127.0.0.1:9840"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9840`` for IPv6) as (host, port); ValueError when malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"--listen wants HOST:PORT, e.g. {DEFAULT_LISTEN}; got {text!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise ValueError(f"--listen wants an IP address or localhost; got {host!r}") from None
    if not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port (said at start)
        raise ValueError(f"--listen wants a port from 0 to 65535; got {port!r}")
    return host, int(port)


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        log.debug("jax-nbmem exporter: " + format, *args)


class Exporter:
    """The snapshot thread and the HTTP server (see the module)."""

    def __init__(self, listen: str = DEFAULT_LISTEN, interval: float = 5.0, share_dir=None):
        if interval <= 0:
            raise ValueError(f"--interval must be positive, not {interval}")
        self.host, self.port = parse_listen(listen)
        self.interval = interval
        self.share_dir = share_dir
        self._latest: dict | None = None
        self._stop = threading.Event()
        self.snapshots = 0

    def latest(self) -> dict | None:
        """The last snapshot (a status report), or None before the first."""
        return self._latest

    def _refresh_forever(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self._latest = dict(collect(share_dir=self.share_dir))
                self.snapshots += 1
            except Exception:
                log.warning("jax-nbmem exporter: a snapshot failed", exc_info=True)
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def serve(self, ready=None) -> None:
        """Serve until SIGTERM or SIGINT (or :meth:`stop`); ``ready(url)`` once listening."""
        from prometheus_client import CollectorRegistry, make_wsgi_app

        registry = CollectorRegistry(auto_describe=False)
        registry.register(prometheus_collector(self.latest))
        metrics = make_wsgi_app(registry)

        def app(environ, start_response):
            if environ.get("PATH_INFO") in ("/metrics", "/metrics/"):
                return metrics(environ, start_response)
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"jax-nbmem exporter: the metrics are at /metrics\n"]

        # A class per address family: setting it on the shared class would change every server.
        server_class = _Server6 if ":" in self.host else _Server
        server = make_server(self.host, self.port, app, server_class, _QuietHandler)
        self._server = server
        refresher = threading.Thread(target=self._refresh_forever, name="jax-nbmem-exporter")
        refresher.daemon = True
        refresher.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: threading.Thread(target=server.shutdown).start())
        host = f"[{self.host}]" if ":" in self.host else self.host
        url = f"http://{host}:{server.server_port}/metrics"
        if ready is not None:
            ready(url)
        try:
            server.serve_forever(poll_interval=0.5)
        finally:
            self._stop.set()
            server.server_close()

    def stop(self) -> None:
        """Stop serving (from another thread)."""
        self._stop.set()
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
