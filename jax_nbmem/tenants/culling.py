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

__all__ = ["Candidate", "CullPolicy", "NotCulled", "assess", "candidates"]


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
    user_source: str | None = None  # what ``user`` is (owners.unix_user_text)

    def label(self) -> str:
        """``kernel PID 123 (notebook x.ipynb, hub user alice (Unix user jovyan))``.

        In a container: ``(Unix user jovyan in its container)``.
        """
        owner = owner_text(self.user, self.hub_user, self.user_source)
        parts = [p for p in (self.notebook and f"notebook {self.notebook}", owner) if p]
        return f"kernel PID {self.pid}" + (f" ({', '.join(parts)})" if parts else "")


@dataclass(frozen=True)
class NotCulled:
    """Why a kernel of the report is not a candidate: ``short`` to count, ``why`` a clause."""

    pid: int
    short: str  # "busy", "active", "idle unknown", "GPU unknown", "GPU has room", "no pool"
    why: str  # "it ran a cell 3 min ago, under the --idle limit of 1 h"


def candidates(report: Mapping[str, Any], policy: CullPolicy) -> list[Candidate]:
    """The kernels of a status report (``jax-nbmem status --json``) that the policy would stop.

    Exemptions are not applied here: the report's owners are partly claims; the culler applies
    :meth:`CullPolicy.exempts` to each candidate's proven owner.
    """
    return [v for v in assess(report, policy).values() if isinstance(v, Candidate)]


def assess(report: Mapping[str, Any], policy: CullPolicy) -> dict[int, Candidate | NotCulled]:
    """Every kernel of the report on a GPU, by PID: a candidate, or why it is none."""
    gpus = {g["index"]: g for g in report.get("gpus", [])}
    found: dict[int, Candidate | NotCulled] = {}
    for process in report.get("processes", []):
        gpu = gpus.get(process.get("gpu"))
        if process.get("kind") != "kernel" or gpu is None:
            continue
        verdict = _verdict(process, gpu, policy)
        if not isinstance(found.get(process["pid"]), Candidate):  # a candidate on any GPU is one
            found[process["pid"]] = verdict
    return found


def _verdict(process: Mapping[str, Any], gpu: Mapping[str, Any], policy: CullPolicy):
    pid, idle = process["pid"], process.get("idle_s")
    limit = format_duration(policy.idle_s)
    if idle == 0:
        return NotCulled(pid, "busy", "it is running a cell")
    if idle is None:
        return NotCulled(pid, "idle unknown", "how long it has been idle is unknown (no "
                         "beacon or server of its says)")  # fmt: skip
    if idle < policy.idle_s:
        return NotCulled(pid, "active", f"it ran a cell {format_duration(idle)} ago, under the "
                         f"--idle limit of {limit}")  # fmt: skip
    total, free, used = gpu.get("total_bytes"), gpu.get("free_bytes"), process.get("used_bytes")
    where = report_label(gpu)  # a MIG instance: its label
    if total is None or free is None:
        return NotCulled(pid, "GPU unknown", f"the free memory of {where} is unknown, so "
                         "whether anyone is short of it cannot be told")  # fmt: skip
    needed = DEFAULT_FRACTION * total
    if free >= needed:  # nobody waits: a default JAX start still fits
        return NotCulled(pid, "GPU has room", f"{where} has {format_bytes(free)} free, enough "
                         f"for the {format_bytes(needed)} a default JAX start needs")  # fmt: skip
    if process.get("preallocated"):
        reason, holds = "idle-preallocated", "a preallocated pool"
    elif policy.share is not None and used is not None and used > policy.share * total:
        reason, holds = "idle-over-share", f"more than {policy.share:.0%} of the GPU"
    elif policy.share is None:
        return NotCulled(pid, "no pool", "it holds no preallocated pool (and no --share is "
                         "set for kernels without one)")  # fmt: skip
    else:
        return NotCulled(pid, "no pool", f"it holds no preallocated pool, and its "
                         f"{format_bytes(used)} is no more than --share {policy.share:g} of "
                         f"{where}")  # fmt: skip
    why = (
        f"idle for {format_duration(idle)} (limit {limit}), it holds {holds} "
        f"({format_bytes(used)}) of {where}, where only {format_bytes(free)} is free, less "
        f"than the {format_bytes(needed)} a default JAX start needs"
    )
    return Candidate(
        pid=pid, gpu=gpu["index"], started_at=process.get("started_at"),
        kernel_id=process.get("kernel_id"), user=process.get("user"),
        hub_user=process.get("hub_user"),
        notebook=process.get("notebook_shown") or process.get("notebook"),
        idle_s=idle, used_bytes=used, reason=reason, why=why,
        user_source=process.get("user_source"),
    )  # fmt: skip
