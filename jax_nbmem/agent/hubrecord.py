"""Whose a host process is, from the hub's record of a user's server matched to host facts.

JupyterHub keeps, for each server it started, what its spawner needs to find that server
again after a restart (the spawner's *state*), and shows it in the server's model to a token
with the scope ``admin:server_state``, beside ``started`` (when the hub began that start):

- LocalProcessSpawner (and SudoSpawner, built on it): ``{"pid": …}``, the server's host PID;
- SystemdSpawner (and TLJH's spawner, built on it): ``{"unit_name": …}``, the transient
  systemd service the server runs as (``jupyter-{USERNAME}-singleuser``; TLJH's
  ``jupyter-{USERNAME}``).

Neither names the server's Unix user, which is why this serves hubs whose Unix users are not
named like their hub users (TLJH runs hub user ``alice`` as ``jupyter-alice``). A process is
that hub user's when the host proves what the record names (:func:`prove_record`):

- a PID: one of the process's real ancestors (``/proc``'s parent links) has it, of the same
  UID, started no later than the process (so it is the ancestor read, not a PID reused since)
  and no earlier than the hub's ``started`` nor more than :data:`SPAWN_WINDOW_S` after it. A
  PID is freed only once its server ended; a process that got it afterwards started after
  that, which the window bounds (JupyterHub gives up on a start after
  ``Spawner.start_timeout``, 60 s by default);
- a unit: the process's cgroup, in systemd's own hierarchy (cgroup v2's line of
  ``/proc/PID/cgroup``, else v1's ``name=systemd``), is ``<unit>.service`` under slices only
  (``/system.slice/<unit>.service``, or in the slice SystemdSpawner was given), or below it.
  Only root (systemd) makes cgroups there: what systemd delegates to a user lies under a unit
  of its own (``user@UID.service``), which a path of slices only never passes.

Nothing else of a server's model is believed, and nothing of it is a user's word: the hub
wrote it. Nothing here asks the hub (:mod:`jax_nbmem.cli.hubowner` does); nothing raises but
:class:`~.facts.FactError`, whose message says which fact is missing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone

import psutil

from jax_nbmem.agent.facts import FactError, ProvenProcess, prove_process
from jax_nbmem.agent.hostview import HostViewer, read_proc
from jax_nbmem.text import printable

__all__ = [
    "SPAWN_WINDOW_S",
    "ServerRecord",
    "prove_record",
    "server_records",
    "systemd_cgroup",
    "unit_holds",
]

SPAWN_WINDOW_S = 300.0
_CLOCK_SLACK_S = 2.0  # /proc/stat's boot time is whole seconds
# A systemd unit name, as systemd-run accepts one (no "/", which would climb the tree).
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]{1,255}")


@dataclass(frozen=True)
class ServerRecord:
    """One running server of a hub user, as the hub's model of it says (see the module).

    ``has_state``: whether the model carried the spawner's state at all (a token without
    ``admin:server_state`` gets none); ``pid``/``unit``: what of it the host can check (None:
    the spawner recorded neither); ``started``: the hub's record of the start (epoch seconds).
    """

    hub_user: str
    server: str  # "" for the default server
    url: str | None
    started: float | None
    has_state: bool
    pid: int | None
    unit: str | None


def server_records(model: object, hub_user: str) -> list[ServerRecord]:
    """The running servers in the hub's model of ``hub_user`` (``GET hub/api/users/NAME``).

    A server the hub says is stopped is left out; FactError when the answer is not a model of
    that user.
    """
    if not isinstance(model, dict) or model.get("name") != hub_user:
        raise FactError(f"the hub's answer for hub user {printable(hub_user)} is not its model")
    servers = model.get("servers")
    if not isinstance(servers, dict):
        return []
    records = []
    for name, server in servers.items():
        if not isinstance(server, dict) or server.get("stopped") is True:
            continue
        state = server.get("state")
        pid = state.get("pid") if isinstance(state, dict) else None
        unit = state.get("unit_name") if isinstance(state, dict) else None
        records.append(ServerRecord(
            hub_user=hub_user, server=str(name),
            url=server.get("url") if isinstance(server.get("url"), str) else None,
            started=_epoch(server.get("started")), has_state=isinstance(state, dict),
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 else None,
            unit=unit if isinstance(unit, str) and unit else None,
        ))  # fmt: skip
    return records


def _epoch(stamp: object) -> float | None:
    """JupyterHub's ISO 8601 UTC time (``2026-12-05T20:06:50.123456Z``) in epoch seconds."""
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def prove_record(
    process: ProvenProcess,
    ancestors: tuple[int, ...],
    record: ServerRecord,
    viewer: HostViewer | None = None,
) -> str:
    """How the host proves ``process`` runs under ``record``'s server, in words; FactError.

    ``ancestors``: its real ancestors' host PIDs (:func:`~.authority.ancestors`). The unit is
    checked where the record names one, else the PID.
    """
    viewer = viewer or HostViewer()
    if process.namespaced:
        raise FactError(f"PID {process.pid} runs in a PID namespace of its own")
    where = f"hub user {printable(record.hub_user)}'s server" + (
        f" {printable(record.server)!r}" if record.server else ""
    )
    if record.unit:
        said = _in_unit(process, record.unit, viewer)
    elif record.pid:
        said = _under_pid(process, ancestors, record, viewer)
    else:
        raise FactError(
            f"the hub's record of {where} names neither a PID nor a systemd unit (its "
            "spawner keeps neither), so nothing on this host can be matched to it"
        )
    if not process.still_running(viewer):
        raise FactError(f"PID {process.pid} ended while it was checked")
    return f"the hub's record of {where}: {said}"


def _under_pid(
    process: ProvenProcess, ancestors: tuple[int, ...], record: ServerRecord, viewer: HostViewer
) -> str:
    pid = record.pid
    if pid not in ancestors:
        shown = ", ".join(map(str, ancestors)) or "none"
        raise FactError(
            f"the hub records its server as PID {pid}, which is not one of PID "
            f"{process.pid}'s real ancestors ({shown})"
        )
    server = prove_process(pid, viewer)
    if server.start_ticks > process.start_ticks:
        raise FactError(f"PID {pid} started after PID {process.pid}: it is no ancestor now")
    if server.uid != process.uid or server.pid_ns != process.pid_ns:
        raise FactError(f"PID {pid} (the hub's record of its server) is of another user or "
                        f"PID namespace than PID {process.pid}")  # fmt: skip
    if record.started is None:
        raise FactError("the hub's record of the server has no start time to check its PID by")
    began = psutil.boot_time() + server.start_ticks / os.sysconf("SC_CLK_TCK")
    after = began - record.started
    if after < -_CLOCK_SLACK_S or after > SPAWN_WINDOW_S:
        raise FactError(
            f"PID {pid} started {_when(after)} the hub recorded the start of that server: "
            f"it is another process that was given the same PID (a server's process starts "
            f"within {SPAWN_WINDOW_S:g} s after)"
        )
    return (f"its spawner's PID {pid}, a real ancestor of the same user, started "
            f"{after:.1f} s after the hub began that start")  # fmt: skip


def _when(after: float) -> str:
    return f"{-after:.0f} s before" if after < 0 else f"{after:.0f} s after"


def _in_unit(process: ProvenProcess, unit: str, viewer: HostViewer) -> str:
    if not _UNIT.fullmatch(unit) or unit in (".", ".."):
        raise FactError(f"the hub's record names the systemd unit {printable(unit)!r}, which "
                        "is no unit name")  # fmt: skip
    service = unit if unit.endswith(".service") else unit + ".service"
    path = systemd_cgroup(process.pid, viewer.proc)
    if path is None:
        raise FactError(f"PID {process.pid}'s cgroup (/proc/{process.pid}/cgroup) is unreadable")
    if not unit_holds(path, service):
        raise FactError(
            f"the hub records its server as the systemd unit {service}, but PID {process.pid} "
            f"runs in the cgroup {printable(path)}, which is not that unit's (systemd's own: "
            f"/system.slice/{service}, or in another slice)"
        )
    return f"its systemd unit {service}, whose cgroup {printable(path)} it runs in"


def systemd_cgroup(pid: int, proc: str = "/proc") -> str | None:
    """``pid``'s cgroup in systemd's hierarchy: cgroup v2's, else v1's ``name=systemd``.

    None when unreadable or neither line is there.
    """
    try:
        text = read_proc(f"{proc}/{pid}/cgroup")
    except OSError:
        return None
    lines = [line.split(":", 2) for line in text.splitlines()]
    paths = {parts[1]: parts[2] for parts in lines if len(parts) == 3 and parts[0]}
    unified = [parts[2] for parts in lines if len(parts) == 3 and parts[:2] == ["0", ""]]
    if unified and unified[0] != "/":
        return unified[0]
    return paths.get("name=systemd") or (unified[0] if unified else None)


def unit_holds(path: str, service: str) -> bool:
    """Whether the cgroup ``path`` is systemd's ``service`` (under slices only) or below it.

    A path relative to the reader's cgroup namespace (``/../…``) is not believed: it may start
    anywhere in the hierarchy.
    """
    parts = path.split("/")
    if not path.startswith("/") or ".." in parts or service not in parts:
        return False
    above = parts[1 : parts.index(service)]
    return all(part.endswith(".slice") and len(part) > len(".slice") for part in above)
