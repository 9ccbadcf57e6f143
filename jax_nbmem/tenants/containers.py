"""Attribution inside a container: NVML's host PIDs, named through the node agent or inferred.

A kernel in a PID namespace of its own (a container) sees NVML list *host* PIDs, which name
no process here, or the wrong one. So a host PID is never looked up here directly. With the
node agent's fresh resolution (:mod:`jax_nbmem.node.resolution`) each host PID is known:

- a process in this kernel's own namespace is inspected here under its PID here
  (``pid_in_container``), this kernel's own row included (matched on namespace, PID and
  start ticks);
- a process in another container is named from what the agent proved: its kernel's beacon
  (hub user, notebook, mode, idle time), its container; ``source: agent``.

Without it (no agent, or a stale or untrusted resolution) every row is ``unknown`` with a
``pid-namespace`` reason, and memory that is preallocation-sized counts as preallocated (a
warning, when too little is left for a default start). When exactly one live kernel in
another container says, in its beacon, that it preallocated on that GPU a pool that size, the
row is named after it with ``source: inferred`` and the reason why. An unproven beacon never
gives a PID: an in-container PID equal to some host PID is no match.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jax_nbmem.allocator.jaxlib import DEFAULT_FRACTION
from jax_nbmem.gpu import own_process
from jax_nbmem.node.beacons import Beacon
from jax_nbmem.node.identity import same_namespace, start_ticks
from jax_nbmem.node.neighbours import read_claims
from jax_nbmem.node.resolution import Resolution, ResolvedProcess
from jax_nbmem.tenants import attribution as _a
from jax_nbmem.tenants.verdicts import (
    PREALLOCATION_ABOVE_BYTES,
    SIZE_ONLY_DOWN_TO,
    ProcessInfo,
    matches_a_pool,
    verdict_from_beacon,
    verdict_from_outside,
)

__all__ = ["attribute_in_container", "from_container"]


def attribute_in_container(
    processes: Sequence,
    gpus: Sequence,
    *,
    identity: Mapping[str, Any],
    resolution: Resolution | None,
    claims: Iterable[Beacon],
    own: Beacon | None,
    environ: Mapping[str, str],
    sessions,
    local_beacons,
) -> list[_a.Tenant]:
    """Tenants for NVML's ``processes`` (host PIDs) seen from a container; never raises.

    ``local_beacons(pids)`` reads the beacons of PIDs in this namespace; ``own`` is this
    kernel's account of itself (its session); ``claims`` the live beacons of kernels in other
    namespaces (:func:`jax_nbmem.node.neighbours.read_claims`).
    """
    totals = {gpu.index: gpu.total_bytes for gpu in gpus}
    uuids = {gpu.index: gpu.uuid for gpu in gpus}
    fresh = resolution is not None and resolution.fresh
    mine = resolution.own_row(identity) if fresh else None
    local_pid = identity.get("pid_in_ns")
    key = _own_key(identity)
    if mine is not None:
        _last_own.clear()
        _last_own[key] = mine
    remembered = None if fresh else _last_own.get(key)
    proven = own_process.proven_pid()
    by_socket = proven is not None and mine is None
    by_socket = by_socket and (remembered is None or remembered.pid != proven)
    if by_socket:
        # Proven over the agent's socket, though no fresh resolution lists it (not yet, not
        # written, stale, or not trusted here): NVML's line under that PID is this kernel.
        # Still inferred, as a remembered row is: nothing acts on it until a resolution does.
        ns = identity.get("pid_ns")
        remembered = ResolvedProcess(
            proven, local_pid, tuple(ns) if ns else None, identity.get("start_ticks"), (), None,
            None,
        )  # fmt: skip
    # Host PID -> PID here, for the processes of this namespace the agent resolved.
    here: dict[int, int] = {}
    for process in processes:
        entry = resolution.get(process.pid) if fresh else None
        if entry is not None and _in_namespace(entry, identity):
            here[process.pid] = entry.pid_in_container
    try:
        beacons = local_beacons([pid for pid in here.values() if pid != local_pid])
    except Exception:
        beacons = {}
    if own is not None:
        beacons[local_pid] = own
    tenants: list[_a.Tenant] = []
    for process in processes:
        total, uuid = totals.get(process.gpu), uuids.get(process.gpu)
        entry = resolution.get(process.pid) if fresh else None
        if entry is None and remembered is not None and process.pid == remembered.pid:
            fields = _local(
                process, remembered, remembered, local_pid, beacons, environ, sessions, total,
                uuid,
            )  # fmt: skip
            fields.update(source="inferred", reason=_PROVEN if by_socket else _REMEMBERED)
        elif entry is None:
            fields = _unresolved(process.pid, resolution)
        elif process.pid in here:
            fields = _local(
                process, entry, mine, local_pid, beacons, environ, sessions, total, uuid
            )
        else:
            fields = _neighbour(process, entry, total, uuid)
        tenants.append(_a.Tenant(gpu=process.gpu, used_bytes=process.used_bytes, **fields))
    if not fresh:
        try:  # the other live kernels of this very container, by their beacons here
            ours = [b for b in local_beacons(None).values() if b.pid != local_pid]
        except Exception:
            ours = []
        tenants = _infer(tenants, list(claims), own, ours, totals, uuids)
    return tenants


# This kernel's own entry as the node agent last proved it, by its identity (namespace, PID
# there, start ticks). A live process keeps its host PID, so once the agent stops, NVML's
# line under that PID is still this kernel's: its row stays its own, marked inferred.
_last_own: dict[str, ResolvedProcess] = {}
_REMEMBERED = (
    "inferred, not proven now (the node agent's resolution is not fresh): this kernel's host "
    "PID as the agent last proved it, which no other process can have while it runs"
)
_PROVEN = (
    "inferred, not proven by a fresh resolution: this kernel's host PID as the node agent "
    "answered it over its socket, which no other process can have while it runs"
)
_OWN_SIZE = (
    f"{_a.INFERRED_WITHOUT_AGENT}: the only process on this GPU whose memory is this "
    "kernel's own pool (what its allocator holds there, in any mode), and no other kernel's "
    "beacon claims that size"
)


def _own_key(identity: Mapping[str, Any]) -> str:
    return repr((identity.get("pid_ns"), identity.get("pid_in_ns"), identity.get("start_ticks")))


def from_container(processes, gpus, identity, resolution, dirs, beacons, own_pid, environ,
                   sessions) -> list[_a.Tenant]:  # fmt: skip
    """What :func:`~.attribution.attribute` is on the host, for a process in a container.

    Reads the claims of kernels in other namespaces when the resolution is not fresh;
    ``sessions`` as ``attribute`` takes them (None: the running Jupyter servers, on demand).
    """
    sessions = _a.SessionsOnDemand() if sessions is None else sessions
    fresh = resolution is not None and resolution.fresh
    try:
        claims = [] if fresh else read_claims(dirs, identity)
    except Exception:  # never fatal: nothing is then inferred
        claims = []
    return attribute_in_container(
        processes, gpus, identity=identity, resolution=resolution, claims=claims,
        own=(beacons or {}).get(own_pid), environ=environ, sessions=sessions,
        local_beacons=lambda pids: _a.read_beacons(dirs, pids=pids),
    )  # fmt: skip


def _in_namespace(entry: ResolvedProcess, identity: Mapping[str, Any]) -> bool:
    return entry.pid_in_container is not None and same_namespace(
        entry.pid_ns, identity.get("pid_ns")
    )


def _unresolved(pid: int, resolution: Resolution | None) -> dict:
    if resolution is not None and resolution.fresh:
        why = "the node agent's resolution does not list it (yet)"
    else:
        detail = resolution.reason if resolution is not None else "no share directory is set"
        why = f"no node agent resolves host PIDs here: {detail}"
    reason = (
        f"{_a.PID_NAMESPACE_REASON}: host PID {pid}; this kernel runs in a container (a PID "
        f"namespace of its own) and {why}"
    )
    return {"pid": pid, "kind": "unknown", "notebook": None, "preallocated": None,
            "reason": reason, "elsewhere": True}  # fmt: skip


def _local(process, entry, mine, local_pid, beacons, environ, sessions, total, uuid) -> dict:
    """A process of this very namespace: inspected here under its PID here."""
    pid_here = entry.pid_in_container
    own = mine is not None and entry is mine
    if own:
        pid_here = local_pid
    info = None
    if not own and entry.start_ticks is not None:
        now_ticks = start_ticks(f"/proc/{pid_here}/stat")
        if now_ticks != entry.start_ticks:  # exited, and its PID taken by another since
            info = ProcessInfo(pid_here, "unknown", reason="exited since the agent looked")
    if info is None:
        try:
            info = _a.inspect_process(
                pid_here, own_pid=local_pid if own else -1, server_sessions=sessions,
                own_environ=environ,
            )  # fmt: skip
        except Exception as exc:
            info = ProcessInfo(pid_here, "unknown", reason=f"inspection failed: {exc!r}")
    fields = {k: v for k, v in vars(info).items() if k != "gpu_device_open"}
    beacon = beacons.get(pid_here) or entry.kernel
    if beacon is not None and info.kind != "unknown":
        verdict = verdict_from_beacon(beacon, process.used_bytes, total, uuid)
        if beacon is entry.kernel and beacon is not beacons.get(pid_here):
            verdict["source"] = "agent"
        if verdict["idle_s"] is None and info.idle_s is not None:
            verdict.update(idle_s=info.idle_s, idle_source="server")
    else:
        verdict = verdict_from_outside(info, process.used_bytes, total)
    fields.update(verdict)
    if "notebook" in verdict:
        fields["notebook_shown"] = _a.shown_notebook(verdict["notebook"], fields.get("user"))
    fields.update(
        pid=process.pid, pid_here=pid_here, pid_in_container=pid_here,
        container=entry.shown_container,
    )  # fmt: skip
    return fields


def _neighbour(process, entry: ResolvedProcess, total, uuid) -> dict:
    """A process in another container (or on the host): what the node agent proved of it."""
    kernel = entry.kernel
    where = _where(entry)
    base = {
        "pid": process.pid,
        "pid_in_container": entry.pid_in_container,
        "container": entry.shown_container,
        "elsewhere": True,
        "notebook": None,
        # Its container's user as the agent read it (None from an agent that does not say).
        "user": entry.user,
        "user_source": entry.user_source,
    }
    if kernel is None:
        size_only = matches_a_pool(
            process.used_bytes, total, DEFAULT_FRACTION, down_to=SIZE_ONLY_DOWN_TO
        )
        reason = f"runs {where}; not a kernel registered with the node agent"
        return {**base, "kind": "process", "reason": reason,
                "source": "memory size" if size_only else "unknown",
                "preallocated": True if size_only else None}  # fmt: skip
    verdict = verdict_from_beacon(kernel, process.used_bytes, total, uuid)
    verdict["source"] = "agent"
    fields = {
        **base,
        "kind": "kernel",
        "user": entry.user or kernel.user,  # the agent's reading, else the kernel's own word
        "user_source": entry.user_source if entry.user else None,
        "kernel_id": kernel.kernel_id,
        "started_at": kernel.started_at,
        "hub_user": kernel.hub_user,
        "runs_jax": kernel.mode_in_effect is not None or None,
        "reason": f"runs {where}" + (f"; {entry.names_reason}" if entry.names_reason else ""),
        **verdict,
    }
    if kernel.notebook:
        fields["notebook_shown"] = _a.shown_notebook(kernel.notebook, kernel.user)
    return fields


def _where(entry: ResolvedProcess) -> str:
    container = entry.container
    if not container:
        return "on the host" if entry.pid_in_container is None else "in another PID namespace"
    name = container.get("name") or (container.get("id") or "")[:12]
    pod = f" of pod {container['namespace']}/{container['pod']}" if container.get("pod") else ""
    return f"in container {name}{pod}"


def _could_hold(claim: Beacon, used: int | None, total: int | None, uuid: str | None) -> bool:
    """Whether a kernel's claim can account for ``used`` bytes on GPU ``uuid``."""
    if used is None or uuid is None or claim.mode_in_effect is None:
        return False  # its JAX has not started: it holds no pool
    counters = claim.gpus.get(uuid)
    if counters is None or not claim.pool_fraction:
        return False  # not on this GPU, or a mode without a pool
    pool = counters.get("pool_bytes")
    if pool:
        return pool <= used <= pool + PREALLOCATION_ABOVE_BYTES
    return bool(matches_a_pool(used, total, claim.pool_fraction))


def _size_fits(beacon: Beacon, used: int | None, total: int | None, uuid: str | None) -> bool:
    """Whether a kernel's bytes on GPU ``uuid`` can be ``used``, whatever its mode.

    What its allocator holds there as it counts it (``pool_bytes``: JAX's, or the simulated
    GPU's mirror's), plus at most a CUDA context's worth; else as :func:`_could_hold`. A mode
    without a preallocated pool (``off``) fits too: the size of what it holds tells.
    """
    counters = beacon.gpus.get(uuid) if uuid is not None else None
    held = counters.get("pool_bytes") if isinstance(counters, dict) else None
    if used is not None and isinstance(held, int) and held > 0:
        return held <= used <= held + PREALLOCATION_ABOVE_BYTES
    return _could_hold(beacon, used, total, uuid)


def _infer(tenants, claims, own, ours, totals, uuids) -> list[_a.Tenant]:
    """Without the agent: preallocation-sized memory, named where exactly one claim fits.

    ``ours``: the beacons of the other kernels in this container. A row that this kernel or
    one of them could hold is not said to be outside; nothing is named by its size alone.
    """
    from dataclasses import replace

    candidates: dict[int, list[Beacon]] = {}
    for i, tenant in enumerate(tenants):
        if tenant.kind != "unknown" or not tenant.used_bytes:
            continue
        total, uuid = totals.get(tenant.gpu), uuids.get(tenant.gpu)
        candidates[i] = [c for c in claims if _could_hold(c, tenant.used_bytes, total, uuid)]
    # A claim accounts for one row at most: one that fits two rows names neither.
    fits = {}
    for matches in candidates.values():
        for claim in matches:
            fits[id(claim)] = fits.get(id(claim), 0) + 1
    result = list(tenants)
    mine = [
        i
        for i in candidates
        if own is not None
        and _size_fits(
            own, tenants[i].used_bytes, totals.get(tenants[i].gpu), uuids.get(tenants[i].gpu)
        )
    ]
    knows_itself = any(t.kind == "self" for t in tenants)
    for i, matches in candidates.items():
        tenant = tenants[i]
        total, uuid = totals.get(tenant.gpu), uuids.get(tenant.gpu)
        if (
            i in mine
            and len(mine) == 1
            and not matches
            and not knows_itself
            and not any(_size_fits(b, tenant.used_bytes, total, uuid) for b in [*claims, *ours])
        ):  # its own pool's size, and nobody else's: this kernel's row, said as inferred
            result[i] = _inferred_self(tenant, own, total, uuid)
            continue
        if i in mine:
            reason = f"{tenant.reason}; its size is this kernel's own pool's: it may be this kernel"
            result[i] = replace(tenant, reason=reason, elsewhere=False)
            continue
        inside = [b for b in ours if _could_hold(b, tenant.used_bytes, total, uuid)]
        if inside:
            pids = ", ".join(str(b.pid) for b in inside)
            reason = (
                f"{tenant.reason}; its size fits the pool of kernel PID {pids} in this "
                "container (not proven: it may be another process of the same size)"
            )
            result[i] = replace(
                tenant, reason=reason, preallocated=True, source="memory size", elsewhere=False
            )
            continue
        if len(matches) == 1 and fits[id(matches[0])] == 1:
            result[i] = _inferred(tenant, matches[0], total, uuid)
            continue
        sized = matches_a_pool(
            tenant.used_bytes, total, DEFAULT_FRACTION, down_to=SIZE_ONLY_DOWN_TO
        )
        reason = tenant.reason
        if len(matches) > 1:
            reason += (
                f"; {len(matches)} live kernels in other containers say they preallocated "
                "a pool that size on this GPU, so it cannot be told which"
            )
        result[i] = replace(
            tenant, reason=reason, preallocated=bool(sized or matches) or None,
            source="memory size" if sized or matches else "unknown",
        )  # fmt: skip
    return result


def _inferred_self(tenant: _a.Tenant, own: Beacon, total, uuid) -> _a.Tenant:
    from dataclasses import replace

    verdict = verdict_from_beacon(own, tenant.used_bytes, total, uuid)
    # Preallocated only in a mode that preallocates: an `off` kernel's pool grew with its arrays.
    verdict.update(source="inferred", preallocated=bool(own.pool_fraction))
    return replace(
        tenant, kind="self", user=own.user, hub_user=own.hub_user, kernel_id=own.kernel_id,
        started_at=own.started_at, runs_jax=True, reason=_OWN_SIZE, elsewhere=False,
        pid_here=own.pid, pid_in_container=own.pid,
        **{k: v for k, v in verdict.items() if k not in ("notebook", "hub_user")},
    )  # fmt: skip


def _inferred(tenant: _a.Tenant, claim: Beacon, total, uuid) -> _a.Tenant:
    from dataclasses import replace

    verdict = verdict_from_beacon(claim, tenant.used_bytes, total, uuid)
    identity = claim.identity or {}
    ns = identity.get("pid_ns")
    said = f"PID {claim.pid}" + (f" in PID namespace {ns[1]}" if ns else "")
    if identity.get("hostname"):
        said += f" on host {identity['hostname']}"
    reason = (
        f"{_a.INFERRED_WITHOUT_AGENT}: the only live kernel in another container "
        f"whose beacon says it preallocated a pool this size on this GPU ({said})"
    )
    verdict.update(source="inferred", preallocated=True)
    return replace(
        tenant,
        kind="kernel",
        user=claim.user,
        hub_user=claim.hub_user,
        kernel_id=claim.kernel_id,
        notebook=claim.notebook,
        notebook_shown=_a.shown_notebook(claim.notebook, claim.user),
        started_at=claim.started_at,
        runs_jax=True,
        reason=reason,
        **{k: v for k, v in verdict.items() if k != "notebook" and k != "hub_user"},
    )
