"""What ``jax-nbmem exporter`` was asked, checked once: :class:`ExporterSettings`.

Every option of the command is a field; building the settings checks them all (a ValueError
says which and why, and nothing has started): the addresses, the interval and the staleness,
the exposure (off loopback: TLS and basic auth from ``--web.config.file``, or ``--insecure``),
which namespaces' pod names a kernel may read, and whether the Kubernetes API can be asked.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass, field

from jax_nbmem import guide
from jax_nbmem.agent.kubepods import KubeAPI, KubeError, NoPods, PodDirectory
from jax_nbmem.agent.publish import PodVisibility
from jax_nbmem.cli.webconfig import WebConfig, load_web_config
from jax_nbmem.text import printable

__all__ = ["DEFAULT_LISTEN", "ENV_NODE_NAME", "ExporterSettings", "is_loopback", "parse_listen"]

log = logging.getLogger("jax_nbmem.cli.exporter")

DEFAULT_LISTEN = "127.0.0.1:9840"
ENV_NODE_NAME = "JAX_NBMEM_NODE_NAME"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or localhost) is reachable from this machine only."""
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


def parse_listen(text: str, flag: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9840`` for IPv6) as (host, port); ValueError when malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{flag} wants HOST:PORT, e.g. {DEFAULT_LISTEN}; got {text!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise ValueError(f"{flag} wants an IP address or localhost; got {host!r}") from None
    if not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port (said at start)
        raise ValueError(f"{flag} wants a port from 0 to 65535; got {port!r}")
    return host, int(port)


@dataclass(frozen=True)
class ExporterSettings:
    """The exporter's options (the command's flags), each checked when the settings are made.

    Derived, also checked then: ``host`` and ``port`` (``listen``), ``agent_tcp``
    (``agent_listen``, or None), ``web`` (the web config file's TLS and users), ``visibility``
    (``pod_names_visible``) and ``stale_after_s`` (``stale_after``, default 3 intervals).
    """

    listen: str = DEFAULT_LISTEN
    interval: float = 5.0
    share_dir: str | None = None
    stale_after: float | None = None
    defer_to_servers: bool = False
    web_config: str | None = None
    insecure: bool = False
    agent: bool = True
    agent_listen: str | None = None
    kubernetes: str = "auto"
    node_name: str | None = None
    pod_names_visible: str = "own"
    host: str = field(init=False)
    port: int = field(init=False)
    agent_tcp: tuple[str, int] | None = field(init=False)
    web: WebConfig = field(init=False)
    visibility: PodVisibility = field(init=False)
    stale_after_s: float = field(init=False)

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError(f"--interval must be positive, not {self.interval}")
        stale = 3 * self.interval if self.stale_after is None else self.stale_after
        if stale < self.interval:
            raise ValueError(f"--stale-after must be at least --interval ({self.interval} s)")
        host, port = parse_listen(self.listen)
        agent_tcp = parse_listen(self.agent_listen, "--agent-listen") if self.agent_listen else None
        if self.kubernetes not in ("auto", "on", "off"):
            raise ValueError(f"--kubernetes wants auto, on or off, not {self.kubernetes!r}")
        visibility = PodVisibility(self.pod_names_visible)
        web = load_web_config(self.web_config) if self.web_config else WebConfig()
        if not is_loopback(host) and not self.insecure:
            parts = (("TLS", web.tls), ("basic auth", web.users))
            missing = [what for what, part in parts if part is None]
            if missing:
                raise ValueError(
                    f"--listen {self.listen} is reachable from other machines: it needs "
                    f"{' and '.join(missing)} from --web.config.file "
                    f"({guide.page('metrics.md', 'Exposure')}), or --insecure"
                    " to serve every user's notebook names in the clear"
                )
        for name, value in (
            ("host", host),
            ("port", port),
            ("agent_tcp", agent_tcp),
            ("web", web),
            ("visibility", visibility),
            ("stale_after_s", stale),
        ):
            object.__setattr__(self, name, value)  # fmt: skip

    def pod_directory(self) -> PodDirectory | NoPods | None:
        """The pods' directory ``--kubernetes`` asks for; ValueError when ``on`` cannot be."""
        return _pod_directory(self.kubernetes, self.node_name)


def _pod_directory(kubernetes: str, node_name: str | None) -> PodDirectory | NoPods | None:
    """The pods' directory for ``--kubernetes`` (auto: in a pod only); ValueError when it can't."""
    if kubernetes == "off":
        return None
    try:
        api = KubeAPI.in_cluster()
    except KubeError as error:
        if kubernetes == "on":
            raise ValueError(f"--kubernetes on: {error.reason}") from None
        return None
    node = node_name or os.environ.get(ENV_NODE_NAME) or ""
    if not node:
        why = (
            f"the node's name is needed to list its pods: --node-name or ${ENV_NODE_NAME} "
            "(the downward API's spec.nodeName), or --kubernetes off"
        )
        if kubernetes == "on":
            raise ValueError(f"--kubernetes on: {why}")
        log.warning("jax-nbmem exporter: pods unnamed: %s", printable(why))
        return NoPods("error", why)  # said in its report and metrics, not fatal
    return PodDirectory(api, node)
