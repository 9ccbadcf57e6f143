"""What one round of ``jax-nbmem cull`` saw and did, in one line, and why it changed its mind.

Each round ends with one line on stdout (the service's log, the journal, ``kubectl logs``):
the kernels on the GPUs, how many were idle past ``--idle``, what was warned, stopped,
left waiting for its deadline, cancelled and failed, and the idle kernels skipped, counted
by reason. It goes to stdout only: the administrators' log keeps the actions, one per line.

A kernel that was warned and no longer qualifies has its notice taken back with the reason
(:func:`why_no_longer`): it ran a cell, it exited, its PID is another process now, its GPU
has room again, its memory fell under the threshold, its owner is exempt or changed, its
owner can no longer be proven.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from jax_nbmem.node.notices import Notice
from jax_nbmem.tenants.culling import Candidate, NotCulled
from jax_nbmem.units import format_duration

__all__ = ["RoundTally", "why_no_longer"]

_NOT_IDLE = ("busy", "active", "idle unknown")


@dataclass
class RoundTally:
    """The counts of one round (see the module)."""

    seen: int = 0
    idle: int = 0
    done: Counter = field(default_factory=Counter)  # "warn", "cull", "cancel", "error", ...
    waiting: int = 0
    skipped: Counter = field(default_factory=Counter)  # by short reason

    @classmethod
    def of(cls, verdicts: dict[int, Candidate | NotCulled], declined: dict[int, str]):
        """Seen, idle and skipped from the policy's verdicts and the culler's refusals."""
        tally = cls(seen=len(verdicts))
        for pid, verdict in verdicts.items():
            if isinstance(verdict, NotCulled) and verdict.short in _NOT_IDLE:
                continue
            tally.idle += 1
            if isinstance(verdict, NotCulled):
                tally.skipped[verdict.short] += 1
            elif pid in declined:
                tally.skipped[declined[pid]] += 1
        return tally

    def line(self, idle_s: float, dry_run: bool) -> str:
        """``round: 3 kernels on the GPUs, 1 idle past --idle 1 h; warned 1, ...``."""
        would = "would " if dry_run else ""
        acts = [
            f"{would}warn {self.done['warn']}" if dry_run else f"warned {self.done['warn']}",
            f"{would}stop {self.done['cull']}" if dry_run else f"stopped {self.done['cull']}",
            f"waiting for their deadline {self.waiting}",
            f"cancelled {self.done['cancel']}",
            f"failed {self.done['error']}",
        ]
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        kernels = "kernel" if self.seen == 1 else "kernels"
        return (
            f"round: {self.seen} {kernels} on the GPUs, {self.idle} idle past --idle "
            f"{format_duration(idle_s)}; {', '.join(acts)}; skipped "
            f"{sum(self.skipped.values())}{f' ({skipped})' if skipped else ''}"
        )


def why_no_longer(
    pid: int | None,
    verdict: Candidate | NotCulled | None,
    declined_why: str | None,
    notice: Notice | None,
    started_at: float | None,
) -> str:
    """Why a warned kernel no longer qualifies, as a clause (see the module).

    ``pid`` None: its notice's key names no kernel on the GPUs now. ``notice`` is the notice
    as kept (None: unreadable), ``started_at`` the start of the process now at ``pid``.
    """
    if pid is None or verdict is None:
        return "it is no longer on a GPU (it exited, was shut down, or freed its memory)"
    if notice is not None and notice.started_at is not None and started_at is not None:
        if abs(notice.started_at - started_at) > 1.0:
            return f"the warned kernel exited: PID {pid} is another process now"
    if isinstance(verdict, NotCulled):
        return verdict.why
    if declined_why:
        return declined_why
    return f"it qualifies, idle for {format_duration(verdict.idle_s)}, but was not chosen"
