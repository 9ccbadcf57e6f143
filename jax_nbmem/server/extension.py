"""Loading the extension into a Jupyter server: settings, the monitor, routes and metrics."""

from __future__ import annotations

import logging
from typing import Any

from traitlets import Enum, Float, Unicode
from traitlets.config import Configurable

from jax_nbmem.metrics.metrics import Snapshot, prometheus_collector
from jax_nbmem.node.beacons import beacon_dirs
from jax_nbmem.node.sharedir import ENV_SHARE_DIR, find_share_dir
from jax_nbmem.server.handlers import routes
from jax_nbmem.server.monitor import ServerMonitor
from jax_nbmem.tenants.publishers import remove_claim, write_claim
from jax_nbmem.text import printable

__all__ = ["JaxNbMemServer", "load", "share_dir_of", "unload"]

log = logging.getLogger("jax_nbmem")


class JaxNbMemServer(Configurable):
    """Settings of the jax_nbmem server extension (``c.JaxNbMemServer.*``)."""

    refresh_interval = Float(
        2.0, min=0.2, help="Seconds between two snapshots of the GPUs and this server's kernels."
    ).tag(config=True)

    refresh_deadline = Float(
        10.0,
        min=0.5,
        help="Seconds after which a snapshot still being taken (NVML or a disk slow) is said "
        "to be late; the routes never wait for it.",
    ).tag(config=True)

    history_seconds = Float(
        600.0, min=10.0, help="How far back /jax-nbmem/api/history and the board go."
    ).tag(config=True)

    share_dir = Unicode(
        "",
        help="The shared beacon directory of the node (as c.JaxNbMem.share_dir for kernels). "
        f"${ENV_SHARE_DIR} wins over it; neither: the Jupyter runtime directory only.",
    ).tag(config=True)

    metrics_scope = Enum(
        ["kernels", "node"],
        "kernels",
        help="What this server's /metrics publishes: 'kernels', only its own kernels (no "
        "GPU-wide gauges), so that a sum over every server and the node exporter counts each "
        "byte once; 'node', every GPU and process of the node, as `jax-nbmem exporter` does "
        "(a single machine where this server is the only source).",
    ).tag(config=True)


def metrics_snapshot(monitor: ServerMonitor, scope: str) -> Snapshot | None:
    """The monitor's last snapshot as the metrics serve it: in ``kernels`` scope, ours only."""
    report = monitor.snapshot()
    if report is None:
        return None
    server = report["server"]
    own = None
    if scope == "kernels":
        own = frozenset(k["pid"] for k in report.get("kernels", []) if k.get("pid"))
    return Snapshot(report, server["taken_at"], server.get("refresh_took_s"), own_pids=own)


def _stale_after(settings: JaxNbMemServer) -> float:
    """A snapshot older than this is not served as fresh: a few refreshes, or the deadline."""
    return max(3 * settings.refresh_interval, settings.refresh_deadline)


def share_dir_of(settings: JaxNbMemServer) -> str | None:
    """The share directory this server reads and writes: ``$JAX_NBMEM_SHARE_DIR``, else the setting.

    The one rule of every face (:func:`~jax_nbmem.node.sharedir.find_share_dir`); a server has
    no default (None: the Jupyter runtime directory only).
    """
    return find_share_dir(setting=settings.share_dir, default=None).path


def load(serverapp: Any) -> None:
    """Set up the monitor, the routes and the metrics collector in *serverapp*."""
    settings = JaxNbMemServer(parent=serverapp)
    share_dir = share_dir_of(settings)
    claims = beacon_dirs(share_dir) if settings.metrics_scope == "kernels" else []
    url = getattr(serverapp, "connection_url", "")

    def claim(report: dict) -> None:  # on the monitor's thread, after each snapshot
        kernels = report.get("kernels", [])
        pids = [k["pid"] for k in kernels if k.get("pid")]  # host PIDs (in a container: known
        # only through the node agent), and in a container the PIDs there, which the host maps
        here = [k["pid_in_container"] for k in kernels if k.get("pid_in_container")]
        # A claim lasts as long as the snapshot stays fresh: 3 of these "intervals".
        write_claim(claims, url=url, pids=pids, interval_s=_stale_after(settings) / 3,
                    pids_in_container=here)  # fmt: skip

    monitor = ServerMonitor(
        serverapp.kernel_manager,
        serverapp.session_manager,
        server_url=getattr(serverapp, "connection_url", ""),
        root_dir=getattr(serverapp, "root_dir", None),
        share_dir=share_dir,
        refresh_s=settings.refresh_interval,
        deadline_s=settings.refresh_deadline,
        history_s=settings.history_seconds,
        on_snapshot=claim if claims else None,
    )
    web_app = serverapp.web_app
    web_app.settings["jax_nbmem_claims"] = claims
    web_app.settings["jax_nbmem_monitor"] = monitor
    web_app.add_handlers(".*$", routes(web_app.settings.get("base_url", "/")))
    collector = None
    try:
        import prometheus_client

        collector = prometheus_collector(
            lambda: metrics_snapshot(monitor, settings.metrics_scope),
            stale_after_s=_stale_after(settings),
        )
        prometheus_client.REGISTRY.register(collector)
    except Exception:  # no prometheus_client, or a second server in this process
        log.warning("jax_nbmem: GPU metrics are not on /metrics", exc_info=True)
    web_app.settings["jax_nbmem_collector"] = collector
    monitor.start()
    serverapp.log.info(
        "jax_nbmem: GPU board at %sjax-nbmem/", printable(web_app.settings.get("base_url", "/"))
    )


async def unload(serverapp: Any) -> None:
    """Stop the monitor and take the collector off the registry."""
    settings = serverapp.web_app.settings
    monitor = settings.pop("jax_nbmem_monitor", None)
    if monitor is not None:
        await monitor.stop()
    remove_claim(settings.pop("jax_nbmem_claims", []))
    collector = settings.pop("jax_nbmem_collector", None)
    if collector is not None:
        import prometheus_client

        try:
            prometheus_client.REGISTRY.unregister(collector)
        except KeyError:
            pass
