"""The ``jax-nbmem`` command: GPU status, metrics, and kernelspecs that start in a mode.

jax-nbmem status [--json]
jax-nbmem exporter [--listen HOST:PORT] [--interval S] [--share-dir DIR] [--stale-after S]
                   [--defer-to-servers] [--web.config.file FILE] [--insecure]
jax-nbmem kernel install --allocator MODE [--name NAME] [--display-name TEXT]
                         [--user | --sys-prefix | --prefix PATH]
jax-nbmem kernel list [--json] [--prefix PATH]
jax-nbmem kernel remove NAME [--prefix PATH]
"""

from __future__ import annotations

import argparse
import json
import sys

from jax_nbmem.allocator.modes import ModeError, mode_forms, parse_mode

__all__ = ["main"]


def _kernel_install(args: argparse.Namespace) -> int:
    from jax_nbmem.cli.kernelspec import KernelSpecError, install

    try:
        mode = parse_mode(args.allocator)
    except ModeError as exc:
        print(f"jax-nbmem: --allocator: {exc}", file=sys.stderr)
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
        print(f"jax-nbmem: {exc}", file=sys.stderr)
        return 1
    print(f"Installed kernelspec {kernel.name} in {kernel.resource_dir}")
    print(f'  "{kernel.display_name}": allocator mode {kernel.allocator}')
    for name, value in kernel.env.items():
        print(f"  {name}={value}")
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
        print(f"{kernel.name:<{width}}  {kernel.allocator:<14} {kernel.display_name}")
        print(f"{'':<{width}}  {kernel.resource_dir}")
    return 0


def _kernel_remove(args: argparse.Namespace) -> int:
    from jax_nbmem.cli.kernelspec import KernelSpecError, remove

    try:
        folder = remove(args.name, args.prefix)
    except KernelSpecError as exc:
        print(f"jax-nbmem: {exc}", file=sys.stderr)
        return 1
    print(f"Removed kernelspec {args.name} ({folder})")
    return 0


def _status(args: argparse.Namespace) -> int:
    from jax_nbmem.tenants.status import collect, format_status

    report = collect(share_dir=args.share_dir)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_status(report))
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
    try:
        exporter = Exporter(
            args.listen,
            args.interval,
            args.share_dir,
            stale_after=args.stale_after,
            defer_to_servers=args.defer_to_servers,
            web_config=args.web_config_file,
            insecure=args.insecure,
        )
    except ValueError as error:
        print(f"jax-nbmem exporter: {error}", file=sys.stderr)
        return 2
    try:
        exporter.serve(ready=lambda url: print(f"jax-nbmem exporter: serving {url}", flush=True))
    except OSError as error:
        print(f"jax-nbmem exporter: cannot listen on {args.listen}: {error}", file=sys.stderr)
        return 1
    return 0


def _system_kernels() -> str:
    try:
        from jupyter_core.paths import SYSTEM_JUPYTER_PATH

        return f"{SYSTEM_JUPYTER_PATH[0]}/kernels"
    except Exception:
        return "Jupyter data directory"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jax-nbmem", description="See and control JAX's GPU memory for Jupyter kernels."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    status = commands.add_parser("status", help="GPUs, who holds their memory, and warnings")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.add_argument(
        "--share-dir",
        metavar="DIR",
        help="also read the beacons kernels write to DIR (default: $JAX_NBMEM_SHARE_DIR)",
    )
    status.set_defaults(run=_status)

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
        help="read the beacons kernels write to DIR (default: $JAX_NBMEM_SHARE_DIR)",
    )
    exporter.add_argument(
        "--stale-after",
        type=float,
        metavar="S",
        help="seconds after which a snapshot is stale: jax_nbmem_up 0, no GPU series "
        "(default: 3 intervals)",
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
    exporter.set_defaults(run=_exporter)

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
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
