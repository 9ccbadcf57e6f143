"""One snapshot of the GPUs and this server's kernels, refreshed off the event loop.

The server's event loop must never wait for NVML, ``/proc`` or a slow disk of beacons. Every
``refresh_s`` a tick on the loop reads what the server itself knows of its kernels and notebooks
(in memory), and hands it to a single worker thread that builds the status report: NVML,
attribution, beacons, warnings. The routes and the metrics read the last finished snapshot
only. A refresh still running when the next tick comes (NVML hung) is left alone, one at a
time; once it has run longer than ``deadline_s`` the snapshot says so (``server.problem``)
and how old it is, instead of anyone waiting for it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from jax_nbmem.agent.cgroups import container_text
from jax_nbmem.node.beacons import beacon_dirs, read_beacons
from jax_nbmem.node.servers import ServerKernel, SessionIndex, epoch_seconds, notebook_path
from jax_nbmem.server.kernel_state import with_states
from jax_nbmem.server.offers import shutdown_offers
from jax_nbmem.tenants.owners import unix_user_text
from jax_nbmem.tenants.status import collect

__all__ = ["ServerMonitor"]

log = logging.getLogger("jax_nbmem")


class ServerMonitor:
    """The snapshot behind the server extension's routes and metrics (see the module)."""

    def __init__(
        self,
        kernel_manager: Any,
        session_manager: Any,
        *,
        server_url: str = "",
        root_dir: str | None = None,
        share_dir: str | None = None,
        refresh_s: float = 2.0,
        deadline_s: float = 10.0,
        history_s: float = 600.0,
        report: Callable[..., Mapping[str, Any]] = collect,
        on_snapshot: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.kernel_manager = kernel_manager
        self.session_manager = session_manager
        self.server_url = server_url
        self.root_dir = root_dir
        self.share_dir = share_dir or None
        self.refresh_s = refresh_s
        self.deadline_s = deadline_s
        self._report = report
        self._on_snapshot = on_snapshot  # called on the worker thread after each snapshot
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="jax_nbmem-server")
        self._lock = threading.Lock()
        self._snapshot: dict[str, Any] | None = None
        self._tenants: list[Any] = []  # the snapshot's Tenant records, for a shutdown
        self._in_flight: Future | None = None
        self._in_flight_since: float | None = None
        self._history: dict[str, deque] = {}
        self._history_points = max(2, int(history_s / refresh_s))
        self._task: asyncio.Task | None = None
        self.refreshes = 0

    # ---- on the event loop -------------------------------------------------------------

    def start(self) -> None:
        """Start ticking on the running event loop (the server's)."""
        if self._task is None:
            self._task = asyncio.get_event_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop ticking; a refresh in flight finishes on its own, unwaited."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._executor.shutdown(wait=False)

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("jax_nbmem: a status refresh could not start", exc_info=True)
            await asyncio.sleep(self.refresh_s)

    async def tick(self) -> None:
        """Start a refresh unless one is running; returns at once (never waits for it)."""
        if self._in_flight is not None and not self._in_flight.done():
            return
        kernels = await self._server_kernels()
        self._in_flight_since = time.monotonic()
        self._in_flight = self._executor.submit(self._refresh, kernels)

    async def _server_kernels(self) -> list[dict[str, Any]]:
        """This server's kernels with their notebooks, from its own managers (in memory)."""
        sessions = await self.session_manager.list_sessions()
        notebooks = {}
        for session in sessions:
            kernel = session.get("kernel") or {}
            if kernel.get("id"):
                notebooks[kernel["id"]] = session.get("path")
        found = []
        for model in self.kernel_manager.list_kernels():
            kernel_id = model.get("id")
            found.append({
                "kernel_id": kernel_id,
                "name": model.get("name"),
                "path": notebooks.get(kernel_id),
                "execution_state": model.get("execution_state"),
                "last_activity": epoch_seconds(model.get("last_activity")),
                "connections": model.get("connections"),
                "pid": _kernel_pid(self.kernel_manager, kernel_id),
            })  # fmt: skip
        return found

    # ---- on the worker thread ----------------------------------------------------------

    def _refresh(self, kernels: list[dict[str, Any]]) -> None:
        began = time.monotonic()
        try:
            sessions = SessionIndex({k["kernel_id"]: self._session(k) for k in kernels})
            status = self._report(sessions=sessions, share_dir=self.share_dir)
            report = dict(status)
            kernels = _with_host_pids(kernels, status)
        except Exception as exc:  # said in the snapshot, never raised into the server
            log.warning("jax_nbmem: status refresh failed", exc_info=True)
            with self._lock:
                if self._snapshot is not None:
                    self._snapshot["server"]["problem"] = f"refresh failed: {exc}"
            return
        now = time.time()
        report["processes"] = [
            {
                **p,
                "container_shown": container_text(
                    p.get("container"), p.get("container_hostname_claimed")
                ),
                # In a container its container's user, never the host's name for its uid.
                "user_shown": unix_user_text(p.get("user"), p.get("user_source")),
            }
            for p in report.get("processes", [])
        ]  # the board's and the sidebar's words for it: one rule, the status line's
        joined = _join_kernels(kernels, report["processes"], now)
        report["kernels"] = with_states(joined, report, self._pending(joined))
        tenants = status.tenants() if hasattr(status, "tenants") else []
        own = {k["pid"]: k for k in joined if k.get("pid") is not None}
        offers = shutdown_offers(report, tenants, own)
        for process in report["processes"]:
            process["shutdown_offer"] = offers.get(process.get("pid"))
        report["server"] = {
            "url": self.server_url,
            "taken_at": now,
            "refresh_took_s": round(time.monotonic() - began, 3),
            "problem": None,
        }
        with self._lock:
            self._snapshot = report
            self._tenants = tenants
            keys = set()
            for gpu in report.get("gpus", []):
                key = gpu.get("uuid") or str(gpu.get("index"))
                keys.add(key)
                points = self._history.setdefault(key, deque(maxlen=self._history_points))
                points.append([round(now, 1), gpu.get("used_bytes"), gpu.get("total_bytes")])
            for key in set(self._history) - keys:
                del self._history[key]  # a GPU gone from the report leaves the history too
            self.refreshes += 1
        if self._on_snapshot is not None:
            try:
                self._on_snapshot(report)
            except Exception:
                log.warning("jax_nbmem: after a status refresh", exc_info=True)

    def _pending(self, kernels: list[dict[str, Any]]) -> dict[int, tuple]:
        """Mode, pool fraction and the pool's GPUs of our kernels whose JAX has not started.

        From their beacons; the GPUs are UUIDs, None where a beacon does not say them.
        """
        # Beacons are named by the PID here (in a container, not the host's PID shown).
        waiting = {
            k.get("pid_in_container") or k["pid"]: k["pid"]
            for k in kernels
            if k.get("pid") and not k.get("gpus")  # in a container: once the host PID is known
        }
        if not waiting:
            return {}
        try:
            beacons = read_beacons(beacon_dirs(self.share_dir), pids=list(waiting))
        except Exception:  # never raises, says its doc; a snapshot must not fail on it anyway
            log.debug("jax_nbmem: beacons of kernels not on a GPU", exc_info=True)
            return {}
        return {
            waiting[pid]: (b.mode_requested or "default", b.pool_fraction, b.pool_gpus)
            for pid, b in beacons.items()
            if b.mode_in_effect is None
        }

    def _session(self, kernel: Mapping[str, Any]) -> ServerKernel:
        path = kernel.get("path")
        return ServerKernel(
            kernel_id=kernel["kernel_id"],
            server_url=self.server_url,
            notebook=notebook_path(self.root_dir, path) if path else None,
            execution_state=kernel.get("execution_state"),
            last_activity=kernel.get("last_activity"),
            path=path,
            pid=kernel.get("pid"),
        )

    # ---- for the routes (any thread) ---------------------------------------------------

    def snapshot(self) -> dict[str, Any] | None:
        """The last snapshot, with its age and any problem of the refresh under way; or None."""
        with self._lock:
            if self._snapshot is None:
                return None
            snapshot = dict(self._snapshot)
            server = dict(snapshot["server"])
        server["age_s"] = round(max(0.0, time.time() - server["taken_at"]), 3)
        running = self._in_flight is not None and not self._in_flight.done()
        if running and self._in_flight_since is not None:
            late = time.monotonic() - self._in_flight_since
            if late > self.deadline_s:
                server["problem"] = (
                    f"the refresh under way has taken {late:.0f} s (NVML or a disk is slow); "
                    f"these figures are {server['age_s']:.0f} s old"
                )
        snapshot["server"] = server
        return snapshot

    def shutdown_target(self, pid: int) -> tuple[dict | None, str | None, list[Any]]:
        """For a shutdown of host PID *pid*: its offer, this server's kernel id, the tenants.

        From the last snapshot; the offer is None where no warning names *pid* now.
        """
        with self._lock:
            snapshot, tenants = self._snapshot or {}, list(self._tenants)
        process = next((p for p in snapshot.get("processes", []) if p.get("pid") == pid), None)
        offer = process.get("shutdown_offer") if process else None
        kernel = next((k for k in snapshot.get("kernels", []) if k.get("pid") == pid), None)
        return offer, kernel["kernel_id"] if kernel else None, tenants

    def history(self) -> dict[str, list]:
        """Each GPU's ``[time, used bytes, total bytes]`` over the last minutes, by UUID."""
        with self._lock:
            return {uuid: list(points) for uuid, points in self._history.items()}


def _kernel_pid(kernel_manager: Any, kernel_id: str | None) -> int | None:
    """The kernel's process ID where its provisioner says (local kernels); else None."""
    try:
        manager = kernel_manager.get_kernel(kernel_id)
        provisioner = getattr(manager, "provisioner", None)
        pid = getattr(provisioner, "pid", None)
        if pid is None:
            process = getattr(provisioner, "process", None)
            pid = getattr(process, "pid", None)
        return int(pid) if pid is not None else None
    except Exception:
        return None


def _with_host_pids(kernels: list[dict[str, Any]], status) -> list[dict[str, Any]]:
    """The kernels with their host PIDs, as every public PID is.

    In a container, ``pid`` is the host's (None while no node agent tells it) and
    ``pid_in_container`` the PID this server knows; on the host ``pid_in_container`` is None.
    """
    if status.get("pid_in_container") is None or not hasattr(status, "tenants"):
        return [{**k, "pid_in_container": None} for k in kernels]
    host = {t.pid_here: t.pid for t in status.tenants() if t.pid_here is not None}
    return [{**k, "pid": host.get(k.get("pid")), "pid_in_container": k.get("pid")} for k in kernels]


def _join_kernels(
    kernels: list[dict[str, Any]], processes: list[Mapping[str, Any]], now: float
) -> list[dict[str, Any]]:
    """This server's kernels, each with what the GPUs say of its process."""
    by_pid: dict[int, list[Mapping[str, Any]]] = {}
    for process in processes:
        by_pid.setdefault(process.get("pid"), []).append(process)
    joined = []
    for kernel in kernels:
        on_gpus = by_pid.get(kernel.get("pid"), [])
        known = [p.get("used_bytes") for p in on_gpus if p.get("used_bytes") is not None]
        last = kernel.get("last_activity")
        joined.append({
            "kernel_id": kernel["kernel_id"],
            "name": kernel.get("name"),
            "notebook": kernel.get("path"),
            "execution_state": kernel.get("execution_state"),
            "connections": kernel.get("connections"),
            "pid": kernel.get("pid"),
            "pid_in_container": kernel.get("pid_in_container"),
            "container": next((p["container"] for p in on_gpus if p.get("container")), None),
            "idle_s": None if last is None else round(max(0.0, now - last), 1),
            "gpus": sorted({p.get("gpu") for p in on_gpus}),
            "gpu_memory_bytes": sum(known) if known else (0 if not on_gpus else None),
            "mode": next((p.get("mode") for p in on_gpus if p.get("mode")), None),
            "preallocated": next(
                (p.get("preallocated") for p in on_gpus if p.get("preallocated") is not None),
                None,
            ),
        })  # fmt: skip
    return joined
