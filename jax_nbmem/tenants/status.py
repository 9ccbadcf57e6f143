"""The status report behind ``jax_nbmem.status()``, ``%jaxmem status`` and ``jax-nbmem status``.

One JSON-friendly object: ``nvml`` (``available``, ``reason``), ``gpus``, ``processes`` (each
attributed: ``self`` / ``kernel`` / ``process`` / ``unknown``, with the notebook and whether it
preallocated), ``warnings`` (``kind``, ``gpu``, ``pid``, ``message``), and this process's
allocator mode. Nothing here starts JAX's backend; NVML being absent is a value, not an error.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import psutil

from jax_nbmem.agent.cgroups import container_text
from jax_nbmem.agent.hostproof import host_proof
from jax_nbmem.allocator.caps import caps_by_gpu
from jax_nbmem.allocator.extras import jax_pool_devices
from jax_nbmem.allocator.jaxlib import effective
from jax_nbmem.gpu import jaxstats, nvml, own_process
from jax_nbmem.gpu.frameworks import split_lines
from jax_nbmem.gpu.mig import mig_dict, shown_order
from jax_nbmem.gpu.visible import visible_gpus
from jax_nbmem.node.agent_client_tcp import network_configured, network_notice
from jax_nbmem.node.beacons import beacon_dirs, read_beacons
from jax_nbmem.node.identity import beacon_key, in_initial_namespace, own_identity
from jax_nbmem.node.notices import notice_warning, read_notice, relayed_notice
from jax_nbmem.node.resolution import load_resolution
from jax_nbmem.node.sharedir import agent_not_consulted, find_share_dir
from jax_nbmem.tenants.advice import (
    AT_SHELL,
    IN_IPYTHON,
    OWN_NAME,
    pending_pool_warnings,
    warnings_for,
)
from jax_nbmem.tenants.attribution import attribute
from jax_nbmem.tenants.containers import from_container
from jax_nbmem.tenants.own_memory import own_split
from jax_nbmem.tenants.owners import in_container, is_someone_else, owner_text
from jax_nbmem.text import printable, printable_lines
from jax_nbmem.units import format_bytes, format_duration, format_gib

__all__ = ["StatusReport", "cap_line", "collect", "format_status", "warning_line"]


# How a row says where its mode and pool come from, in a user's words; the JSON keeps the
# ``source`` key's own values. A process's own row (``session``) is "<its own name>'s own
# record": this kernel's, this IPython session's.
_SOURCE_WORDS = {
    "beacon": "the kernel's own report",
    "agent": "proven by the node agent",
    "environment": "read from its environment variables",
    "inferred": "inferred, not proven",
    "memory size": "judged by its size",
}


class StatusReport(dict):
    """A plain dict (``report["gpus"]``) that also reads as attributes (``report.gpus``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    _tenants: list = []
    _gpu_memory: list = []
    _own_name: str = OWN_NAME

    def tenants(self) -> list:
        """The attributed `Tenant` records behind ``processes``."""
        return list(self._tenants)

    def gpu_memory(self) -> list:
        """The NVML `GpuMemory` readings behind ``gpus``."""
        return list(self._gpu_memory)

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(format_status(self, self._own_name))


def _own_start() -> float | None:
    try:
        return psutil.Process().create_time()
    except psutil.Error:
        return None


def _own_jax_bytes() -> tuple[int | None, int | None]:
    """Bytes this process's arrays use and its allocator's pool holds, summed over GPUs."""
    stats = [s for s in jaxstats.device_stats() if s.bytes_in_use is not None]
    if not stats:
        return None, None
    in_use = sum(s.bytes_in_use for s in stats)
    held = [s.held_bytes for s in stats]
    return in_use, (sum(held) if all(h is not None for h in held) else None)


def collect(
    *,
    control=None,
    environ: Mapping[str, str] | None = None,
    own_pid: int | None = None,
    in_kernel: bool = False,
    share_dir: str | None = None,
    sessions=None,
    own_name: str = OWN_NAME,
    own=None,
    host=None,
    agent_user: str | None = None,
    read_at: str = IN_IPYTHON,
) -> StatusReport:
    """Read NVML, attribute its processes and derive the warnings.

    ``control`` (an `AllocatorControl`) adds this kernel's allocator report; ``in_kernel``
    makes warnings about *this* process (its preallocation, whether its mode will fit).
    The attributed `Tenant` records stay available as ``report.tenants()`` (not in the JSON).
    ``sessions`` (kernel id → `ServerKernel`) stands for asking the running Jupyter servers,
    e.g. a server's own kernels as the server extension knows them. ``own_name`` is how the
    warnings name this process ("this kernel"; "this IPython session" in a terminal).
    ``own`` (a `Beacon` built from the kernel's session, not read from a file) is what this
    process knows of itself: its row says that (``source: session``, no idleness: it is
    running the cell that asks). No beacon file is ever believed about this process.
    ``host`` (a `HostProof`; default: :func:`~.hostproof.host_proof` outside a kernel, on the
    host only; False: none) brings the node agent's proven kernels and the host's view of
    containers: every process entry gets ``pid_in_container`` and ``container``.

    With a share directory, the node agent's resolution there (trusted as
    :mod:`~jax_nbmem.node.resolution` says; ``agent_user`` names its user besides root)
    names processes in containers; the report's ``agent`` says what became of it (``state``,
    ``reason``, ``age_s``...). ``pid`` is this process's host PID (None in a container whose
    host PID is unknown) and ``pid_in_container`` its own PID there (None on the host).

    ``read_at`` is where the warnings are read: in IPython (the default: they name `%jaxmem`)
    or at a shell prompt (``AT_SHELL``: `jax-nbmem status`; they name `jax-nbmem` commands and
    every process's owner).
    """
    environ = os.environ if environ is None else environ
    # NVML's PID for this process (given, in tests; else jax_nbmem.gpu.own_process's), and its
    # PID in its own namespace, which its beacon and /proc here know it by.
    nvml_own = own_process.nvml_pid() if own_pid is None else own_pid
    own_pid = os.getpid() if own_pid is None else own_pid
    look = _look_at_gpus(environ)
    backend_started = jaxstats.backend_initialized()
    on_gpu = backend_started and any(
        p in jaxstats.GPU_PLATFORMS for p in jaxstats.initialized_platforms()
    )
    dirs = beacon_dirs(share_dir)
    shared = find_share_dir(share_dir, default=None).path
    resolution = load_resolution(shared, agent_user=agent_user, environ=environ)
    identity = own_identity()
    in_container = in_initial_namespace(identity) is False
    if in_container:  # NVML's PIDs are the host's: resolved, or inferred
        beacons = {own_pid: own} if own is not None else {}
        tenants = from_container(look.processes, look.gpus, identity, resolution, dirs, beacons,
                                 own_pid, environ, sessions)  # fmt: skip
    else:
        if host is None and not in_kernel:
            host = host_proof(share_dir)
        beacons = _host_beacons(look, dirs, host, nvml_own, own)
        tenants = attribute(
            look.processes,
            look.gpus,
            own_pid=nvml_own,
            environ=environ,
            own_on_gpu=on_gpu if in_kernel else None,
            beacons=beacons,
            sessions=sessions,
            resolution=None if host else resolution,
            dirs=dirs,
            identity=identity,
        )
    tenants = _as_shown(tenants, host, own)
    notes = [look.visible.note] if look.visible.note else []
    caps, cap_problems = caps_by_gpu(environ, look.gpus)  # MPS's or HAMi's, in this environment
    notes += cap_problems
    tenants = [  # the caps are this process's own (its environment's): on its own rows
        replace(t, memory_cap_bytes=caps[t.gpu].bytes) if t.kind == "self" and t.gpu in caps else t
        for t in tenants
    ]
    ours = set(look.visible.indices)
    facts = _own_allocator_facts(environ, in_kernel, backend_started)
    warnings = _warnings([t for t in tenants if t.gpu in ours], look, facts, caps,
                         own_name=own_name, agent=resolution, read_at=read_at)  # fmt: skip
    notes += _agent_notes(resolution, shared, environ)
    host_pid = _own_host_pid(tenants, resolution, identity) if in_container else nvml_own
    report = StatusReport(
        nvml={
            "available": look.state.available,
            "reason": look.state.reason,
            "driver_version": nvml.driver_version() if look.state.available else None,
        },
        gpus=[_gpu_entry(g, ours, caps, look.list_problems) for g in look.gpus],
        processes=[t.to_dict() for t in tenants],
        warnings=[w.to_dict() for w in warnings],
        notes=notes,
        pid=host_pid,
        pid_in_container=own_pid if in_container else None,
        agent=resolution.to_dict(),
    )
    if host:
        _annotate_from_host(report, host, notes, read_at)
    for process in report["processes"]:
        process.setdefault("pid_in_container", None)
        process.setdefault("container", None)
    if in_kernel and host_pid is not None:  # the node's GPU culler may have warned this kernel
        key = beacon_key(identity) if in_container else None
        pending = _pending_cull(dirs, host_pid, key, tenants)
        if pending is not None:
            report["warnings"].insert(0, pending)
    _keep_for_formatting(report, tenants, look, own_name)
    if control is not None:
        report["allocator"] = control.report().to_dict()
    if in_kernel:  # this kernel's own GPU memory by holder: JAX, other frameworks, the rest
        _add_own_split(report, tenants, host_pid, look)
    if not look.gpus and not in_kernel:
        report["host"] = None  # the key stays; a CLI's own host memory would tell nothing
    elif not look.gpus:  # a kernel's own host memory, what it shows instead of a GPU
        report["host"] = _own_host_memory(backend_started)
    return report


def _as_shown(tenants: list, host, own) -> list:
    """The rows as the report shows them, before the warnings that name their owners.

    Each in a container named by its container's user (:func:`_container_user`); this
    process's own row judged by its session (:func:`_from_session`) when ``own`` is given.
    """
    if host:
        tenants = [_container_user(t, host) for t in tenants]
    if own is not None:
        tenants = [_from_session(t) if t.kind == "self" else t for t in tenants]
    return tenants


def _container_user(tenant, host):
    """``tenant`` named by its container's user where it runs in one, never the host's account.

    See :meth:`~jax_nbmem.agent.hostproof.HostProof.shown_user`.
    """
    shown = host.shown_user(tenant.pid)
    if shown is None:
        return tenant
    host_side = {"user": tenant.user, "notebook": tenant.notebook,
                 "notebook_shown": tenant.notebook_shown}  # fmt: skip
    return replace(tenant, **in_container(host_side, *shown))


def _agent_notes(resolution, shared: str | None, environ: Mapping[str, str]) -> list[str]:
    """What the report notes of the node agent: a resolution untrusted, malformed or cut short.

    Also a pod given the agent's address that has not heard from it (a plain host without
    one is not).
    """
    unheard = resolution.state == "absent" and not shared and network_configured(environ)
    partial = resolution.state == "fresh" and resolution.reason
    if resolution.state in ("untrusted", "malformed") or unheard or partial:
        return [f"Node agent: {resolution.reason}."]
    return []


def _own_host_pid(tenants, resolution, identity) -> int | None:
    """In a container: this process's host PID, as the node agent proved it.

    Over its socket (:mod:`jax_nbmem.gpu.own_process`), else in its resolution, else its own
    row (inferred where nothing proves it).
    """
    host_pid = own_process.proven_pid()
    if host_pid is None and resolution.fresh and (row := resolution.own_row(identity)):
        host_pid = row.pid
        own_process.set_proven_pid(host_pid)  # the agent's proof, however it came
    if host_pid is None:
        host_pid = next((t.pid for t in tenants if t.kind == "self"), None)
    return host_pid


@dataclass(frozen=True)
class _GpuLook:
    """One look at NVML: the GPUs, which of them this process sees, and their processes."""

    gpus: list
    visible: Any
    processes: list
    list_problems: dict[int, str]
    state: Any


def _look_at_gpus(environ: Mapping[str, str]) -> _GpuLook:
    gpus = nvml.gpus()
    listings = nvml.process_lists(None)
    return _GpuLook(
        gpus=gpus,
        visible=visible_gpus(gpus, environ),
        processes=[p for listing in listings for p in listing.processes or ()],
        # A GPU whose process list failed has unknown tenants, not none: its problem says so.
        list_problems={listing.gpu: listing.problem for listing in listings if listing.problem},
        state=nvml.status(),  # after the calls, so that it says whether they were slow
    )


def _keep_for_formatting(report: StatusReport, tenants, look: _GpuLook, own_name: str) -> None:
    """What :func:`format_status` reads beside the report's keys (never serialised)."""
    report._tenants = tenants
    report._gpu_memory = look.gpus
    report._own_name = own_name


def _add_own_split(report: StatusReport, tenants, own_pid: int | None, look: _GpuLook) -> None:
    """``own_split`` and ``frameworks`` (see :mod:`.own_memory`); a failure is said, not raised."""
    allocator = report.get("allocator") or {}
    try:
        report.update(own_split(tenants, own_pid, look.visible.indices, look.gpus,
                                allocator.get("collective_bytes")))  # fmt: skip
    except Exception as exc:
        report.update({"own_split": None, "frameworks": [], "own_split_problem": repr(exc)})


def _host_beacons(look: _GpuLook, dirs, host, own_pid: int | None, own) -> dict:
    """On the host: the beacons of the GPU's processes, checked by the node agent's proofs.

    No beacon file is ever believed about this process: its own (``own``) is its session's.
    """
    beacons = read_beacons(dirs, pids={p.pid for p in look.processes})
    if host:  # the node agent's proven kernels, each checked again against the host's view
        beacons = host.beacons(beacons, {p.pid for p in look.processes})
    beacons = {pid: beacon for pid, beacon in beacons.items() if pid != own_pid}
    if own is not None and own_pid is not None:
        beacons[own_pid] = own
    return beacons


def _own_allocator_facts(
    environ: Mapping[str, str], in_kernel: bool, backend_started: bool
) -> dict[str, Any]:
    """What this kernel's own warnings weigh: its backend, its pending pool, JAX's bytes."""
    fraction = None
    if in_kernel and not backend_started:
        pending = effective(environ)
        if pending.preallocate and pending.allocator != "platform" and not pending.error:
            fraction = pending.fraction
    in_use, reserved = _own_jax_bytes() if in_kernel and backend_started else (None, None)
    return {
        "own_backend_started": backend_started if in_kernel else True,
        "own_requested_fraction": fraction,
        "own_jax_in_use": in_use,
        "own_reserved": reserved,
    }


def _warnings(tenants, look: _GpuLook, facts: dict, caps, **said) -> list:
    """The warnings of this kernel's GPUs (``tenants``: the rows on them).

    Those of the pool its JAX will take at its start speak only of the GPUs that JAX will use
    (``jax_cuda_visible_devices`` may narrow them).
    """
    ours = set(look.visible.indices)
    facts = dict(facts)
    fraction = facts.pop("own_requested_fraction")
    warnings = warnings_for(tenants, [g for g in look.gpus if g.index in ours], **facts,
                            own_caps=caps, **said)  # fmt: skip
    if fraction:  # only before this kernel's JAX starts
        pooled = set(jax_pool_devices(look.visible.indices))
        gpus = [g for g in look.gpus if g.index in pooled]
        warnings += pending_pool_warnings(tenants, gpus, fraction, caps, said["own_name"])
    return warnings


def _gpu_entry(gpu, ours: set[int], caps, list_problems: dict[int, str]) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "label": gpu.label,
        "mig": mig_dict(gpu.mig),
        "mig_mode": gpu.mig_mode,
        "total_bytes": gpu.total_bytes,
        "used_bytes": gpu.used_bytes,
        "reserved_bytes": gpu.reserved_bytes,
        "free_bytes": gpu.free_bytes,
        "ours": gpu.index in ours,
        "problem": nvml.gpu_problem(gpu.problem, list_problems.get(gpu.index)),
        "memory_cap_bytes": caps[gpu.index].bytes if gpu.index in caps else None,
        "memory_cap": caps[gpu.index].to_dict() if gpu.index in caps else None,
    }


def _annotate_from_host(report: StatusReport, host, notes: list[str], read_at: str) -> None:
    """The host's view of each process (its container, its PID there), from the node agent."""
    host.annotate(report["processes"])
    contained = any(p.get("container") or p.get("pid_in_container") is not None
                    for p in report["processes"])  # fmt: skip
    if host.resolution_reason and contained:  # their modes and idle times are the agent's
        notes.append(agent_not_consulted(host.resolution_reason, read_at == AT_SHELL))


def _pending_cull(dirs, host_pid: int, key: str | None, tenants) -> dict | None:
    """The warning of the node's GPU culler to this kernel, if it was warned."""
    own_start = _own_start()
    notice = read_notice(dirs, host_pid, own_start, key=key)
    if notice is None:  # a pod has no share directory: the agent relays its notice
        notice = relayed_notice(network_notice(), host_pid, own_start, key=key)
    own_gpu = next((t.gpu for t in tenants if t.kind == "self"), None)
    return notice_warning(notice, host_pid, own_gpu)


def _own_host_memory(backend_started: bool) -> dict[str, Any]:
    """A kernel's own host memory: what it shows instead of a GPU."""
    return {
        "rss_bytes": jaxstats.host_rss_bytes(),
        "live_array_bytes": jaxstats.live_array_bytes() if backend_started else None,
    }


def _from_session(tenant):
    """This process's row, judged by its session's own account (see ``collect``'s ``own``).

    A row known to be this process's only by inference (in a container without the node
    agent) stays marked ``inferred``.
    """
    source = "inferred" if tenant.source == "inferred" else "session"
    return replace(tenant, source=source, idle_s=None, idle_source=None)


def _process_line(process: Mapping[str, Any], own_name: str = OWN_NAME) -> str:
    kind = process["kind"]
    label = {"self": own_name, "kernel": "kernel", "process": "process"}.get(kind, kind)
    parts = [f"pid {process['pid']:<8} {label:<11} {format_bytes(process['used_bytes']):>10}"]
    if process.get("notebook"):
        parts.append(process.get("notebook_shown") or process["notebook"])
    elif process.get("cmdline") and kind != "self":
        parts.append(process["cmdline"])
    if is_someone_else(process.get("user"), process.get("hub_user")):
        # In a container: its container's name (a claim) or its uid, never the host's name.
        parts.append(owner_text(process.get("user"), process.get("hub_user"),
                                process.get("user_source")) or "")  # fmt: skip
    # With its pod, where it has one; where no runtime records it, its host name, claimed.
    shown = container_text(process.get("container"), process.get("container_hostname_claimed"))
    if shown:
        inner = process.get("pid_in_container")
        where = f" (pid {inner} there)" if inner is not None and kind != "self" else ""
        parts.append(f"{shown}{where}")
    source = process.get("source")
    if process.get("preallocated"):
        parts.append("[probably preallocated]" if source == "memory size" else "[preallocated]")
    if source in ("beacon", "session", "agent", "inferred") and process.get("mode"):
        parts.append(f"(mode: {process['mode']})")
    elif process.get("mode_at_start"):
        parts.append(f"(mode at its start: {process['mode_at_start']})")
    jax = process.get("jax") or {}
    if jax.get("bytes_in_use") is not None:
        pool = f", pool {format_bytes(jax['pool_bytes'])}" if jax.get("pool_bytes") else ""
        parts.append(f"JAX arrays {format_bytes(jax['bytes_in_use'])}{pool}")
    if process.get("idle_s") is not None:
        about = "~" if process.get("idle_source") == "server" else ""
        parts.append(f"idle {about}{format_duration(process['idle_s'])}")
    # Names this reader could not read itself (a user other than root) are the agent's.
    named = process.get("names_source") == "agent"
    if source and source != "unknown":
        words = f"{own_name}'s own record" if source == "session" else _SOURCE_WORDS.get(source)
        words = "proven and named by the node agent" if named and source == "agent" else words
        parts.append(f"[{words or f'source: {source}'}]")
    if named and source != "agent":
        parts.append("[named by the node agent]")
    if kind == "unknown" and process.get("reason"):
        parts.append(f"({process['reason']})")
    return "  ".join(parts)


def _shown_order(gpu: Mapping[str, Any]) -> tuple[int, int]:
    """A MIG instance is shown right after the GPU it splits."""
    mig = gpu.get("mig")
    return shown_order(gpu["index"], mig["parent_index"] if mig else None)


def cap_line(cap: Mapping[str, Any]) -> str:
    """A GPU's sharing cap as a person reads it (``memory_cap`` of a status's GPU)."""
    system = "MPS" if cap["kind"] == "mps" else "HAMi"
    counts = "the cap" if cap.get("cuda_total_is_cap") else "the whole GPU"
    return (
        f"capped at {format_bytes(cap['bytes'])} for this process by {system} "
        f"({cap['variable']}); JAX's fraction counts {counts}"
    )


def warning_line(warning: Mapping[str, Any]) -> str:
    """One warning as printed everywhere: ``WARNING [kind]: message``."""
    return printable_lines(f"WARNING [{warning['kind']}]: {warning['message']}")


def format_status(report: Mapping[str, Any], own_name: str = OWN_NAME) -> str:
    """The report as a person reads it: GPUs, their processes, then warnings."""
    lines = []
    nvml_state = report["nvml"]
    if not nvml_state["available"]:
        lines.append(f"NVML unavailable: {nvml_state['reason']}")
        host = report.get("host") or {}
        if host:
            lines.append(
                f"Host memory of this process (no GPU view): RSS {format_bytes(host['rss_bytes'])}"
                f", JAX live arrays {format_bytes(host.get('live_array_bytes'))}"
            )
    elif nvml_state.get("reason") and not any(
        nvml_state["reason"] in (gpu.get("problem") or "") for gpu in report["gpus"]
    ):  # a problem of one GPU is said under that GPU
        lines.append(f"NVML: {nvml_state['reason']}")
    for gpu in sorted(report["gpus"], key=_shown_order):
        mark = "" if gpu["ours"] else "  (not visible to this process)"
        if gpu.get("mig_mode"):
            mark = "  (in MIG mode: its MIG instances are the GPUs, listed below)"
        reserved = gpu.get("reserved_bytes")
        reserved_text = f", {format_bytes(reserved)} reserved by the driver" if reserved else ""
        lines.append(
            f"{gpu.get('label') or 'GPU ' + str(gpu['index'])}: {gpu['name'] or 'name unknown'} — "
            f"{format_bytes(gpu['used_bytes'])} used of {format_bytes(gpu['total_bytes'])}, "
            # Free as the panel's header and the lab item say it: one figure everywhere.
            f"{format_gib(gpu['free_bytes'])} free{reserved_text}{mark}"
        )
        if gpu.get("problem"):
            lines.append(f"  {gpu['problem']}")
        if gpu.get("memory_cap"):
            lines.append(f"  {cap_line(gpu['memory_cap'])}")
        on_gpu = [p for p in report["processes"] if p["gpu"] == gpu["index"]]
        lines.extend("  " + _process_line(p, own_name) for p in on_gpu)
        unread = "process list unreadable" in (gpu.get("problem") or "")
        if not on_gpu and not unread and not gpu.get("mig_mode"):
            lines.append("  no processes")
    lines.extend(f"Note: {note}" for note in report.get("notes", []))
    allocator = report.get("allocator")
    if allocator:
        started = allocator["backend"]
        if started:
            platforms = ", ".join(started["platforms"]) or "unknown platform"
            lines.append(f"This kernel's JAX started on {platforms} with: {started['mode']}")
        else:
            lines.append(
                f"This kernel's JAX has not started; next start: {allocator['next_start']['mode']}"
            )
    split = report.get("own_split") or []
    if split:
        lines.append(f"{own_name[0].upper() + own_name[1:]}'s GPU memory by holder:")
        lines.extend("  " + line for line in split_lines(split))
    for framework in report.get("frameworks") or []:
        if not framework["started"]:
            lines.append(f"Not counted: {framework['name']} ({framework['reason']}).")
    lines.extend(map(warning_line, report["warnings"]))
    if not report["warnings"] and nvml_state["available"]:
        lines.append("No warnings.")
    # Process names, notebook paths and GPU names come from others: nothing in them may act
    # on the reader's terminal (escape sequences) or reorder the line (bidi controls).
    return "\n".join(printable(line) for line in lines)
