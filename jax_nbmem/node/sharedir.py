"""The share directory, and the one rule by which every face of jax_nbmem finds it.

The share directory is where kernels, Jupyter servers, the CLI, the culler and the node agent
leave one another what they have to say (beacons, claims, notices, the agent's resolution):
the contract between every process and every user on the node. Each face finds it by
:func:`find_share_dir`, in one order of explicit choices, then the face's own default:

1. a command-line flag (``--share-dir``), where the face has one;
2. ``$JAX_NBMEM_SHARE_DIR``;
3. the face's setting (``c.JaxNbMem.share_dir`` for kernels, ``c.JaxNbMemServer.share_dir``
   for the server extension, the kernel provisioner's ``share_dir``);
4. the face's default: none for kernels, servers and the provisioner (a kernel keeps its
   beacon in the user's Jupyter runtime directory only unless told: the privacy opt-out of
   docs/containers.md); for root's commands (``jax-nbmem status``, ``shutdown``, ``cull``,
   the exporter and its node agent) ``/var/tmp/jax_nbmem`` where it is a real directory (not
   a symlink), the documented setup (docs/containers.md;
   ``deploy/jax-nbmem-exporter.tmpfiles``), with the node agent's folder ``agent/`` in it.

:func:`agent_not_consulted` is the sentence a status prints when the agent's resolution was
not read on the host, so that nobody takes modes read from start environments for the agent's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_SHARE_DIR",
    "ENV_SHARE_DIR",
    "ShareDir",
    "agent_not_consulted",
    "find_share_dir",
]

ENV_SHARE_DIR = "JAX_NBMEM_SHARE_DIR"
DEFAULT_SHARE_DIR = "/var/tmp/jax_nbmem"


@dataclass(frozen=True)
class ShareDir:
    """The share directory a face uses (``path`` None: none) and ``how`` it was found."""

    path: str | None
    # "--share-dir", "$JAX_NBMEM_SHARE_DIR", "the setting", "the default", or "none"
    how: str


def _is_real_directory(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def find_share_dir(
    given: str | None = None,
    environ: Mapping[str, str] | None = None,
    default: str | None = DEFAULT_SHARE_DIR,
    setting: str | None = None,
) -> ShareDir:
    """The share directory: ``given`` (a flag), ``$JAX_NBMEM_SHARE_DIR``, ``setting``, ``default``.

    The first of them that is set wins; ``default`` (the face's own: None for a kernel or a
    server) only where it is a real directory. ``environ`` is the environment the face reads
    (default: this process's), e.g. the one a provisioner starts a kernel with.
    """
    environ = os.environ if environ is None else environ
    if given:
        return ShareDir(given, "--share-dir")
    if environ.get(ENV_SHARE_DIR):
        return ShareDir(environ[ENV_SHARE_DIR], f"${ENV_SHARE_DIR}")
    if setting:
        return ShareDir(setting, "the setting")
    if default and _is_real_directory(default):
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
