"""``%jaxalloc auto``: the mode chosen from what the GPU holds now, with its reason in one line.

The rule (docs/magics.md, "The right mode without thinking"), for each GPU this kernel sees,
the most crowded one deciding:

* no GPU seen (no NVML, no visible GPU) → JAX's default, and why;
* alone on it (no other process, no other kernel's claim) and room for JAX's default pool →
  JAX's default preallocation (``on``): the fastest;
* otherwise → ``off`` (allocate as arrays need it), or ``fraction F`` when
  ``c.JaxNbMem.auto_fraction`` is set and that pool fits what is free with a margin; never a
  pool larger than what is free;
* an administrator's policy (:class:`Policy`) caps the fraction, or forbids preallocation on a
  shared GPU; ``auto`` keeps to it;
* PyTorch, CuPy or TensorFlow imported in this kernel → never a preallocated pool: JAX's pool
  would starve them inside the same process (``off``; only the frameworks already imported
  when ``auto`` decides are seen).

Pure: the caller reads NVML and the claims (:mod:`.claims`) and passes them in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jax_nbmem.allocator.caps import MemoryCap, capped_reading, caps_of_report
from jax_nbmem.allocator.jaxlib import DEFAULT_FRACTION
from jax_nbmem.allocator.modes import AllocatorMode
from jax_nbmem.gpu.frameworks import imported_frameworks
from jax_nbmem.gpu.mig import gpu_label
from jax_nbmem.node.claims import claim_book
from jax_nbmem.tenants.status import collect
from jax_nbmem.units import format_bytes

__all__ = ["AutoChoice", "Policy", "PolicyError", "choose_mode", "decide", "policy_refusal"]

GIB = 1024**3
# Room a pool must leave: a CUDA context, the driver, and other processes' small growth.
_MARGIN_BYTES = GIB
_MARGIN_SHARE = 0.02
_FRAMEWORK_NAMES = {"torch": "PyTorch", "cupy": "CuPy", "tensorflow": "TensorFlow"}


class PolicyError(ValueError):
    """A mode the administrator's policy does not allow; the message gives their reason."""


@dataclass(frozen=True)
class Policy:
    """What an administrator allows (``c.JaxNbMem.policy``); empty: everything.

    ``max_fraction``: no pool above this share of a GPU. ``shared_preallocation``: False
    forbids preallocating on a GPU that another process uses. ``reason``: said with a refusal.
    """

    max_fraction: float | None = None
    shared_preallocation: bool = True
    reason: str = ""

    @classmethod
    def from_setting(cls, setting: Mapping[str, Any] | None) -> Policy:
        """From the setting's dict; ValueError naming a key or value that makes no sense."""
        setting = dict(setting or {})
        unknown = set(setting) - {"max_fraction", "shared_preallocation", "reason"}
        if unknown:
            raise ValueError(f"c.JaxNbMem.policy: unknown keys {sorted(unknown)}")
        fraction = setting.get("max_fraction")
        if fraction is not None and not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
            raise ValueError(f"c.JaxNbMem.policy: max_fraction must be in (0, 1], not {fraction!r}")
        return cls(
            max_fraction=None if fraction is None else float(fraction),
            shared_preallocation=bool(setting.get("shared_preallocation", True)),
            reason=str(setting.get("reason", "")),
        )

    @property
    def empty(self) -> bool:
        """Whether it allows everything."""
        return self.max_fraction is None and self.shared_preallocation


@dataclass(frozen=True)
class AutoChoice:
    """The mode ``auto`` chose, why, and what this kernel will take on each GPU (by UUID)."""

    mode: AllocatorMode
    reason: str
    claim: Mapping[str, int]


def _pool_fraction(mode: AllocatorMode) -> float | None:
    if mode.name == "on":
        return DEFAULT_FRACTION
    if mode.name == "fraction":
        return mode.fraction
    return None  # off, platform, vmm...: no pool up front


def _others_on(gpu: Any, tenants: Iterable[Any], claims: Iterable[Any]) -> tuple[list, int]:
    """Other processes on *gpu* and the bytes others claimed there that NVML does not show."""
    on_gpu = [t for t in tenants if t.gpu == gpu.index and t.kind != "self" and t.used_bytes]
    held = {t.pid: t.used_bytes or 0 for t in on_gpu}
    claimed = 0
    for claim in claims:
        wanted = claim.bytes_by_gpu.get(gpu.uuid or "", 0)
        # Once NVML shows the claimant holding about that much, its claim is in `free` already
        # (by its host PID: one written in a container is matched only as the agent proved).
        if wanted and not claim.in_nvml(gpu.uuid or "", held):
            claimed += wanted
    return on_gpu, claimed


def _margin(total: int) -> int:
    return max(_MARGIN_BYTES, int(_MARGIN_SHARE * total))


def choose_mode(
    gpus: Sequence[Any],
    tenants: Iterable[Any],
    claims: Iterable[Any] = (),
    *,
    auto_fraction: float | None = None,
    policy: Policy | None = None,
    no_gpu_reason: str | None = None,
    caps: Mapping[int, MemoryCap] | None = None,
    frameworks: Sequence[str] = (),
) -> AutoChoice:
    """The mode for a kernel about to start JAX on *gpus* (its visible GPUs, NVML readings).

    *caps* (MPS's or HAMi's, by NVML index): a capped GPU is sized as this process's CUDA will
    see it, free memory at most the cap, and under HAMi the cap as its total. *frameworks*:
    the other GPU frameworks imported in this kernel (``torch``, ``cupy``, ``tensorflow``).
    """
    policy = policy or Policy()
    tenants, claims = list(tenants), list(claims)
    caps = caps or {}
    gpus = [capped_reading(gpu, caps.get(gpu.index)) for gpu in gpus]
    if not gpus:
        why = no_gpu_reason or "no GPU seen"
        return AutoChoice(AllocatorMode("on"), f"{why}: JAX's default, nothing to decide", {})
    if any(g.total_bytes is None or g.free_bytes is None for g in gpus):
        return AutoChoice(
            AllocatorMode("off"), "NVML cannot tell how much is free: off, the safe choice", {}
        )
    crowded = []
    for gpu in gpus:
        others, claimed = _others_on(gpu, tenants, claims)
        free = max(0, gpu.free_bytes - claimed)
        crowded.append((free / gpu.total_bytes, gpu, others, claimed, free))
    _, gpu, others, claimed, free = min(crowded, key=lambda c: c[0])
    total = gpu.total_bytes
    default_pool = DEFAULT_FRACTION * total
    shared = bool(others or claimed)
    where = gpu_label(gpu)
    if shared:
        who = [f"PID {t.pid} holds {format_bytes(t.used_bytes)}" for t in others[:2]]
        if claimed:
            who.append(f"kernels starting now claim {format_bytes(claimed)}")
        situation = f"{where} is shared ({'; '.join(who)}; {format_bytes(free)} free)"
    else:
        situation = f"alone on {where} with {format_bytes(free)} of {format_bytes(total)} free"
    cap = caps.get(gpu.index)
    if cap is not None:
        situation += f", capped at {format_bytes(cap.bytes)} by {cap.system}"

    if frameworks:
        names = ", ".join(_FRAMEWORK_NAMES.get(f, f) for f in frameworks)
        return AutoChoice(
            AllocatorMode("off"),
            f"{situation}; {names} imported in this kernel: off, so that JAX takes only what "
            "its arrays need and leaves the rest to them (a pool would starve them here)",
            {},
        )
    cap = policy.max_fraction
    if not shared and free >= default_pool + _margin(total):
        if cap is None or cap >= DEFAULT_FRACTION:
            mode = AllocatorMode("on")
            return AutoChoice(mode, f"{situation}: JAX's default preallocation, the fastest",
                              _claim(gpus, mode))  # fmt: skip
        mode = AllocatorMode("fraction", cap)
        return AutoChoice(
            mode, f"{situation}: a pool of {cap:g}, the most the site's policy allows",
            _claim(gpus, mode),
        )  # fmt: skip
    fraction = auto_fraction
    if fraction is not None and cap is not None:
        fraction = min(fraction, cap)
    if shared and not policy.shared_preallocation:
        fraction = None
    if fraction is not None and fraction * total + _margin(total) <= free:
        mode = AllocatorMode("fraction", fraction)
        return AutoChoice(
            mode, f"{situation}: a pool of {fraction:g} ({format_bytes(fraction * total)}), "
            "which fits", _claim(gpus, mode),
        )  # fmt: skip
    why = "too little free for JAX's default pool" if not shared else "preallocating would crowd it"
    return AutoChoice(
        AllocatorMode("off"),
        f"{situation}: off ({why}): this kernel takes memory as its arrays need it",
        {},
    )


def _claim(gpus: Sequence[Any], mode: AllocatorMode) -> dict[str, int]:
    fraction = _pool_fraction(mode) or 0.0
    return {g.uuid: int(fraction * g.total_bytes) for g in gpus if g.uuid and g.total_bytes}


def policy_refusal(
    mode: AllocatorMode, policy: Policy, gpus: Sequence[Any], tenants: Iterable[Any]
) -> str | None:
    """Why the policy refuses an explicit *mode* now, or None when it allows it."""
    if policy.empty:
        return None
    fraction = _pool_fraction(mode)
    if fraction is None:
        return None
    because = f" ({policy.reason})" if policy.reason else ""
    if policy.max_fraction is not None and fraction > policy.max_fraction:
        return (
            f"'{mode}' would preallocate {fraction:.0%} of the GPU; this site's policy allows "
            f"at most {policy.max_fraction:.0%}{because}. Try `%jaxalloc fraction "
            f"{policy.max_fraction:g}`, `%jaxalloc off` or `%jaxalloc auto`."
        )
    tenants = list(tenants)
    if not policy.shared_preallocation:
        for gpu in gpus:
            if any(t.gpu == gpu.index and t.kind != "self" and t.used_bytes for t in tenants):
                return (
                    f"{gpu_label(gpu)} is shared, and this site's policy forbids preallocating "
                    f"on a shared GPU{because}. Try `%jaxalloc off` or `%jaxalloc auto`."
                )
    return None


def decide(
    mode: AllocatorMode,
    *,
    policy: Policy,
    auto_fraction: float | None = None,
    claims_dir: str | None = None,
    claim_key: str | None = None,
    claim_pid: int | None = None,
    status: Any = None,
    frameworks: Sequence[str] | None = None,
) -> tuple[AllocatorMode, AutoChoice | None]:
    """The mode to apply for *mode* now: ``auto`` resolved, a mode the policy forbids refused.

    Reads the GPU (``status()``, a :func:`jax_nbmem.tenants.status.collect` report) while
    holding the claims lock of *claims_dir*, and leaves this launch's claim there (named
    *claim_key*, kept alive by process *claim_pid*). *frameworks*: the other GPU frameworks
    in the kernel (None: those imported in this process). Raises :class:`PolicyError` with the
    administrator's reason. Reads NVML: never on a cell's path, only on a user's command or
    at a kernel's launch.
    """
    status = status or (lambda: collect(in_kernel=True))
    if mode.name != "auto" and policy.empty:
        return mode, None
    claim_pid = os.getpid() if claim_pid is None else claim_pid
    with claim_book(claims_dir) as book:
        report = status()
        ours = {g["index"] for g in report.get("gpus", []) if g.get("ours")}
        gpus = [g for g in report.gpu_memory() if g.index in ours]
        tenants = report.tenants()
        if mode.name != "auto":
            refusal = policy_refusal(mode, policy, gpus, tenants)
            if refusal:
                raise PolicyError(f"refused by this site's policy: {refusal}")
            return mode, None
        nvml = report.get("nvml", {})
        no_gpu = None if nvml.get("available") else f"NVML unavailable ({nvml.get('reason')})"
        # Keyed by the kernel id, else as the beacons are (the PID, with its namespace's inode
        # in a container: two containers' kernels of the same PID never share a claim).
        claims = book.others(own_pid=claim_pid, own_key=claim_key) if book is not None else []
        choice = choose_mode(
            gpus, tenants, claims, auto_fraction=auto_fraction, policy=policy,
            no_gpu_reason=no_gpu, caps=caps_of_report(report.get("gpus", [])),
            frameworks=imported_frameworks() if frameworks is None else frameworks,
        )  # fmt: skip
        if book is not None:
            try:
                book.claim(claim_pid, choice.claim, key=claim_key)
            except (OSError, ValueError):
                pass  # decided all the same; the next kernel will not see this claim
    return choice.mode, choice
