"""``jax-nbmem cull``: the GPU-aware idle culler, a JupyterHub service (see tenants/culling.py).

Each round (every ``--every`` seconds, or once with ``--once``) it reads the node's status as
``jax-nbmem status`` does (NVML, every user's beacons in the shared directory), picks the
kernels the policy would stop, warns each one first (a notice its own panel and status show),
and after ``--warn`` seconds, if it still qualifies and ran no cell since, shuts it down
through its user's server: the hub token JupyterHub gives its services
(``$JUPYTERHUB_API_TOKEN``) goes to the hub only, which issues a token for that one server
(:mod:`jax_nbmem.cli.hubapi`). The stops of one round run at once, each bounded by its
deadlines, so a slow or hostile server delays no other user's. ``--dry-run`` only says
what it would do (its checks of the hub: :mod:`jax_nbmem.cli.cullcommand`); each round ends
with a line of what it saw and did, a warning taken back says why (:mod:`~jax_nbmem.cli.
cullround`). Every warning, stop and change of mind is a JSON line in the log and a line
on stdout (users' words in it neutralised; a hub user the host did not prove marked
"(claimed)"); stops are counted in ``jax_nbmem_culled_kernels_total{reason}``: kept in
the shared directory, from which the node exporter serves it (counting on from there after
a restart), and served at the culler's own ``/metrics`` with ``--listen``.

Whose a kernel is, for its exemption (``--exempt USER``) and for the server asked, is what the
host proves (:mod:`jax_nbmem.agent.facts`), never what the kernel, its beacon or the status
report's ``hub_user`` claims: a kernel whose owner cannot be proven, or whose claims contradict
the facts, is never warned nor stopped (said once, with the reason). Its idleness and its
pool are its own word: they can only make the culler act on that very kernel.

Outside the host's PID namespace (a container without ``hostPID``) the culler proves nothing:
NVML's PIDs are not its own there (:func:`~jax_nbmem.agent.hostproof.host_proof` gives None),
so it acts on nothing and says so each round; it must run in the host's PID namespace (on
Kubernetes: in the node agent's pod, which has ``hostPID``). Asking the node agent for its
proofs over the agent's connection instead is not built.

Kernels in containers: on the host, the culler acts only on what the node agent proved
(:mod:`jax_nbmem.agent.hostproof`): a kernel in a PID namespace of its own that the agent
has not proven is never warned nor stopped (said once), whatever its beacon file claims. Its
notice is keyed as its beacon (``jax_nbmem-cull-<ns_ino>-<pid_in_ns>.json``) so that the
kernel finds it from inside its container; a kernel in a pod, which has no share directory,
gets it from the node agent over its connection (:mod:`jax_nbmem.agent.tcp`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from jax_nbmem.agent.facts import disagreements
from jax_nbmem.agent.hostproof import HostProof, host_proof
from jax_nbmem.cli.cullround import RoundTally, why_no_longer
from jax_nbmem.cli.hubapi import Hub
from jax_nbmem.cli.hubowner import prove_hub_user
from jax_nbmem.cli.stop import Kernel, StopError, find, stop
from jax_nbmem.metrics.culled import CULLED_HELP
from jax_nbmem.node.beacons import read_beacons
from jax_nbmem.node.notices import (
    CULL_REASONS,
    CullCounts,
    Notice,
    read_counts,
    read_notice,
    remove_notice,
    write_counts,
    write_notice,
)
from jax_nbmem.rootfiles import append_line
from jax_nbmem.tenants.culling import Candidate, CullPolicy, assess
from jax_nbmem.text import printable_lines

__all__ = ["Culler"]

_NOTICE = re.compile(r"jax_nbmem-cull-([1-9][0-9]*(?:-[1-9][0-9]*)?)\.json")


class Culler:
    """One culler: its policy, where notices go, its hub; :meth:`round` does one look."""

    def __init__(
        self,
        policy: CullPolicy,
        share_dir: str,
        hub: Hub | None,
        *,
        dry_run: bool = False,
        log_path: Path | None = None,
        out=None,
        registry=None,
    ) -> None:
        self.policy = policy
        self.share_dir = share_dir
        self.hub = hub
        self.dry_run = dry_run
        self.log_path = log_path
        self.out = out or sys.stdout
        self.culled: dict[str, int] = {}
        self._unproven_said: set[int] = set()
        self._declined: dict[int, tuple[str, str]] = {}  # PID -> (short, why) this round
        self._warned_owner: dict[int, str] = {}  # PID -> its proven owner when warned
        self._proven_hub_users: dict[int, str] = {}  # PID -> its hub user, where proven
        self._outside_said = False
        self._host: HostProof | None = None
        self._counts: CullCounts | None = None  # as kept in the shared directory
        self._counter = None
        if registry is not None:
            from prometheus_client import Counter

            self._counter = Counter(
                "jax_nbmem_culled_kernels", CULLED_HELP, ["reason"], registry=registry
            )
            for reason in CULL_REASONS:
                self._counter.labels(reason=reason)  # 0 until the first, not absent

    def round(
        self, report=None, now: float | None = None, host: HostProof | None = None
    ) -> list[dict]:
        """One look at the node; returns what it did (also printed and logged).

        ``host`` (default: :func:`host_proof` of the share directory; None off the host)
        says which kernels in containers the node agent proved, and their notices' keys.
        """
        from jax_nbmem.tenants.status import collect

        now = time.time() if now is None else now
        if self._counts is None and not self.dry_run:
            # Counting goes on from the last culler's count; its zeros are served from the start.
            kept = read_counts([self.share_dir])
            self._counts = kept or CullCounts({r: 0 for r in CULL_REASONS}, since=now)
            self._keep_counts()
        host = host_proof(self.share_dir) if host is None else host
        self._host = host
        report = collect(share_dir=self.share_dir, host=host or False) if report is None else report
        events = []
        verdicts = assess(report, self.policy)
        found = [v for v in verdicts.values() if isinstance(v, Candidate)]
        self._declined = {}
        if host is None and found and not self._outside_said:
            self._outside_said = True
            events.append({"action": "skip", "pid": None, "dry_run": self.dry_run, "message": (
                "not culling: this culler runs outside the host's PID namespace, where it "
                "cannot prove whose a kernel is; run it in the host's PID namespace"
            )})  # fmt: skip
        if host is None:
            self._declined = {c.pid: ("outside the host's PID namespace", "") for c in found}
        chosen = self._choose(found, host, events) if host is not None else {}
        keys = {pid: host.key(pid) if host is not None else str(pid) for pid in chosen}
        beacons = read_beacons([self.share_dir])
        if host is not None:
            beacons = host.beacons(beacons, chosen)
        due, tally = [], RoundTally.of(verdicts, {p: d[0] for p, d in self._declined.items()})
        for pid, candidate in chosen.items():
            key = keys[pid]
            notice = read_notice([self.share_dir], pid, candidate.started_at,
                                 key=None if key == str(pid) else key)  # fmt: skip
            if notice is None:
                events.append(self._warn(candidate, now, key))
            elif now < notice.deadline:
                tally.waiting += 1  # warned; its time has not come
            elif self._ran_a_cell_since(pid, notice, beacons):
                events.append(self._forget(key, self._label(candidate),
                                           "it ran a cell after the warning", pid))  # fmt: skip
            else:
                due.append((candidate, key))
        events.extend(self._cull_all(due))
        if not self.dry_run:
            for key in self._noticed() - set(keys.values()):
                events.append(self._take_back(key, verdicts, report, host))
        for event in events:
            self._say(event)
            tally.done[event["action"]] += 1
        self._say({"action": "round", "message": tally.line(self.policy.idle_s, self.dry_run)},
                  log=False)  # fmt: skip
        return events

    def announce(self, message: str) -> None:
        """Say the start line (stdout and the administrators' log)."""
        self._say({"action": "start", "pid": None, "dry_run": self.dry_run, "message": message})

    def _take_back(self, key: str, verdicts: dict, report, host: HostProof | None) -> dict:
        """Take back the notice of ``key``, which no longer qualifies, saying why."""
        pid = int(key) if key.isdigit() else None
        if pid is None and host is not None:
            pid = next((p for p in verdicts if host.key(p) == key), None)
        verdict = verdicts.get(pid) if pid is not None else None
        started = {p.get("pid"): p.get("started_at") for p in report.get("processes", [])}
        notice = None
        if pid is not None:
            notice = read_notice([self.share_dir], pid, key=None if key == str(pid) else key)
        declined = self._declined.get(pid, ("", ""))[1] if pid is not None else None
        why = why_no_longer(pid, verdict, declined, notice, started.get(pid))
        label = self._label(verdict) if isinstance(verdict, Candidate) else (
            f"kernel PID {pid}" if pid is not None else f"kernel {key}")  # fmt: skip
        return self._forget(key, label, why, pid)

    def _choose(self, found: list[Candidate], host: HostProof, events: list) -> dict:
        """The candidates whose facts allow acting, not exempt; why not is added to ``events``."""
        chosen = {}
        for candidate in found:
            if host.namespaced(candidate.pid) and not host.is_proven(candidate.pid):
                self._declined[candidate.pid] = ("unproven in its container", (
                    "it runs in a container the node agent has not proven"))  # fmt: skip
                events.extend(self._unproven(candidate))
                continue
            kernel, why = self._facts(candidate, host)
            if kernel is None:
                self._declined[candidate.pid] = ("owner unproven", f"no longer: {why}")
                events.extend(self._unproven(candidate, why))
                continue
            owner = kernel.proven_owner.name
            if kernel.proven_owner.is_hub_user:
                self._proven_hub_users[candidate.pid] = owner
            if self.policy.exempts(kernel.proven_owner, kernel.process.user):
                was = self._warned_owner.get(candidate.pid)
                self._declined[candidate.pid] = ("exempt", (
                    f"its owner changed from {was} to {owner}, whom --exempt spares"
                    if was and was != owner else f"its owner {owner} is exempt (--exempt)"
                ))  # fmt: skip
                continue
            self._warned_owner.setdefault(candidate.pid, owner)
            chosen[candidate.pid] = candidate
        return chosen

    def _facts(self, candidate: Candidate, host: HostProof) -> tuple[Kernel | None, str]:
        """The candidate's kernel with a proven owner and no contradicting claim, or why not."""
        try:
            kernel = find(candidate.pid, self.share_dir, host)
            if self.hub is not None:
                prove_hub_user(kernel, self.hub)  # its hub user from the hub's records
        except StopError as error:
            return None, str(error).removesuffix("; nothing done.")
        if kernel.process is None or kernel.proven_owner is None:
            return None, f"whose it is cannot be proven ({kernel.owner_reason})"
        found = disagreements(kernel.process, kernel.proven_owner, kernel.claimed,
                              kernel.ancestors, through_hub=self.hub is not None)  # fmt: skip
        if found:
            return None, "its claims contradict what the host proves: " + "; ".join(found)
        return kernel, ""

    def _unproven(self, candidate: Candidate, why: str | None = None) -> list[dict]:
        """A kernel whose facts do not allow acting: said once, never acted on."""
        if candidate.pid in self._unproven_said:
            return []
        self._unproven_said.add(candidate.pid)
        event = self._event("skip", candidate)
        event["message"] = f"not culling {self._label(candidate)}: " + (why or (
            "it runs in a container and the node agent has not proven who it is (is "
            "`jax-nbmem exporter --share-dir` running on this node?)"
        ))  # fmt: skip
        return [event]

    def _warn(self, candidate: Candidate, now: float, key: str | None = None) -> dict:
        deadline = now + self.policy.warn_s
        at = time.strftime("%H:%M", time.localtime(deadline))
        event = self._event("warn", candidate)
        if self.dry_run:
            wait = "at once" if self.policy.warn_s <= 0 else f"at {at}"
            event["message"] = (
                f"would warn {self._label(candidate)} and shut it down {wait} unless it runs a "
                f"cell: {candidate.why} (--dry-run: nothing done)"
            )
            return event
        notice = Notice(pid=candidate.pid, started_at=candidate.started_at, warned_at=now,
                        deadline=deadline, reason=candidate.reason, why=candidate.why,
                        key=None if key in (None, str(candidate.pid)) else key)  # fmt: skip
        try:
            write_notice(self.share_dir, notice)
        except OSError as error:
            event.update(action="error", message=f"cannot warn {self._label(candidate)}: {error}")
            return event
        event["deadline"] = deadline
        event["message"] = (
            f"warned {self._label(candidate)}: it will be shut down at {at} unless it runs a cell; "
            f"{candidate.why}"
        )
        return event

    def _cull_all(self, due: list[tuple[Candidate, str]]) -> list[dict]:
        """Cull each of ``due`` at once, each on its own thread: a slow server delays no other.

        Every request of a stop has its own deadline (:mod:`jax_nbmem.cli.hubapi`), so each
        thread ends; the bookkeeping is done here, in order, once they have.
        """
        if self.dry_run or len(due) <= 1:
            return [self._cull(candidate, key) for candidate, key in due]
        stopped: list = [None] * len(due)

        def stop_one(index: int, candidate: Candidate) -> None:
            stopped[index] = self._stop(candidate)

        threads = [threading.Thread(target=stop_one, args=(i, c), daemon=True,
                                    name=f"jax-nbmem-cull-{c.pid}")
                   for i, (c, _) in enumerate(due)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [self._cull(c, key, stopped[i]) for i, (c, key) in enumerate(due)]

    def _stop(self, candidate: Candidate):
        """Stop the candidate's kernel: what :func:`stop` did, or the StopError it raised."""
        try:
            kernel = find(candidate.pid, self.share_dir, self._host)
            return stop(kernel, self.hub, log_path=self.log_path)
        except StopError as error:
            return error

    def _cull(self, candidate: Candidate, key: str | None = None, stopped=None) -> dict:
        event = self._event("cull", candidate)
        if self.dry_run:
            event["message"] = f"would shut down {self._label(candidate)} (--dry-run: nothing done)"
            return event
        stopped = self._stop(candidate) if stopped is None else stopped
        if isinstance(stopped, StopError):
            event.update(action="error", message=f"could not shut down {self._label(candidate)}: "
                         f"{stopped}")  # fmt: skip
            return event
        remove_notice(self.share_dir, key or candidate.pid)
        self._warned_owner.pop(candidate.pid, None)
        self.culled[candidate.reason] = self.culled.get(candidate.reason, 0) + 1
        if self._counts is not None:
            self._counts.counts[candidate.reason] = self._counts.counts.get(candidate.reason, 0) + 1
            self._keep_counts()
        if self._counter is not None:
            self._counter.labels(reason=candidate.reason).inc()
        event.update(how=stopped.how, server=stopped.server, message=f"culled: {stopped.message}")
        return event

    def _keep_counts(self) -> None:
        """Write the counts where the node exporter reads them; a failure is said, not fatal."""
        try:
            write_counts(self.share_dir, self._counts)
        except OSError as error:
            said = f"jax-nbmem cull: cannot keep the cull counts in {self.share_dir}: {error}"
            print(printable_lines(said), file=self.out, flush=True)

    def _forget(self, key: str, label: str, why: str, pid: int | None = None) -> dict:
        remove_notice(self.share_dir, key)
        if pid is None and key.isdigit():
            pid = int(key)
        self._warned_owner.pop(pid, None)
        return {"action": "cancel", "pid": pid, "key": key,
                "message": f"no longer culling {label}: {why}"}  # fmt: skip

    def _ran_a_cell_since(self, pid: int, notice: Notice, beacons) -> bool:
        beacon = beacons.get(pid)
        if beacon is None:
            return False  # judged by the server's idleness: candidates() saw it idle still
        finished = beacon.last_cell_finished_at or 0.0
        return beacon.cell_running or finished > notice.warned_at

    def _noticed(self) -> set[str]:
        """The keys of the notices in the share directory (``<pid>`` or ``<ino>-<pid>``)."""
        try:
            names = os.listdir(self.share_dir)
        except OSError:
            return set()
        return {match.group(1) for name in names if (match := _NOTICE.fullmatch(name))}

    def _event(self, action: str, candidate: Candidate) -> dict:
        return {
            "action": action, "pid": candidate.pid, "kernel_id": candidate.kernel_id,
            "user": candidate.user, "hub_user": candidate.hub_user,
            "notebook": candidate.notebook, "gpu": candidate.gpu,
            "bytes": candidate.used_bytes, "idle_s": candidate.idle_s,
            "reason": candidate.reason, "dry_run": self.dry_run,
        }  # fmt: skip

    def _label(self, candidate: Candidate) -> str:
        """The candidate as people know it; a hub user the host did not prove is "(claimed)"."""
        claimed = candidate.hub_user
        if claimed and claimed != candidate.user:
            if self._proven_hub_users.get(candidate.pid) != claimed:
                candidate = dataclasses.replace(candidate, hub_user=f"{claimed} (claimed)")
        return candidate.label()

    def _say(self, event: dict, log: bool = True) -> None:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # Notebook names and hub users are their users' words: shown only neutralised.
        print(printable_lines(f"jax-nbmem cull: {event['message']}"), file=self.out, flush=True)
        if self.log_path is None or not log:
            return
        try:  # never through a link, nor in a folder others may write
            line = json.dumps({"at": at, "by": "jax-nbmem cull", **event})
            append_line(self.log_path, line + "\n")
        except OSError as error:
            print(printable_lines(f"jax-nbmem cull: cannot write {self.log_path}: {error}"),
                  file=self.out)  # fmt: skip

    def serve(self, every_s: float) -> None:
        """Rounds every ``every_s`` seconds until interrupted; a failed round is said, not fatal."""
        while True:
            began = time.monotonic()
            try:
                self.round()
            except Exception as error:  # a service keeps running: say it and try again
                print(printable_lines(f"jax-nbmem cull: the round failed: {error!r}"),
                      file=self.out, flush=True)  # fmt: skip
            time.sleep(max(0.0, every_s - (time.monotonic() - began)))
