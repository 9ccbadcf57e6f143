"""The ``jax-nbmem`` command: GPU status, metrics, and kernelspecs that start in a mode.

jax-nbmem --version | -V
jax-nbmem status [--json]
jax-nbmem exporter [--listen HOST:PORT] [--interval S] [--share-dir DIR] [--stale-after S]
                   [--defer-to-servers] [--web.config.file FILE] [--insecure] [--no-agent]
                   [--agent-listen HOST:PORT] [--kubernetes auto|on|off] [--node-name NODE]
                   [--pod-names-visible own|all|none|NS,...]
jax-nbmem cull [--idle S] [--warn S] [--every S] [--share F] [--exempt USER] [--dry-run] [--once]
               [--hub-url URL] [--share-dir DIR] [--log FILE] [--listen HOST:PORT]
               [--config FILE] [--generate-config [FILE]]
jax-nbmem shutdown PID [--yes | --dry-run] [--hub-url URL] [--share-dir DIR] [--log FILE] [--json]
                   [--deadline SECONDS]
jax-nbmem kernel install --allocator MODE [--name NAME] [--display-name TEXT]
                         [--user | --sys-prefix | --prefix PATH]
jax-nbmem kernel list [--json] [--prefix PATH]
jax-nbmem kernel remove NAME [--prefix PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jax_nbmem._version import __version__
from jax_nbmem.allocator.modes import ModeError, mode_forms, parse_mode
from jax_nbmem.cli.cullcommand import add_cull
from jax_nbmem.text import printable_lines

__all__ = ["main"]


def _kernel_install(args: argparse.Namespace) -> int:
    from jax_nbmem.cli.kernelspec import KernelSpecError, install

    try:
        mode = parse_mode(args.allocator)
    except ModeError as exc:
        print(printable_lines(f"jax-nbmem: --allocator: {exc}"), file=sys.stderr)
        return 2
    prefix = sys.prefix if args.sys_prefix else args.prefix
    try:
        kernel = install(
            mode,
            name=args.name,
            display_name=args.display_name,
            user=args.user,
            prefix=prefix,
            replace=args.replace,
            provisioner=args.provisioner,
        )
    except KernelSpecError as exc:
        print(printable_lines(f"jax-nbmem: {exc}"), file=sys.stderr)
        return 1
    print(printable_lines(f"Installed kernelspec {kernel.name} in {kernel.resource_dir}"))
    print(printable_lines(f'  "{kernel.display_name}": allocator mode {kernel.allocator}'))
    for name, value in kernel.env.items():
        print(printable_lines(f"  {name}={value}"))
    return 0


def _kernel_list(args: argparse.Namespace) -> int:
    from jax_nbmem.cli.kernelspec import list_kernels

    kernels = list_kernels(args.prefix)
    if args.json:
        print(json.dumps([kernel.to_dict() for kernel in kernels], indent=2))
        return 0
    if not kernels:
        print("No jax_nbmem kernelspecs installed (jax-nbmem kernel install --allocator off).")
        return 0
    width = max(len(kernel.name) for kernel in kernels)
    for kernel in kernels:
        print(
            printable_lines(f"{kernel.name:<{width}}  {kernel.allocator:<14} {kernel.display_name}")
        )
        print(printable_lines(f"{'':<{width}}  {kernel.resource_dir}"))
    return 0


def _kernel_remove(args: argparse.Namespace) -> int:
    from jax_nbmem.cli.kernelspec import KernelSpecError, remove

    try:
        folder = remove(args.name, args.prefix)
    except KernelSpecError as exc:
        print(printable_lines(f"jax-nbmem: {exc}"), file=sys.stderr)
        return 1
    print(printable_lines(f"Removed kernelspec {args.name} ({folder})"))
    return 0


def _share_dir(given: str | None) -> str | None:
    """The share directory a host command reads: given, $JAX_NBMEM_SHARE_DIR, or the default."""
    from jax_nbmem.node.sharedir import find_share_dir

    return find_share_dir(given).path


def _log_to_stderr() -> None:
    """The exporter's log (what it serves, the agent's socket, its proven kernels) on stderr."""
    import logging

    from jax_nbmem.text import NeutralFormatter

    logger = logging.getLogger("jax_nbmem")
    if not logger.handlers:  # warnings of every part, as without a handler; INFO: its own
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(NeutralFormatter("%(message)s"))  # users' words, neutralised
        logger.addHandler(handler)
    logging.getLogger("jax_nbmem.exporter").setLevel(logging.INFO)


def _status(args: argparse.Namespace) -> int:
    from jax_nbmem.tenants.advice import AT_SHELL
    from jax_nbmem.tenants.status import collect, format_status

    report = collect(share_dir=_share_dir(args.share_dir), read_at=AT_SHELL)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(printable_lines(format_status(report)))
    return 0


def _shutdown(args: argparse.Namespace) -> int:
    from jax_nbmem.cli.deadline import within
    from jax_nbmem.cli.hubapi import HubError, hub_from_environment, own_server_from_environment
    from jax_nbmem.cli.stop import StopError, find, stop

    def work():
        hub = hub_from_environment(args.hub_url)
        kernel = find(args.pid, _share_dir(args.share_dir))
        return kernel, stop(
            kernel, hub, dry_run=args.dry_run, log_path=args.log,
            own_server=own_server_from_environment(),
        )  # fmt: skip

    try:
        kernel, stopped = within(args.deadline, work)
    except (HubError, StopError, TimeoutError) as error:
        print(printable_lines(f"jax-nbmem shutdown: {error}"), file=sys.stderr)
        return 1
    if args.json:  # JSON escapes every control character a notebook name may carry
        print(json.dumps({
            "pid": kernel.pid, "kernel_id": kernel.kernel_id, "user": kernel.user,
            "user_source": kernel.user_source, "hub_user": kernel.hub_user,
            "notebook": kernel.notebook, "how": stopped.how,
            "server": stopped.server, "done": not args.dry_run,
            "gpu_bytes": kernel.gpu_bytes, "freed_bytes": stopped.freed,
            "free_bytes_after": stopped.free_after, "message": stopped.message,
        }, indent=2))  # fmt: skip
    else:
        print(printable_lines(stopped.message))
    return 0


def _exporter(args: argparse.Namespace) -> int:
    from jax_nbmem.cli.exporter import Exporter

    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        print(
            "jax-nbmem exporter needs prometheus_client: pip install 'jax_nbmem[server]'",
            file=sys.stderr,
        )
        return 2
    from jax_nbmem.cli.exporter_settings import ExporterSettings

    _log_to_stderr()
    try:
        settings = ExporterSettings(
            listen=args.listen,
            interval=args.interval,
            share_dir=_share_dir(args.share_dir),
            stale_after=args.stale_after,
            defer_to_servers=args.defer_to_servers,
            web_config=args.web_config_file,
            insecure=args.insecure,
            agent=not args.no_agent,
            agent_listen=args.agent_listen,
            kubernetes=args.kubernetes,
            node_name=args.node_name,
            pod_names_visible=args.pod_names_visible,
        )
        exporter = Exporter(settings)
    except ValueError as error:
        print(printable_lines(f"jax-nbmem exporter: {error}"), file=sys.stderr)
        return 2
    from jax_nbmem.agent.server import AgentDirError

    try:
        exporter.serve(
            ready=lambda url: print(
                printable_lines(f"jax-nbmem exporter: serving {url}"), flush=True
            )
        )
    except AgentDirError as error:
        print(
            printable_lines(f"jax-nbmem exporter: no node agent: {error} (or --no-agent)"),
            file=sys.stderr,
        )
        return 2
    except OSError as error:
        print(
            printable_lines(f"jax-nbmem exporter: cannot listen on {args.listen}: {error}"),
            file=sys.stderr,
        )
        return 1
    return 0


def _system_kernels() -> str:
    try:
        from jupyter_core.paths import SYSTEM_JUPYTER_PATH

        return f"{SYSTEM_JUPYTER_PATH[0]}/kernels"
    except Exception:
        return "Jupyter data directory"


def _argparse_text(text: str) -> str:
    """``text`` as an argparse help, which formats it with %: a ``%jaxmem`` in it kept."""
    return text.replace("%", "%%")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jax-nbmem", description="See and control JAX's GPU memory for Jupyter kernels."
    )
    # The version the build stamps into the installed package (``[tool.hatch.version]``).
    parser.add_argument(
        "-V", "--version", action="version", version=f"jax-nbmem {__version__}",
        help="print the installed jax_nbmem's version and exit",
    )  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (_add_status, _add_exporter, _add_shutdown, add_cull, _add_kernel):
        add(commands)
    return parser


def _add_status(commands) -> None:
    """``jax-nbmem status``."""
    status = commands.add_parser("status", help="GPUs, who holds their memory, and warnings")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument(
        "--share-dir",
        metavar="DIR",
        help="also read the beacons kernels write to DIR and the node agent's resolution in "
        "DIR/agent (default: $JAX_NBMEM_SHARE_DIR, else /var/tmp/jax_nbmem where it is)",
    )
    status.set_defaults(run=_status)


def _add_exporter(commands) -> None:
    """``jax-nbmem exporter``: the node's metrics, and the node agent."""
    exporter = commands.add_parser(
        "exporter",
        help="serve the node's GPU metrics (every user's kernels) for Prometheus at /metrics",
    )
    exporter.add_argument(
        "--listen",
        default="127.0.0.1:9840",
        metavar="HOST:PORT",
        help="address to listen on (default: 127.0.0.1:9840, loopback only)",
    )
    exporter.add_argument(
        "--interval", type=float, default=5.0, help="seconds between two snapshots (default 5)"
    )
    exporter.add_argument(
        "--share-dir",
        metavar="DIR",
        help="read the beacons kernels write to DIR (default: $JAX_NBMEM_SHARE_DIR, else "
        "/var/tmp/jax_nbmem where it is)",
    )
    exporter.add_argument(
        "--stale-after",
        type=float,
        metavar="S",
        help="seconds after which a snapshot is stale (counted from the start of the refresh "
        "under way, if one is): jax_nbmem_up 0, no GPU series (default: 3 intervals)",
    )
    exporter.add_argument(
        "--defer-to-servers",
        action="store_true",
        help="leave the kernels a Jupyter server publishes on its own /metrics to it (when "
        "Prometheus scrapes those servers too)",
    )
    exporter.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS and basic auth, as Prometheus exporters read them (needed off loopback)",
    )
    exporter.add_argument(
        "--insecure",
        action="store_true",
        help="listen off loopback without TLS or basic auth (anyone who reaches it reads it)",
    )
    exporter.add_argument(
        "--no-agent",
        action="store_true",
        help="do not be the node agent (by default, with a share directory, it listens on "
        "DIR/agent/agent.sock and writes DIR/agent/resolution.json)",
    )
    exporter.add_argument(
        "--agent-listen",
        metavar="HOST:PORT",
        help="the node agent also listens on TCP there, for kernels in pods that have neither "
        "the host's PID namespace nor the share directory (on Kubernetes: the node's address, "
        "status.hostIP, port 9842 by convention); a caller is the host process holding its socket",
    )
    exporter.add_argument(
        "--kubernetes",
        choices=("auto", "on", "off"),
        default="auto",
        help="name pods from the Kubernetes API, in-cluster (auto: when run in a pod)",
    )
    exporter.add_argument(
        "--node-name",
        metavar="NODE",
        help="the Kubernetes node whose pods are named (default: $JAX_NBMEM_NODE_NAME, from "
        "the downward API's spec.nodeName)",
    )
    exporter.add_argument(
        "--pod-names-visible",
        default="own",
        metavar="WHICH",
        help="which Kubernetes namespaces' pod names a kernel may read: own (default: its own "
        "namespace's), all, none, or namespaces (comma-separated) everyone may see besides",
    )
    exporter.set_defaults(run=_exporter)


def _positive_seconds(text: str) -> float:
    from jax_nbmem.text import parse_number

    try:
        return parse_number(text, "--deadline", low=0, high=3600)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_shutdown(commands) -> None:
    """``jax-nbmem shutdown PID``."""
    from jax_nbmem.cli.hubapi import SCOPES_TEXT
    from jax_nbmem.tenants.owners import SHUTDOWN_DRY_RUN, SHUTDOWN_YES

    shutdown = commands.add_parser(
        "shutdown",
        help="stop a kernel: your own, or as an administrator another user's",
        description="Stop the Jupyter kernel PID through its server (its id from its beacon "
        "or command line), else by signal, and say what came free. Your own kernels (a hub "
        "user's through their own server, from the environment JupyterHub gives it); as root, "
        f"or with a hub API token ($JUPYTERHUB_API_TOKEN, {SCOPES_TEXT}) and --hub-url, "
        "another user's, which is logged.",
    )
    shutdown.add_argument("pid", type=int, metavar="PID", help="the kernel's process ID")
    shutdown.add_argument(
        "--hub-url",
        metavar="URL",
        help="the hub's public address, e.g. http://127.0.0.1:8000 (default: "
        "$JAX_NBMEM_HUB_URL); its API is $JUPYTERHUB_API_URL or URL/hub/api",
    )
    shutdown.add_argument(
        "--share-dir",
        metavar="DIR",
        help="read the beacons kernels write to DIR (default: $JAX_NBMEM_SHARE_DIR, else "
        "/var/tmp/jax_nbmem where it is)",
    )
    words = shutdown.add_mutually_exclusive_group()
    words.add_argument("--yes", action="store_true", help=_argparse_text(SHUTDOWN_YES))
    words.add_argument("--dry-run", action="store_true", help=_argparse_text(SHUTDOWN_DRY_RUN))
    shutdown.add_argument(
        "--log",
        type=Path,
        metavar="FILE",
        help="the administrators' log (default: $JAX_NBMEM_ADMIN_LOG, else "
        "/var/log/jax_nbmem/admin.log for root)",
    )
    shutdown.add_argument("--json", action="store_true", help="print one JSON object")
    shutdown.add_argument(
        "--deadline",
        type=_positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="give up, saying so, when the whole stop has not finished in SECONDS (default 60)",
    )
    shutdown.set_defaults(run=_shutdown)


def _add_kernel(commands) -> None:
    """``jax-nbmem kernel install|list|remove``."""
    kernel = commands.add_parser("kernel", help="kernelspecs that start in an allocator mode")
    kernel_commands = kernel.add_subparsers(dest="kernel_command", required=True)

    install = kernel_commands.add_parser(
        "install",
        help="install a kernelspec",
        description="Install a kernelspec whose kernels start in allocator mode MODE. Without "
        f"--user, --sys-prefix or --prefix it goes to the system-wide {_system_kernels()} "
        "(which may need root).",
    )
    install.add_argument(
        "--allocator",
        required=True,
        metavar="MODE",
        help=f"one of {', '.join(mode_forms())} (F: 0 < F <= 1; write 'fraction 0.3' in quotes "
        "or fraction=0.3)",
    )
    install.add_argument("--name", help="kernelspec name (default: jax-nbmem-MODE)")
    install.add_argument("--display-name", help="name shown in the launcher")
    install.add_argument(
        "--replace", action="store_true", help="overwrite a kernelspec of the same name"
    )
    install.add_argument(
        "--provisioner",
        action="store_true",
        help="launch through jax_nbmem's kernel provisioner, which applies MODE (auto, or a "
        "mode the site's policy allows) at launch, before any user code",
    )
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user")
    where.add_argument("--sys-prefix", action="store_true", help=f"install into {sys.prefix}")
    where.add_argument("--prefix", metavar="PATH", help="install into PATH/share/jupyter/kernels")
    install.set_defaults(run=_kernel_install)

    listing = kernel_commands.add_parser("list", help="list jax_nbmem kernelspecs")
    listing.add_argument("--json", action="store_true", help="print a JSON list")
    listing.add_argument("--prefix", metavar="PATH", help="also look in PATH/share/jupyter")
    listing.set_defaults(run=_kernel_list)

    remove = kernel_commands.add_parser("remove", help="remove a jax_nbmem kernelspec")
    remove.add_argument("name")
    remove.add_argument("--prefix", metavar="PATH", help="also look in PATH/share/jupyter")
    remove.set_defaults(run=_kernel_remove)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
