"""``jax-nbmem cull``: its flags and config file (:mod:`~jax_nbmem.cli.cullconfig`), its start.

Before its first round the culler says, in one start line on stdout and in the
administrators' log: the hub and what the hub says of its token (:mod:`~jax_nbmem.cli.
hubcheck`), its thresholds, where it reads and writes, and whether it is a dry run.

A dry run checks what the real culler needs and fails as the real one would: a hub address
without a token, a token the hub refuses or that lacks a scope, a hub that does not answer:
each is an error and exit status 2 before any round, so what shows once ``--dry-run`` is
removed shows in the dry run first. A dry run with neither a hub address nor a token (the
Kubernetes base, a look at a node without a hub) checks no hub and says so. In earnest the
culler refuses to start on a refused token or a missing scope (it could warn, never stop),
and starts when the hub does not answer or answers with an error (a hub restarting with its
services), saying so: each stop then asks the hub again.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from jax_nbmem import guide
from jax_nbmem.cli.cullconfig import ConfigError, add_options, settle, write_config
from jax_nbmem.text import printable_lines
from jax_nbmem.units import format_duration

__all__ = ["add_cull", "start_line"]

_WHAT = "GPU-aware idle culling of kernels (a JupyterHub service; off unless run)"


def add_cull(commands) -> None:
    """``jax-nbmem cull``: the GPU-aware idle culler."""
    cull = commands.add_parser(
        "cull",
        help=_WHAT,
        description="Warn, then shut down through its server, each kernel idle for more than "
        "--idle seconds that holds a preallocated pool (or more than --share of a GPU) on a "
        "GPU with less free than a default JAX start needs. Never a busy kernel, never an "
        "--exempt user's. It says at start what the hub says of its token, and each round "
        "what it saw and did.",
    )
    add_options(cull)
    cull.set_defaults(run=run_cull)


def _fail(message: str) -> int:
    print(printable_lines(f"jax-nbmem cull: {message}"), file=sys.stderr)
    return 2


def run_cull(args: argparse.Namespace) -> int:
    """Settle the settings, check the hub, say the start line, then run the rounds."""
    if args.generate_config is not None:
        try:
            text = write_config(args.generate_config)
        except ConfigError as error:
            return _fail(f"{error}; nothing written")
        if text:
            print(printable_lines(text), end="")
        return 0
    try:
        args = settle(args)
    except ConfigError as error:
        return _fail(f"{error}; nothing runs")
    from jax_nbmem.node.sharedir import DEFAULT_SHARE_DIR, ENV_SHARE_DIR, find_share_dir

    share_dir = find_share_dir(args.share_dir).path
    if not share_dir or not os.path.isdir(share_dir):
        return _fail(
            f"needs the shared beacon directory of every user's kernels (--share-dir or "
            f"${ENV_SHARE_DIR}, else {DEFAULT_SHARE_DIR} where it is); "
            f"{share_dir or 'none given'} is no folder"
        )
    hub, check, refusal = _hub_and_check(args)
    if refusal:
        return _fail(refusal)
    registry, refusal = _registry(args.listen)
    if refusal:
        return _fail(refusal)
    from jax_nbmem.cli.culler import Culler
    from jax_nbmem.cli.stop import admin_log_path
    from jax_nbmem.tenants.culling import CullPolicy

    policy = CullPolicy(idle_s=args.idle, warn_s=args.warn, share=args.share,
                        exempt=frozenset(args.exempt))  # fmt: skip
    log = Path(args.log) if args.log else admin_log_path()
    culler = Culler(policy, share_dir, hub, dry_run=args.dry_run, log_path=log,
                    registry=registry)  # fmt: skip
    culler.announce(start_line(args, share_dir, hub, check, log))
    if args.once:
        culler.round()
        return 0
    try:
        culler.serve(args.every)
    except KeyboardInterrupt:
        pass
    return 0


def _hub_and_check(args):
    """(hub, its TokenCheck, a refusal to start or None) as the module says."""
    from jax_nbmem.cli.hubapi import HubError, hub_from_environment
    from jax_nbmem.cli.hubcheck import check_token

    try:
        hub = hub_from_environment(args.hub_url)
    except HubError as error:
        return None, None, f"{error}{' (checked by --dry-run)' if args.dry_run else ''}"
    if hub is None:
        if args.dry_run:
            return None, None, None
        said = ("without a hub (--hub-url and $JUPYTERHUB_API_TOKEN, as JupyterHub gives its "
                "services) it can only --dry-run")  # fmt: skip
        return None, None, said
    check = check_token(hub)
    if check.ok or not (args.dry_run or check.fatal):
        return hub, check, None
    if not args.dry_run:
        then = "; not started: it could warn kernels, never stop one"
    elif check.fatal:
        then = "; the dry run stops here: without --dry-run the culler would not start either"
    else:
        then = ("; the dry run stops here: without --dry-run the culler would start, and stop "
                "nothing until the hub answers")  # fmt: skip
    return hub, check, f"hub {hub.url}: {check.words}{then}"


def _registry(listen: str | None):
    """(the culler's own Prometheus registry or None, a refusal or None)."""
    if not listen:
        return None, None
    from jax_nbmem.cli.exporter import is_loopback, parse_listen

    try:
        host, port = parse_listen(listen)
        if not is_loopback(host):  # no TLS, no password here: the exporter has them
            raise ValueError(
                "it serves without TLS or a password, so on loopback only; off this machine "
                "Prometheus reads the count from the node exporter "
                f"({guide.page('metrics.md', 'The cull count')})"
            )
        import prometheus_client

        registry = prometheus_client.CollectorRegistry()
        prometheus_client.start_http_server(port, host, registry)
    except (ImportError, ValueError, OSError) as error:
        return None, f"cannot serve /metrics on {listen}: {error}"
    return registry, None


def start_line(args, share_dir: str, hub, check, log: Path | None) -> str:
    """The one line said before the first round (see the module)."""
    if hub is None:
        hub_words = ("no hub (no --hub-url nor $JUPYTERHUB_API_TOKEN): this dry run checks no "
                     "hub and token; without --dry-run it would refuse to start")  # fmt: skip
    elif not check.ok:
        hub_words = f"hub {hub.url}: {check.words}; it starts anyway and asks again at each stop"
    else:
        hub_words = f"hub {hub.url} (API {hub.api_url}): {check.words}"
    share = f"more than {args.share:g} of a GPU without a pool" if args.share else "pools only"
    exempt = ", ".join(sorted(args.exempt)) or "nobody"
    mode = ("dry run: it warns and stops nothing (--dry-run)" if args.dry_run
            else "in earnest: it warns and stops kernels")  # fmt: skip
    rounds = "one round (--once)" if args.once else f"a round every {format_duration(args.every)}"
    return (
        f"started, {mode}; {hub_words}; --idle {format_duration(args.idle)}, --warn "
        f"{format_duration(args.warn)}, {rounds}, {share}, exempt: {exempt}; beacons in "
        f"{share_dir}; log {log or 'none'}"
    )
