"""Whose a process is, as people know them: its Unix user and its JupyterHub user name.

In a hub whose single-user servers run in containers every Unix user may be ``jovyan``; the
hub's name (``$JUPYTERHUB_USER`` in every spawned server and kernel) is what tells people
apart. A kernel states it in its beacon; for a process without one it is read from its
environment where that is readable (the viewer's own processes, or root).

A process in a container is never shown by the host's account name for its uid (that is
whoever has the same number on the host): its ``user_source`` says what its ``user`` is
(:func:`unix_user_text`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from jax_nbmem.node.unix_names import unix_user_text, who_text

__all__ = [
    "ENV_HUB_USER",
    "SHUTDOWN_BOTH",
    "SHUTDOWN_DRY_RUN",
    "SHUTDOWN_YES",
    "hub_user_of",
    "in_container",
    "is_someone_else",
    "may_stop_others",
    "owner_text",
    "unix_user_text",
    "who_text",
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


def owner_text(
    user: str | None, hub_user: str | None, user_source: str | None = None
) -> str | None:
    """``user alice``, ``hub user alice (Unix user jovyan in its container)``; None: nobody.

    ``user_source`` as :func:`unix_user_text` says.
    """
    shown = unix_user_text(user, user_source)
    if hub_user and (hub_user != user or user_source):
        return f"hub user {hub_user}" + (f" (Unix user {shown})" if shown else "")
    if shown and user_source in ("uid", "host_uid"):
        return shown  # "host uid 1000": a number, never "user 1000"
    return f"user {shown}" if shown else None


def may_stop_others() -> bool:
    """Whether this process may stop another user's kernel (root: ``jax-nbmem shutdown``)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def in_container(
    shown: Mapping[str, Any], user: str | None, user_source: str | None, pid: int | None = None
) -> dict[str, Any]:
    """``user``, ``user_source`` and ``notebook_shown`` of a process in a container.

    ``shown`` holds what the host made of it (``user``: the host's account of its uid,
    ``notebook``, ``notebook_shown``); ``user``/``user_source`` are its container's (the node
    agent's reading). Without them, its host uid (read from ``/proc/PID`` when ``pid`` is
    given). Its notebook is never shown under the home the host gives that uid's account.
    """
    if not user and pid is not None:
        try:
            user, user_source = str(os.stat(f"/proc/{pid}").st_uid), "host_uid"
        except OSError:
            user, user_source = None, None
    notebook_shown, account = shown.get("notebook_shown"), shown.get("user")
    if account and notebook_shown and notebook_shown.startswith(f"~{account}/"):
        notebook_shown = shown.get("notebook")
    return {"user": user, "user_source": user_source, "notebook_shown": notebook_shown}
