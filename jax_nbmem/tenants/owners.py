"""Whose a process is, as people know them: its Unix user and its JupyterHub user name.

In a hub whose single-user servers run in containers every Unix user may be ``jovyan``; the
hub's name (``$JUPYTERHUB_USER`` in every spawned server and kernel) is what tells people
apart. A kernel states it in its beacon; for a process without one it is read from its
environment where that is readable (the viewer's own processes, or root).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = [
    "ENV_HUB_USER",
    "SHUTDOWN_BOTH",
    "SHUTDOWN_DRY_RUN",
    "SHUTDOWN_YES",
    "hub_user_of",
    "is_someone_else",
    "may_stop_others",
    "owner_text",
]

ENV_HUB_USER = "JUPYTERHUB_USER"

# How both shut-down commands (`jax-nbmem shutdown PID`, `%jaxmem shutdown PID`) say their two
# words, the same in both help texts; each keeps its own default.
SHUTDOWN_YES = "act: shut it down (the default of `jax-nbmem shutdown`)"
SHUTDOWN_DRY_RUN = "only say what it would do (the default of `%jaxmem shutdown`)"
SHUTDOWN_BOTH = "--yes (act) or --dry-run (only say what it would do), not both"


def hub_user_of(environ: Mapping[str, str] | None) -> str | None:
    """The hub user name in a process's environment; None without one (or unreadable)."""
    if environ is None:
        return None
    return (environ.get(ENV_HUB_USER) or "").strip() or None


def is_someone_else(user: str | None, hub_user: str | None) -> bool:
    """Whether a process belongs to another person than the one asking.

    Another Unix user is; so is the same Unix user (``jovyan``) under another hub name.
    """
    # Imported here: the kernel's extension loads this module for its help texts, and the
    # servers module (psutil, jupyter_core) is not needed to load it (issue 38).
    from jax_nbmem.node.servers import current_user

    if user and user != current_user():
        return True
    own_hub = hub_user_of(os.environ)
    return bool(hub_user and own_hub and hub_user != own_hub)


def owner_text(user: str | None, hub_user: str | None) -> str | None:
    """``user alice``, ``hub user alice (Unix user jovyan)``; None when nobody is known."""
    if hub_user and hub_user != user:
        return f"hub user {hub_user}" + (f" (Unix user {user})" if user else "")
    return f"user {user}" if user else None


def may_stop_others() -> bool:
    """Whether this process may stop another user's kernel (root: ``jax-nbmem shutdown``)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0
