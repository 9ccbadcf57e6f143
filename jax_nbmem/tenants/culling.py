"""GPU-aware idle culling: which kernels an administrator's policy would stop, and the notice.

A kernel is a candidate when it has been idle longer than the policy's limit, holds a
preallocated pool (or more than the policy's share of a GPU), and sits on a GPU where others
are short of memory: less free than a default JAX start needs (75% of the GPU). A busy kernel
never is, nor one of a user the policy exempts (:meth:`CullPolicy.exempts`: by whose the
kernel is proven to be, never by whose it says it is). A candidate is first warned — a notice file
in the shared beacon directory, ``jax_nbmem-cull-<pid>.json``, that the kernel itself shows
("will be shut down at HH:MM unless it runs a cell") — and only stopped once the notice's time
has passed and it has run no cell since. The stopping is the culler's (``jax-nbmem cull``).

The notice and the culler's counts, which kernels, the culler, the agent and the exporter all
read, are the node's shared language: :mod:`jax_nbmem.node.notices`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jax_nbmem.agent.facts import ProvenOwner
from jax_nbmem.allocator.jaxlib import DEFAULT_FRACTION
from jax_nbmem.gpu.mig import report_label
from jax_nbmem.tenants.owners import owner_text
from jax_nbmem.units import format_bytes, format_duration

__all__ = ["Candidate", "CullPolicy", "candidates"]



@dataclass(frozen=True)
class CullPolicy:
    """An administrator's culling policy (see the module); ``share`` None: pools only."""

    idle_s: float
    warn_s: float = 600.0
    share: float | None = None
    exempt: frozenset[str] = field(default_factory=frozenset)

    def exempts(self, owner: ProvenOwner, unix_user: str | None) -> bool:
        """Whether the policy exempts a kernel of ``owner`` (proven), run by ``unix_user``.

        ``unix_user`` is the process's (a host fact); a hub user name counts only proven
        (a status report's ``hub_user`` is the kernel's claim and exempts no one).
        """
        return owner.name in self.exempt or (unix_user is not None and unix_user in self.exempt)


@dataclass(frozen=True)
class Candidate:
    """A kernel the policy would stop, and why (``reason``: a short label for the metric)."""

    pid: int
    gpu: int
    started_at: float | None
    kernel_id: str | None
    user: str | None
    hub_user: str | None
    notebook: str | None
    idle_s: float
    used_bytes: int | None
    reason: str  # "idle-preallocated" or "idle-over-share"
    why: str  # one sentence

    def label(self) -> str:
        """``kernel PID 123 (notebook x.ipynb, hub user alice (Unix user jovyan))``."""
        parts = [p for p in (self.notebook and f"notebook {self.notebook}",
                             owner_text(self.user, self.hub_user)) if p]  # fmt: skip
        return f"kernel PID {self.pid}" + (f" ({', '.join(parts)})" if parts else "")


def candidates(report: Mapping[str, Any], policy: CullPolicy) -> list[Candidate]:
    """The kernels of a status report (``jax-nbmem status --json``) that the policy would stop.

    Exemptions are not applied here: the report's owners are partly claims; the culler applies
    :meth:`CullPolicy.exempts` to each candidate's proven owner.
    """
    gpus = {g["index"]: g for g in report.get("gpus", [])}
    found: dict[int, Candidate] = {}
    for process in report.get("processes", []):
        gpu = gpus.get(process.get("gpu"))
        if process.get("kind") != "kernel" or gpu is None:
            continue
        idle = process.get("idle_s")
        if idle is None or idle < policy.idle_s or idle == 0:
            continue  # busy, or idle for less than the limit, or never known
        total, free, used = gpu.get("total_bytes"), gpu.get("free_bytes"), process.get("used_bytes")
        if total is None or free is None:
            continue  # cannot tell whether anyone is short of memory
        needed = DEFAULT_FRACTION * total
        if free >= needed:
            continue  # nobody waits: a default JAX start still fits
        if process.get("preallocated"):
            reason, holds = "idle-preallocated", "a preallocated pool"
        elif policy.share is not None and used is not None and used > policy.share * total:
            reason, holds = "idle-over-share", f"more than {policy.share:.0%} of the GPU"
        else:
            continue
        where = report_label(gpu)  # a MIG instance: its label
        why = (
            f"idle for {format_duration(idle)} (limit {format_duration(policy.idle_s)}), it "
            f"holds {holds} ({format_bytes(used)}) of {where}, where only "
            f"{format_bytes(free)} is free, less than the {format_bytes(needed)} a default "
            "JAX start needs"
        )
        if process["pid"] not in found:
            found[process["pid"]] = Candidate(
                pid=process["pid"], gpu=gpu["index"], started_at=process.get("started_at"),
                kernel_id=process.get("kernel_id"), user=process.get("user"),
                hub_user=process.get("hub_user"),
                notebook=process.get("notebook_shown") or process.get("notebook"),
                idle_s=idle, used_bytes=used, reason=reason, why=why,
            )  # fmt: skip
    return list(found.values())
