"""A process's Unix user in words, by where its name comes from (its ``user_source``).

A process in a container is never named by the host's account of its uid: that is whoever
has the same number on the host. Its status entry's ``user_source`` says what its ``user`` is;
these are the words every text (status rows, warnings, advice, ``shutdown``, the culler, the
server's board) says it in. On the node's floor, so that :mod:`.servers` and
:mod:`jax_nbmem.tenants.owners` (which re-exports them) say the same.
"""

from __future__ import annotations

__all__ = ["unix_user_text", "who_text"]


def unix_user_text(user: str | None, user_source: str | None = None) -> str | None:
    """A process's Unix user as people read it, by where its name comes from.

    ``user_source`` (a status entry's): none, the host's account (``alice``); ``container``,
    its container's own name for its uid there (``jovyan in its container``); ``uid``, its uid
    there with no name (``uid 1000 in its container``); ``host_uid``, only the host's uid is
    known (``host uid 1000``). None when ``user`` is.
    """
    if not user:
        return None
    if user_source == "container":
        return f"{user} in its container"
    if user_source == "uid":
        return f"uid {user} in its container"
    if user_source == "host_uid":
        return f"host uid {user}"
    return user


def who_text(user: str | None, hub_user: str | None, user_source: str | None = None) -> str:
    """Whom to ask, in one word where there is one: the hub user, else the Unix user ("")."""
    return hub_user or unix_user_text(user, user_source) or ""
