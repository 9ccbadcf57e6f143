"""Where the host's commands find the share directory, and the node agent in it, with no flag.

The documented setup (docs/containers.md; ``deploy/jax-nbmem-exporter.tmpfiles``) makes the
share directory ``/var/tmp/jax_nbmem`` and the node agent's folder ``agent/`` in it. Root's
``jax-nbmem status``, ``shutdown``, ``cull`` and the exporter take, in this order: the
``--share-dir`` given, ``$JAX_NBMEM_SHARE_DIR``, else that folder where it is (a real
directory, not a symlink). :func:`agent_not_consulted` is the sentence a status prints when
the agent's resolution was not read on the host, so that nobody takes modes read from start
environments for the agent's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from jax_nbmem.node.beacons import ENV_SHARE_DIR

__all__ = ["DEFAULT_SHARE_DIR", "ShareDir", "agent_not_consulted", "find_share_dir"]

DEFAULT_SHARE_DIR = "/var/tmp/jax_nbmem"


@dataclass(frozen=True)
class ShareDir:
    """The share directory a command uses (``path`` None: none) and ``how`` it was found."""

    path: str | None
    how: str  # "--share-dir", "$JAX_NBMEM_SHARE_DIR", "the default", or "none"


def _is_real_directory(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def find_share_dir(
    given: str | None, environ: Mapping[str, str] | None = None, default: str = DEFAULT_SHARE_DIR
) -> ShareDir:
    """``given``, else ``$JAX_NBMEM_SHARE_DIR``, else ``default`` where it is a real directory."""
    environ = os.environ if environ is None else environ
    if given:
        return ShareDir(given, "--share-dir")
    if environ.get(ENV_SHARE_DIR):
        return ShareDir(environ[ENV_SHARE_DIR], f"${ENV_SHARE_DIR}")
    if _is_real_directory(default):
        return ShareDir(default, "the default")
    return ShareDir(None, "none")


def agent_not_consulted(reason: str | None, at_shell: bool) -> str:
    """The note of a host's status whose node agent was not read, ``reason`` being why."""
    why = f" ({reason})" if reason else ""
    point = (
        f"--share-dir DIR or export {ENV_SHARE_DIR}=DIR (the documented setup, "
        f"{DEFAULT_SHARE_DIR}, is read with no flag), where `jax-nbmem exporter --share-dir "
        "DIR` runs as root"
        if at_shell
        else f"{ENV_SHARE_DIR}=DIR where the node agent (`jax-nbmem exporter --share-dir DIR`) runs"
    )
    return (
        f"Node agent not consulted{why}: processes in containers show the mode they started "
        f"with, read from their environment, not the mode they run in, and no idle time. "
        f"Point to it with {point}."
    )
