"""Which names each reader of the node agent's resolution may see, and the entries hidden so.

A kernel in a pod reads the node's resolution over the agent's TCP connection; anyone who
reads the share directory reads ``S/agent/resolution.json``. Both carry every process on the
node. Where the entry of a pod in another Kubernetes namespace is not the reader's to see
(:class:`PodVisibility`, the command's ``--pod-names-visible``; by default a reader sees its
own namespace's only), everything that names it is null, the keys kept, with the reason in
``name_reason`` (its container) and ``names_reason`` (its kernel):

- its container: ``name``, ``pod_uid``, ``pod``, ``namespace``, ``hub_user``;
- its kernel (the beacon it sent the agent): ``hub_user``, ``user``, ``notebook``,
  ``kernel_id`` and its identity's ``hostname`` (a pod's host name is the pod's name).

What is left (PIDs, namespace inode, start, GPUs, memory, mode, idle time) tells a reader who
holds how much, not who it is. A process in no Kubernetes namespace (a plain host's, a
Docker or Podman container's) is named for everyone, as the share directory's beacons are.
A pod whose namespace is not known (yet: the Kubernetes API unreachable, the pod not listed)
is :data:`UNKNOWN_NAMESPACE`'s, hidden from every reader but the one that sees every name
(fail closed: its namespace may be any reader's but this one's), ``all`` included.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "EVERY_NAME",
    "HIDDEN_REASON",
    "KERNEL_NAME_KEYS",
    "PodVisibility",
    "UNKNOWN_NAMESPACE",
    "UNKNOWN_REASON",
    "hidden_container",
    "hidden_kernel",
]

HIDDEN_REASON = "a pod of another Kubernetes namespace: its names are hidden"
# The reader that sees every name (root's file, the agent itself): no namespace is called so.
EVERY_NAME = "*"
# A pod's namespace before it is known: no Kubernetes namespace is called so either.
UNKNOWN_NAMESPACE = "?"
UNKNOWN_REASON = "a pod whose Kubernetes namespace is not known yet: its names are hidden"
KERNEL_NAME_KEYS = ("hub_user", "user", "notebook", "kernel_id")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class PodVisibility:
    """Which namespaces' pod names a reader of namespace N may see.

    ``own`` (the default): N's only; ``all``: every one; ``none``: none; else a comma-separated
    list of namespaces seen by everyone, besides N's own (``own`` may be in the list too).
    ValueError for a malformed setting.
    """

    def __init__(self, setting: str = "own") -> None:
        words = [word.strip() for word in setting.split(",") if word.strip()]
        if not words:
            raise ValueError("--pod-names-visible wants own, all, none or namespaces")
        self.setting = setting
        self.all = words == ["all"]
        self.own = words != ["none"]
        self.extra = frozenset(w for w in words if w not in ("own", "all", "none"))
        bad = [w for w in self.extra if not _NAMESPACE.fullmatch(w)]
        if bad or (len(words) > 1 and ({"all", "none"} & set(words))):
            raise ValueError(
                "--pod-names-visible wants own, all, none or Kubernetes namespaces, "
                f"not {setting!r}"
            )

    def visible(self, reader: str | None, namespace: str | None) -> bool:
        """Whether a reader of namespace ``reader`` may see the names of a pod in ``namespace``.

        ``reader`` :data:`EVERY_NAME` sees them all.
        """
        if namespace is None or reader == EVERY_NAME:
            return True
        if namespace == UNKNOWN_NAMESPACE:
            return False  # fail closed: it may be another namespace's
        if self.all:
            return True
        return namespace in self.extra or (self.own and reader is not None and reader == namespace)


def hidden_container(entry: Mapping[str, Any], reason: str = HIDDEN_REASON) -> dict:
    """A resolution's ``container`` object with its names hidden (see the module)."""
    return {**entry, "name": None, "pod_uid": None, "pod": None, "namespace": None,
            "hub_user": None, "name_reason": reason}  # fmt: skip


def hidden_kernel(content: Mapping[str, Any] | None, reason: str = HIDDEN_REASON) -> dict | None:
    """A proven kernel's beacon with what names it hidden (see the module); None stays None."""
    if content is None:
        return None
    hidden: dict = {**content, **dict.fromkeys(KERNEL_NAME_KEYS), "names_reason": reason}
    identity = content.get("identity")
    if isinstance(identity, Mapping):
        hidden["identity"] = {**identity, "hostname": None}
    return hidden
