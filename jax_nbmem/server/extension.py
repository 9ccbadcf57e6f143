"""Loading the extension into a Jupyter server: settings, the monitor, routes and metrics."""

from __future__ import annotations

import logging
import os
from typing import Any

from traitlets import Float, Unicode
from traitlets.config import Configurable

from jax_nbmem.server.handlers import routes
from jax_nbmem.server.monitor import ServerMonitor
from jax_nbmem.tenants.beacons import ENV_SHARE_DIR
from jax_nbmem.tenants.metrics import prometheus_collector

__all__ = ["JaxNbMemServer", "load", "unload"]

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
        f"Empty: ${ENV_SHARE_DIR}, else the Jupyter runtime directory only.",
    ).tag(config=True)


def load(serverapp: Any) -> None:
    """Set up the monitor, the routes and the metrics collector in *serverapp*."""
    settings = JaxNbMemServer(parent=serverapp)
    share_dir = settings.share_dir or os.environ.get(ENV_SHARE_DIR) or None
    monitor = ServerMonitor(
        serverapp.kernel_manager,
        serverapp.session_manager,
        server_url=getattr(serverapp, "connection_url", ""),
        root_dir=getattr(serverapp, "root_dir", None),
        share_dir=share_dir,
        refresh_s=settings.refresh_interval,
        deadline_s=settings.refresh_deadline,
        history_s=settings.history_seconds,
    )
    web_app = serverapp.web_app
    web_app.settings["jax_nbmem_monitor"] = monitor
    web_app.add_handlers(".*$", routes(web_app.settings.get("base_url", "/")))
    collector = None
    try:
        import prometheus_client

        collector = prometheus_collector(monitor.snapshot)
        prometheus_client.REGISTRY.register(collector)
    except Exception:  # no prometheus_client, or a second server in this process
        log.warning("jax_nbmem: GPU metrics are not on /metrics", exc_info=True)
    web_app.settings["jax_nbmem_collector"] = collector
    monitor.start()
    serverapp.log.info(
        "jax_nbmem: GPU board at %sjax-nbmem/", web_app.settings.get("base_url", "/")
    )


async def unload(serverapp: Any) -> None:
    """Stop the monitor and take the collector off the registry."""
    settings = serverapp.web_app.settings
    monitor = settings.pop("jax_nbmem_monitor", None)
    if monitor is not None:
        await monitor.stop()
    collector = settings.pop("jax_nbmem_collector", None)
    if collector is not None:
        import prometheus_client

        try:
            prometheus_client.REGISTRY.unregister(collector)
        except KeyError:
            pass
