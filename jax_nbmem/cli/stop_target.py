"""The kernel behind a PID, for ``jax-nbmem shutdown`` and the culler: facts and claims apart.

What the host proves of the process (:class:`~jax_nbmem.agent.facts.ProvenProcess`: its start,
UID, real parent, namespace, container) and whose it is
(:func:`~jax_nbmem.agent.facts.owner_of`) are read here, beside what the kernel claims (its
beacon, its environment's ``JUPYTERHUB_USER`` and ``JPY_PARENT_PID``, its command line's
``kernel-<id>.json``), which :mod:`.stop` shows marked as claimed and uses only where a fact
bounds it. A kernel in a container names itself only through the node agent's proof
(:mod:`jax_nbmem.agent.hostproof`): a beacon file there is anyone's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil

from jax_nbmem.agent.authority import ancestors
from jax_nbmem.agent.facts import Claimed, FactError, ProvenOwner, ProvenProcess, owner_of
from jax_nbmem.agent.facts import prove_process as _prove
from jax_nbmem.agent.hostproof import HostProof, host_proof, public_container
from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.node.beacons import beacon_dirs, read_beacons
from jax_nbmem.tenants.attribution import inspect_process
from jax_nbmem.tenants.owners import hub_user_of, owner_text

__all__ = ["Kernel", "StopError", "find"]


class StopError(RuntimeError):
    """Nothing was stopped; the message says why."""


@dataclass
class Kernel:
    """The kernel behind a PID, as far as it can be found out.

    ``hub_user``, ``kernel_id`` and ``notebook`` are what is shown (the proven owner's hub
    user where there is one, else its claim); ``claimed`` holds every claim as made,
    ``process`` and ``proven_owner`` the facts (None: unproven, ``owner_reason`` says why).
    """

    pid: int
    started_at: float | None
    user: str | None
    hub_user: str | None
    kernel_id: str | None
    notebook: str | None
    server_pid: int | None = None
    gpu_bytes: dict[int, int] = field(default_factory=dict)  # GPU index -> bytes (NVML)
    pid_in_container: int | None = None  # its PID in its container (None: the host's)
    container: dict | None = None  # name, id, pod, namespace (None: none)
    proven: bool | None = None  # in a container: whether the node agent proved it
    process: ProvenProcess | None = None
    proven_owner: ProvenOwner | None = None
    owner_reason: str | None = None
    claimed: Claimed = field(default_factory=Claimed)
    ancestors: tuple[int, ...] = ()
    # What ``user`` is (owners.unix_user_text): None, the host's account; in a container, its
    # own name there, its uid there or the host's uid, never the host's name for that uid.
    user_source: str | None = None

    @property
    def owner(self) -> str:
        """Whose it is, as people know them; a hub user only claimed says so."""
        shown = owner_text(self.user, self.hub_user, self.user_source) or "an unknown user"
        unproven = self.proven_owner is None or not self.proven_owner.is_hub_user
        if self.hub_user and self.hub_user != self.user and unproven and self.process:
            return shown.replace(f"hub user {self.hub_user}", f"hub user {self.hub_user} (claimed)")
        return shown

    def label(self) -> str:
        """``kernel PID 123 (id 1a2b3c4d, notebook ~alice/x.ipynb, user alice)``."""
        parts = [f"id {self.kernel_id[:8]}"] if self.kernel_id else []
        if self.notebook:
            parts.append(f"notebook {self.notebook}")
        parts.append(self.owner)
        if self.container:
            name = self.container.get("name") or (self.container.get("id") or "")[:12]
            parts.append(f"container {name}")
        return f"kernel PID {self.pid} ({', '.join(parts)})"


def gpu_bytes(pid: int) -> dict[int, int]:
    """What NVML says ``pid`` holds, per GPU index."""
    from jax_nbmem.gpu import nvml

    held: dict[int, int] = {}
    for listing in nvml.process_lists(None):
        for process in listing.processes or ():
            if process.pid == pid and process.used_bytes is not None:
                held[process.gpu] = held.get(process.gpu, 0) + process.used_bytes
    return held


def find(pid: int, share_dir: str | None = None, host: HostProof | None = None) -> Kernel:
    """The kernel behind ``pid``; StopError when there is none (or it is no kernel).

    ``host`` (default: :func:`host_proof`; None off the host) tells whether ``pid`` runs in a
    container and what the node agent proved of it (see the module).
    """
    host = host_proof(share_dir) if host is None else host
    view = host.view(pid) if host is not None else None
    info = inspect_process(pid, own_pid=os.getpid(), server_sessions={})
    if info.kind == "self":
        raise StopError(f"PID {pid} is this very command; nothing done.")
    if info.kind == "unknown":
        raise StopError(f"PID {pid}: {info.reason}; nothing done.")
    process = _proven(pid, host)
    owner, owner_reason = _owner(process)
    # In a container: its container's user, never the host's account of the same uid.
    user, user_source = (host.shown_user(pid) if host is not None else None) or (info.user, None)
    if view is not None and view.namespaced:
        proven = host.is_proven(pid)
        beacon = host.proven[pid].beacon if proven else None
        if beacon is None and info.kind != "kernel":
            raise StopError(_not_a_kernel(pid, info.cmdline))
        claimed = Claimed(
            kernel_id=beacon.kernel_id if beacon else None,
            command_line_kernel_id=info.kernel_id,
            hub_user=beacon.hub_user if beacon else None,
            notebook=beacon.notebook if beacon else None,
        )  # a beacon file or environment there is anyone's: only the agent's relay is heard
        return Kernel(
            pid=pid, started_at=info.started_at, user=user,
            hub_user=_shown_hub_user(owner, claimed), kernel_id=claimed.kernel_id,
            notebook=claimed.notebook, gpu_bytes=gpu_bytes(pid),
            pid_in_container=view.pid_in_container, container=public_container(view),
            proven=proven, process=process, proven_owner=owner, owner_reason=owner_reason,
            claimed=claimed, user_source=user_source,
        )  # fmt: skip
    if info.kind != "kernel":
        raise StopError(_not_a_kernel(pid, info.cmdline))
    beacon = read_beacons(beacon_dirs(share_dir)).get(pid)
    environ: dict = {}
    try:
        environ = psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        pass  # another user's environment: the beacon and the facts must do
    parent = environ.get("JPY_PARENT_PID", "")
    claimed = Claimed(
        kernel_id=beacon.kernel_id if beacon else None,
        command_line_kernel_id=info.kernel_id,
        hub_user=(beacon.hub_user if beacon else None) or hub_user_of(environ) or info.hub_user,
        notebook=info.notebook_shown or info.notebook or (beacon.notebook if beacon else None),
        server_pid=int(parent) if parent.isdigit() else None,
    )
    return Kernel(
        pid=pid, started_at=info.started_at, user=user,
        hub_user=_shown_hub_user(owner, claimed), kernel_id=claimed.any_kernel_id,
        notebook=claimed.notebook, server_pid=claimed.server_pid, gpu_bytes=gpu_bytes(pid),
        process=process, proven_owner=owner, owner_reason=owner_reason, claimed=claimed,
        ancestors=ancestors(process) if process is not None else (), user_source=user_source,
    )  # fmt: skip


def _not_a_kernel(pid: int, cmdline: str | None) -> str:
    return (
        f"PID {pid} is not a Jupyter kernel ({cmdline}); jax-nbmem shutdown stops kernels "
        "only; nothing done."
    )


def _proven(pid: int, host: HostProof | None) -> ProvenProcess | None:
    """The host's facts of ``pid`` (None: unreadable; nothing is then done with others' say)."""
    try:
        return _prove(pid, host.viewer if host is not None else HostViewer())
    except FactError:
        return None


def _owner(process: ProvenProcess | None) -> tuple[ProvenOwner | None, str | None]:
    if process is None:
        return None, "the host's facts of its process could not be read"
    try:
        return owner_of(process), None
    except FactError as error:
        return None, str(error)


def _shown_hub_user(owner: ProvenOwner | None, claimed: Claimed) -> str | None:
    """The hub user shown: the proven one, else the claim (marked so by :attr:`Kernel.owner`)."""
    return owner.name if owner is not None and owner.is_hub_user else claimed.hub_user
