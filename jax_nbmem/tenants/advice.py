"""What to tell the user about the GPU's tenants: warnings, and the diagnosis after an OOM.

Pure text and rules over the `Tenant` records that :mod:`jax_nbmem.tenants.attribution` attributes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from jax_nbmem.agent.cgroups import container_text
from jax_nbmem.allocator.caps import (
    CONTEXT_RESERVE_BYTES,
    MemoryCap,
    capped_reading,
    pool_under_cap,
)
from jax_nbmem.allocator.jaxlib import DEFAULT_FRACTION
from jax_nbmem.gpu.mig import gpu_label
from jax_nbmem.tenants.attribution import INFERRED_WITHOUT_AGENT, PID_NAMESPACE_REASON, Tenant
from jax_nbmem.tenants.owners import is_someone_else, may_stop_others, owner_text, who_text
from jax_nbmem.tenants.verdicts import pool_sizes
from jax_nbmem.text import printable_lines
from jax_nbmem.units import format_bytes, format_duration, format_gib

if TYPE_CHECKING:
    from jax_nbmem.gpu.nvml import GpuMemory

# How the messages name the process that asks: a kernel, or a terminal IPython session.
OWN_NAME = "this kernel"
# Where the messages are read, which decides the commands they name: in IPython (a kernel or a
# terminal IPython session, where `%jaxmem` works), or at a shell prompt (`jax-nbmem status`,
# where `jax-nbmem shutdown` does, and where whoever reads may be an administrator looking at
# the whole node: every process's owner is named, their own too).
IN_IPYTHON = "ipython"
AT_SHELL = "shell"

__all__ = [
    "AT_SHELL",
    "IN_IPYTHON",
    "OWN_NAME",
    "MemoryWarning",
    "oom_diagnosis",
    "pending_pool_warnings",
    "warnings_for",
]


@dataclass(frozen=True)
class MemoryWarning:
    """Something on the GPU worth telling the user, with what to do about it.

    ``kind``: "blocking-preallocation", "self-preallocation", "prealloc-will-fail",
    "prealloc-exceeds-cap", "pid-namespace" or "agent-stale". ``gpu``/``pid`` are None when it
    concerns no single GPU or process; ``pid`` is a host PID.
    """

    kind: str
    gpu: int | None
    pid: int | None
    message: str

    def __post_init__(self) -> None:
        # Notebook paths, command lines and user names are other people's text: whatever a
        # terminal would act on is shown as an escape, here and in every copy of the message.
        object.__setattr__(self, "message", printable_lines(self.message))

    def to_dict(self) -> dict:
        """JSON-ready dict: ``kind``, ``gpu``, ``pid``, ``message``."""
        return asdict(self)


def warnings_for(
    tenants: Iterable[Tenant],
    gpus: Iterable[GpuMemory],
    *,
    own_backend_started: bool,
    own_requested_fraction: float | None = None,
    own_needs_bytes: int | None = None,
    own_jax_in_use: int | None = None,
    own_reserved: int | None = None,
    own_name: str = OWN_NAME,
    agent=None,
    read_at: str = IN_IPYTHON,
    own_caps: Mapping[int, MemoryCap] | None = None,
) -> list[MemoryWarning]:
    """Warnings about the GPU's tenants; an empty list when everybody fits.

    ``own_requested_fraction``: what this kernel's mode will preallocate when its backend
    starts (None or 0 for ``off``/``platform``). ``own_needs_bytes``: memory this kernel says it
    needs. ``own_jax_in_use``/``own_reserved``: bytes its arrays use and its allocator reserved.
    ``read_at``: where the warnings are read (:data:`IN_IPYTHON`, :data:`AT_SHELL`).
    ``agent``: the node
    agent's :class:`~jax_nbmem.node.resolution.Resolution`; a stale one is an
    ``agent-stale`` warning (which then stands for ``pid-namespace``).
    ``own_caps``: the MPS or HAMi cap on this kernel's GPUs, by NVML index; a mode that will
    not fit under one is ``prealloc-exceeds-cap`` there (else it is judged against what CUDA
    will report under the cap). A GPU whose free memory is unknown raises no warning about it.
    """
    tenants, by_index = list(tenants), {gpu.index: gpu for gpu in gpus}
    # A container without the agent: its unknown rows, else (every row inferred, this
    # kernel's own too) one inferred row; either way nothing is proven, and the advice stands.
    foreign = next((t for t in tenants if _in_foreign_namespace(t)), None) or next(
        (t for t in tenants if (t.reason or "").startswith(INFERRED_WITHOUT_AGENT)), None
    )
    found = []
    stale = agent is not None and agent.state == "stale"
    if stale:
        found.append(MemoryWarning("agent-stale", None, None, _stale_message(agent, tenants)))
    fresh = agent is not None and agent.state == "fresh"  # a PID it has not listed yet
    if foreign is not None and not stale and not fresh:
        found.append(MemoryWarning("pid-namespace", None, None, _namespace_message(foreign)))
    # In a container, memory held outside it is judged by its size (or a kernel's claim).
    found += _blocking(tenants, by_index, own_needs_bytes, own_name, read_at)
    found += _self_preallocation(tenants, own_jax_in_use, own_reserved, own_name, by_index)
    if not own_backend_started and own_requested_fraction:
        found += pending_pool_warnings(
            tenants, by_index.values(), own_requested_fraction, own_caps, own_name
        )
    return found


def pending_pool_warnings(
    tenants: Iterable[Tenant],
    gpus: Iterable[GpuMemory],
    fraction: float,
    caps: Mapping[int, MemoryCap] | None = None,
    own_name: str = OWN_NAME,
) -> list[MemoryWarning]:
    """What the pool this kernel's JAX will take at its start (``fraction`` of each GPU) meets.

    On each of ``gpus`` (those its JAX will use: ``jax_cuda_visible_devices`` may narrow this
    kernel's GPUs): ``prealloc-exceeds-cap`` under an MPS or HAMi cap (``caps``, by NVML
    index), else ``prealloc-will-fail`` where less is free than the pool asks.
    """
    caps, gpus = caps or {}, list(gpus)
    over = _exceeds_cap(gpus, caps, fraction, own_name)
    views = [capped_reading(gpu, caps.get(gpu.index)) for gpu in gpus
             if gpu.index not in {w.gpu for w in over}]  # fmt: skip
    return over + _will_fail(list(tenants), views, fraction, own_name)


# This kernel's arrays using under a quarter of what it reserved makes its reserve mostly idle.
_SMALL_USE = 0.25
# Room left for the CUDA context when suggesting a fraction that fits.
_CONTEXT_RESERVE_BYTES = CONTEXT_RESERVE_BYTES


def _in_foreign_namespace(tenant: Tenant) -> bool:
    return (tenant.reason or "").startswith(PID_NAMESPACE_REASON)


_LISTED = 5  # the rows a warning lists by PID; more are counted
_AGENT_ADVICE = (
    "Ask the administrator to run the node agent on this GPU node (`jax-nbmem exporter "
    "--share-dir DIR` on the host, DIR being the share directory mounted in every container; "
    "on Kubernetes its DaemonSet, `--agent-listen` at the address pods are given): it names "
    "every process on the GPU by its host PID, for every container."
)


def _namespace_message(tenant: Tenant) -> str:
    detail = (tenant.reason or "").removeprefix(f"{PID_NAMESPACE_REASON}: ")
    if detail.startswith(INFERRED_WITHOUT_AGENT):
        detail = f"host PID {tenant.pid} is {detail}"
    return (
        "NVML reports process IDs from the host's PID namespace and they do not match the "
        f"processes here ({detail}), so the GPU's other users cannot be named for sure; "
        f"memory held outside is judged by its size. {_AGENT_ADVICE}"
    )


def _stale_message(agent, tenants: list[Tenant]) -> str:
    """What a stale agent leaves: which rows are inferred, which unknown, and what to do."""
    inferred = [t for t in tenants if t.source == "inferred"]
    unknown = [t for t in tenants if t.kind == "unknown"]

    def pids(rows: list[Tenant]) -> str:
        shown = [f"PID {t.pid}" + (f" ({who})" if (who := _who(t)) else "")
                 for t in rows[:_LISTED]]  # fmt: skip
        more = f" and {len(rows) - _LISTED} more" if len(rows) > _LISTED else ""
        return ", ".join(shown) + more

    said = [
        f"inferred (not proven, never acted on): {pids(inferred)}"
        if inferred
        else "nothing is inferred (no live kernel's beacon accounts for any process's memory)"
    ]
    if unknown:
        said.append(f"unknown, judged by their size only: {pids(unknown)}")
    return (
        f"The node agent stopped resolving host PIDs ({agent.reason}). Until it runs again, "
        f"{'; '.join(said)}. Ask the administrator to restart it (`jax-nbmem exporter "
        "--share-dir DIR` on the host; on Kubernetes, its DaemonSet's pod on this node)."
    )


def _label(
    tenant: Tenant, *, start: bool = True, own_name: str = OWN_NAME, read_at: str = IN_IPYTHON
) -> str:
    noun = {"self": own_name, "kernel": "kernel", "process": "process"}.get(tenant.kind)
    notebook = tenant.notebook_shown or tenant.notebook
    details = [f"notebook {notebook}"] if notebook else []
    # Without a notebook, the command says what it is; for a process judged only by its
    # size it is all there is to go by.
    if tenant.cmdline and (tenant.kind == "process" or tenant.source == "memory size"):
        details.append(f"`{tenant.cmdline}`")
    if read_at == AT_SHELL or is_someone_else(tenant.user, tenant.hub_user):
        owner = owner_text(tenant.user, tenant.hub_user, tenant.user_source)
        details += [owner] if owner else []
    shown = container_text(tenant.container) if tenant.elsewhere else None
    if shown:  # another container's: "container notebook in pod jhub/jupyter-alice"
        details.append(shown)
    text = f"{noun or 'unidentified process'} PID {tenant.pid}"
    text += f" ({', '.join(details)})" if details else ""
    return text[0].upper() + text[1:] if start else text


def _who(tenant: Tenant) -> str:
    """Whom to ask about ``tenant``: its hub user, else its Unix user ("" when unknown)."""
    return who_text(tenant.user, tenant.hub_user, tenant.user_source)


def _idle_clause(tenant: Tenant) -> str:
    if tenant.idle_s is None:
        return ""
    if tenant.idle_s == 0:
        return " It is busy right now."
    if tenant.idle_source == "server":  # widget and comm traffic count as activity there
        return (
            f" Its Jupyter server saw it active {format_duration(tenant.idle_s)} ago "
            "(approximate: a live widget counts as activity)."
        )
    return f" It has been idle for {format_duration(tenant.idle_s)} since its last cell."


def _fix(tenant: Tenant, read_at: str = IN_IPYTHON) -> str:
    restart = "restart it with `%jaxalloc off` in its first cell"
    if tenant.elsewhere:  # another container: nothing here can stop it
        return _fix_elsewhere(tenant, restart)
    command = "jax-nbmem shutdown" if read_at == AT_SHELL else "%jaxmem shutdown"
    # Each command advised is one that acts when pasted: `%jaxmem shutdown PID` alone is a dry
    # run, and `--yes` says the same to `jax-nbmem shutdown`, whose default is to act.
    # In a container `jax-nbmem shutdown` takes the PID there (the agent's translation of the
    # host PID shown); `%jaxmem shutdown` takes the host PID it showed and translates it itself.
    here = tenant.pid_here if tenant.pid_here not in (None, tenant.pid) else None
    pid = here if here is not None and read_at == AT_SHELL else tenant.pid
    there = ", its PID in this container" if pid == here else ""
    if is_someone_else(tenant.user, tenant.hub_user):
        if may_stop_others():
            return (
                f"As an administrator, stop it with `jax-nbmem shutdown {pid} --yes`{there} "
                f"(through its Jupyter server when it is a kernel), or ask its owner to {restart}."
            )
        owner = _who(tenant)
        return (
            f"Ask its owner ({owner}) to shut it down or to {restart}, or ask an "
            f"administrator to run `jax-nbmem shutdown {pid} --yes`{there} (`{command}` "
            "stops only your own kernels)."
        )
    if tenant.kind == "kernel":
        return f"Shut it down (`{command} {pid} --yes`{there}) or {restart}."
    return (
        "Stop it, or start it with XLA_PYTHON_CLIENT_PREALLOCATE=false so that JAX takes "
        "memory only as its arrays need it."
    )


def _fix_elsewhere(tenant: Tenant, restart: str) -> str:
    host = f"on the host with `jax-nbmem shutdown {tenant.pid}`"
    if tenant.kind == "unknown":
        return (
            f"This container cannot tell which process host PID {tenant.pid} is. "
            f"{_AGENT_ADVICE} An administrator can stop it {host}."
        )
    owner = f" ({_who(tenant)})" if _who(tenant) else ""
    if tenant.source == "inferred":
        return (
            f"If that kernel is yours, {restart}; otherwise ask its owner{owner} to. An "
            f"administrator can check which kernel it is and stop it {host}."
        )
    # Where it runs, as its row says: a neighbour on the host is outside this container but
    # in no container at all.
    on_host = not tenant.container and tenant.pid_in_container is None
    where = "on the host, outside this container" if on_host else "in another container"
    return (
        f"It runs {where}: ask its owner{owner} to shut it down or to {restart}, "
        f"or an administrator to stop it {host} (`%jaxmem shutdown` stops only kernels in "
        "this container)."
    )


def _why_preallocated(tenant: Tenant) -> str:
    """How we know that its memory is a preallocated pool, as its source tells."""
    if tenant.source == "inferred":
        return f"probably JAX preallocation, {tenant.reason}"
    if tenant.source in ("beacon", "agent"):
        mode = f" in mode '{tenant.mode}'" if tenant.mode else ""
        if (tenant.jax or {}).get("pool_bytes"):
            return f"its JAX runs{mode} and preallocated it as a pool, as the kernel itself reports"
        # Its beacon tells the mode but no pool (none yet for that GPU, or JAX started since
        # it was written): the size NVML shows is that mode's pool.
        return (
            f"its JAX runs{mode}, as the kernel itself reports, and NVML shows it holding the "
            "pool that mode preallocates"
        )
    if tenant.source == "memory size":
        whose = (
            "a process known only by its host PID" if tenant.elsewhere else "another user's process"
        )
        return (
            "probably JAX preallocation: its size matches the pool JAX takes by default "
            f"({DEFAULT_FRACTION:.0%} of the GPU, or a 0.9x step below it), and {whose} "
            "cannot be looked into to be sure"
        )
    started = f" (it started in mode '{tenant.mode_at_start}')" if tenant.mode_at_start else ""
    return f"its JAX preallocated it at its first allocation{started}"


def _blocking(
    tenants, by_index, own_needs_bytes, own_name=OWN_NAME, read_at=IN_IPYTHON
) -> list[MemoryWarning]:
    found = []
    for tenant in tenants:
        gpu = by_index.get(tenant.gpu)
        if tenant.kind == "self" or not tenant.preallocated or gpu is None:
            continue
        if gpu.free_bytes is None or gpu.total_bytes is None:
            continue
        default_bytes = DEFAULT_FRACTION * gpu.total_bytes
        if own_needs_bytes is not None and gpu.free_bytes < own_needs_bytes:
            short = f"less than the {format_bytes(own_needs_bytes)} {own_name} needs"
        elif gpu.free_bytes < default_bytes:
            short = (
                "too little for another kernel to start JAX in its default mode "
                f"({format_bytes(default_bytes)}, {DEFAULT_FRACTION:.0%} of the GPU)"
            )
        else:
            continue
        message = (
            f"{_label(tenant, read_at=read_at)} holds {format_bytes(tenant.used_bytes)} of "
            f"{gpu_label(gpu)}: {_why_preallocated(tenant)}.{_idle_clause(tenant)} Only "
            f"{format_gib(gpu.free_bytes)} is free, {short}. {_fix(tenant, read_at)}"
        )
        found.append(MemoryWarning("blocking-preallocation", gpu.index, tenant.pid, message))
    return found


def _self_preallocation(
    tenants, own_jax_in_use, own_reserved, own_name=OWN_NAME, by_index=None
) -> list[MemoryWarning]:
    found = []
    for own in (t for t in tenants if t.kind == "self" and t.preallocated):
        gpu = (by_index or {}).get(own.gpu)
        where = gpu_label(gpu) if gpu is not None else f"GPU {own.gpu}"
        others = [t for t in tenants if t.gpu == own.gpu and t.kind != "self"]
        reserved = own_reserved if own_reserved is not None else own.used_bytes
        if others:
            many = len(others) > 1
            why = f"while {len(others)} other process{'es share' if many else ' shares'} it"
        elif own_jax_in_use is not None and reserved and own_jax_in_use < _SMALL_USE * reserved:
            why = f"while its arrays use only {format_bytes(own_jax_in_use)}"
        else:
            continue
        when = "in its first cell" if own_name == OWN_NAME else "at its start"
        message = (
            f"{own_name[0].upper() + own_name[1:]} (PID {own.pid}) preallocated "
            f"{format_bytes(own.used_bytes)} of {where} {why}. Restart it with "
            f"`%jaxalloc off` {when} so that it holds only what its arrays need (the mode "
            "applies only before JAX starts)."
        )
        found.append(MemoryWarning("self-preallocation", own.gpu, own.pid, message))
    return found


def _will_fail(tenants, gpus, fraction: float, own_name=OWN_NAME) -> list[MemoryWarning]:
    found = []
    for gpu in gpus:
        if gpu.free_bytes is None or gpu.total_bytes is None:
            continue
        wanted = fraction * gpu.total_bytes
        if gpu.free_bytes >= wanted:
            continue
        room = max(0, gpu.free_bytes - _CONTEXT_RESERVE_BYTES) / gpu.total_bytes
        fits = math.floor(room * 20) / 20  # in steps of 5%, rounded down
        option = f"`%jaxalloc fraction {fits:g}`, which fits, or " if fits >= 0.05 else ""
        # BFC then asks for 0.9x as much, again and again, and takes the first that fits.
        smaller = next((pool for pool in pool_sizes(fraction, gpu.total_bytes)
                        if pool + _CONTEXT_RESERVE_BYTES <= gpu.free_bytes), None)  # fmt: skip
        outcome = (
            f"it will take a smaller pool (about {format_bytes(smaller)}, retrying at 0.9x "
            "steps) and cells that need more will run out of memory"
            if smaller is not None
            else "there is not even room for a small pool: its first arrays will run out of memory"
        )
        message = (
            f"At its first allocation {own_name}'s JAX will ask for {fraction:.0%} of "
            f"{gpu_label(gpu)} ({format_bytes(wanted)}), but only "
            f"{format_gib(gpu.free_bytes)} is free"
            f"{_holders(tenants, gpu.index, own_name=own_name)}: {outcome}. Before any JAX "
            "code runs, choose "
            f"{option}`%jaxalloc off` (memory taken as arrays need it)."
        )
        found.append(MemoryWarning("prealloc-will-fail", gpu.index, None, message))
    return found


def _exceeds_cap(gpus, caps, fraction: float, own_name=OWN_NAME) -> list[MemoryWarning]:
    found = []
    for gpu in gpus:
        cap = caps.get(gpu.index)
        if cap is None or gpu.total_bytes is None:
            continue
        taken = pool_under_cap(fraction, gpu.total_bytes, cap)
        if taken.fits:
            continue
        of = "the cap"
        if not cap.cuda_total_is_cap:
            of = f"the whole of {gpu_label(gpu)}, as CUDA reports it"
        whole = cap.bytes if cap.cuda_total_is_cap else gpu.total_bytes
        fits = math.floor(max(0, cap.bytes - _CONTEXT_RESERVE_BYTES) / whole * 20) / 20
        option = f"`%jaxalloc fraction {fits:g}`, which fits, or " if fits >= 0.05 else ""
        outcome = (
            f"its 0.9x retries end at {format_bytes(taken.pool)}, nearly all of the cap, and "
            "cells that need more than that pool will run out of memory"
            if taken.pool
            else "no pool fits under the cap: its first arrays will run out of memory"
        )
        message = (
            f"At its first allocation {own_name}'s JAX will ask for {fraction:.0%} of {of} "
            f"({format_bytes(taken.asked)}), but {cap.system} caps this process at "
            f"{format_bytes(cap.bytes)} on {gpu_label(gpu)} ({cap.variable}): {outcome}. Before "
            f"any JAX code runs, choose {option}`%jaxalloc off` (memory taken as arrays need it)."
        )
        found.append(MemoryWarning("prealloc-exceeds-cap", gpu.index, None, message))
    return found


def _holders(tenants, gpu_index: int, limit: int = 3, own_name: str = OWN_NAME) -> str:
    on_gpu = [t for t in tenants if t.gpu == gpu_index and t.used_bytes and t.kind != "unknown"]
    on_gpu.sort(key=lambda t: -t.used_bytes)
    if not on_gpu:
        return ""
    parts = [
        f"{_label(t, start=False, own_name=own_name)}: {format_bytes(t.used_bytes)}"
        for t in on_gpu[:limit]
    ]
    return f" (held by {'; '.join(parts)})"


def oom_diagnosis(
    tenants: Iterable[Tenant], gpus: Iterable[GpuMemory], own_name: str = OWN_NAME
) -> str:
    """Plain text for under a RESOURCE_EXHAUSTED traceback: who holds each GPU, what to do."""
    tenants = list(tenants)
    lines = ["JAX ran out of GPU memory. Who holds it:"]
    for gpu in gpus:
        lines.append(
            f"{gpu_label(gpu)} ({gpu.name or 'name unknown'}): {format_bytes(gpu.used_bytes)} "
            f"used of {format_bytes(gpu.total_bytes)}, {format_bytes(gpu.free_bytes)} free"
        )
        on_gpu = sorted((t for t in tenants if t.gpu == gpu.index), key=_bytes_first)
        for tenant in on_gpu:
            notes = ""
            if tenant.preallocated:
                notes = (
                    ", probably preallocated"
                    if tenant.source == "memory size"
                    else ", preallocated"
                )
            if tenant.source in ("beacon", "session", "agent", "inferred") and tenant.mode:
                notes += f", mode {tenant.mode}"
            if tenant.kind == "unknown" and tenant.reason:
                notes += f", not identified: {tenant.reason}"
            label = _label(tenant, own_name=own_name)
            lines.append(f"  - {label}: {format_bytes(tenant.used_bytes)}{notes}")
        if not on_gpu:
            lines.append("  - no process listed by NVML")
    lines.append("What to do:")
    foreign = next((t for t in tenants if _in_foreign_namespace(t)), None)
    if foreign is not None:
        lines.append(f"  - {_namespace_message(foreign)}")
    for tenant in tenants:
        if tenant.kind in ("kernel", "process") and tenant.preallocated:
            verb = "probably preallocated" if tenant.source == "memory size" else "preallocated"
            label = _label(tenant, own_name=own_name)
            lines.append(f"  - {label} {verb} its memory. {_fix(tenant)}")
    if any(t.kind == "self" and t.preallocated for t in tenants):
        lines.append(
            f"  - {own_name[0].upper() + own_name[1:]}'s arrays filled its own preallocated "
            "share: free arrays you no "
            "longer need (`del x`), use smaller batches, or restart it with a larger "
            "`%jaxalloc fraction F`."
        )
    if len(lines) == next(i for i, line in enumerate(lines) if line == "What to do:") + 1:
        lines.append(
            f"  - Nothing else preallocated this GPU: {own_name}'s arrays need more than is "
            "free. Free arrays you no longer need (`del x`) or use smaller batches."
        )
    return printable_lines("\n".join(lines))


def _bytes_first(tenant: Tenant) -> int:
    return -(tenant.used_bytes or 0)
