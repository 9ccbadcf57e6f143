"""Label values of the metrics (:mod:`.metrics`): each as Prometheus reads it, bounded.

Names that processes give themselves (a notebook path, a user, a hub user, a kernel id, a
mode, a rootless container's name) are claims: each value is printable and bounded, so no
process can make a label of any length or shape. A notebook is shown as its server shows
it, an absolute path by its tail, and a ``key=value`` in it masked (it may be a secret).
Which of ``user`` and ``hub_user`` came from whom is in :func:`name_sources`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from jax_nbmem.text import mask_secrets, printable

__all__ = [
    "NAME_MAX_CHARS",
    "NOTEBOOK_MAX_CHARS",
    "bounded_name",
    "bounded_notebook",
    "container_labels",
    "gpu_identity",
    "name_sources",
    "notebook_label",
]

NOTEBOOK_MAX_CHARS = 120
NAME_MAX_CHARS = 64  # a user, hub user or kernel id: claims, so bounded


def notebook_label(process: Mapping[str, Any]) -> str:
    """The notebook as its server shows it (else ``~/…``, else ``…/dir/file``), bounded."""
    return bounded_notebook(process.get("notebook_shown") or process.get("notebook") or "")


@lru_cache(maxsize=4096)  # a node's notebooks, the same from one snapshot to the next
def bounded_notebook(shown: str) -> str:
    """A notebook as shown, bounded to :data:`NOTEBOOK_MAX_CHARS` (see the module)."""
    if shown.startswith("/"):  # an absolute path outside its owner's home: its tail
        parts = [p for p in shown.split("/") if p]
        shown = "…/" + "/".join(parts[-2:]) if len(parts) > 2 else shown
    if "=" in shown:  # a query string or key=value: maybe a secret
        shown = mask_secrets([shown])[0]
    shown = printable(shown)
    if len(shown) > NOTEBOOK_MAX_CHARS:
        shown = "…" + shown[-(NOTEBOOK_MAX_CHARS - 1) :]
    return shown


@lru_cache(maxsize=4096)
def bounded_name(value: Any) -> str:
    """A claimed name as a label value: printable, at most :data:`NAME_MAX_CHARS` characters."""
    if value is None:
        return ""
    shown = printable(str(value))
    return shown if len(shown) <= NAME_MAX_CHARS else shown[: NAME_MAX_CHARS - 1] + "…"


def name_sources(process: Mapping[str, Any]) -> tuple[str, str]:
    """Who says ``user`` and ``hub_user`` (:data:`SOURCE_LABELS`); empty where there is none."""
    user = process.get("user_source") or ""  # empty: the host's account, as before the label
    hub_user = ""
    if process.get("hub_user"):
        hub_user = "pod" if process.get("hub_user_source") == "pod" else "claimed"
    return user, hub_user


def container_labels(container: Any) -> tuple[str, str, str]:
    """A process's ``container`` entry as (container, pod, namespace) label values.

    The container's name, else the first 12 digits of its id (as ``docker ps`` shows it).
    """
    if not isinstance(container, Mapping):
        return "", "", ""
    name = container.get("name") or str(container.get("id") or "")[:12]
    # A rootless container's name is its user's claim: bounded as every claimed name is.
    return (
        bounded_name(name or None),
        bounded_name(container.get("pod")),
        bounded_name(container.get("namespace")),
    )


def gpu_identity(gpu: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """A report's GPU as dcgm-exporter labels it: UUID, gpu, GPU_I_ID, GPU_I_PROFILE.

    A MIG instance carries its parent's UUID and index, and its instance id and profile.
    """
    mig = gpu.get("mig")
    if not mig:
        return gpu.get("uuid") or "", str(gpu["index"]), "", ""
    return (
        mig.get("parent_uuid") or "",
        str(mig.get("parent_index", "")),
        str(mig.get("gpu_instance_id", "")),
        mig.get("profile") or "",
    )
