"""One kernel's jax_nbmem state: allocator control, the sampler, and the per-cell ledger.

Plain Python: the magics module builds one `KernelSession` per loaded extension and forwards
IPython's events to it. Everything called from event callbacks is safe there: it never raises.

Loading the extension imports only what the cells' records need: who else is on the GPU
(status, servers, beacons, the node agent's client) is imported when first asked, and the
beacon and the status watch start on a thread of their own (``jax_nbmem-start``), so that
``%load_ext`` stays within a tenth of a second.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jax_nbmem.allocator.control import ENV_MODE_REASON, AllocatorControl, ApplyResult
from jax_nbmem.allocator.modes import AllocatorMode, ModeError, parse_mode
from jax_nbmem.allocator.report import (
    cap_report,
    format_applied,
    format_report,
    overridden_lines,
    too_late,
)
from jax_nbmem.gpu.frameworks import framework_of_oom
from jax_nbmem.gpu.jaxstats import is_resource_exhausted
from jax_nbmem.notebook.exits import at_hard_exit, forget_hard_exit
from jax_nbmem.notebook.settings import JaxNbMem, startup_mode
from jax_nbmem.record.ledger import CellRecord, Ledger
from jax_nbmem.record.sampler import Sampler, SamplerSource
from jax_nbmem.tenants.watch import StatusWatcher
from jax_nbmem.tools.last_error import ErrorHold, hold_of, where_in_file
from jax_nbmem.units import format_bytes

if TYPE_CHECKING:
    from jax_nbmem.node.servers import ShutdownResult
    from jax_nbmem.tenants.auto import AutoChoice, Policy
    from jax_nbmem.tenants.status import StatusReport

__all__ = ["KernelSession"]

log = logging.getLogger("jax_nbmem")

# How long a magic or the OOM diagnosis waits for a fresh look at the GPU (NVML, /proc, the
# Jupyter servers) before it answers from the last one.
_FRESH_STATUS_WAIT_S = 1.5
# How long a reader of the cell records waits for the last cells' after-readings.
_SETTLE_S = 1.0
# What an error's frames must hold for the out-of-memory diagnosis to mention it.
_ERROR_HOLD_WORTH_SAYING = 64 * 1024**2


# Warnings that a mode just asked for will not fit: said right after `%jaxalloc` asks for it.
_WILL_NOT_FIT = ("prealloc-will-fail", "prealloc-exceeds-cap")
# How long closing waits for the thread that starts the beacon and the watch.
_START_JOIN_S = 5.0


def _warning_line(warning: dict) -> str:
    from jax_nbmem.tenants.status import warning_line

    return warning_line(warning)


class KernelSession:
    """The extension's state for one IPython shell."""

    def __init__(
        self,
        settings: JaxNbMem,
        *,
        say: Callable[[str], None] = print,
        source: SamplerSource | None = None,
        in_kernel: bool = True,
    ) -> None:
        self.settings = settings
        self.in_kernel = in_kernel  # False in terminal IPython: messages say "session"
        self.control = AllocatorControl()
        self.sampler: Sampler | None = None
        if settings.sampling != "off":
            self.sampler = Sampler(
                source,
                interval=settings.sample_interval,
                process_interval=settings.process_interval,
            )
        self.ledger = Ledger(self.sampler, max_records=settings.max_cells)
        self.watcher = StatusWatcher(self.status, interval=settings.status_interval)
        self._say = say
        self._cell_listeners: list[Callable[[], None]] = []
        self.auto_choice: AutoChoice | None = None
        self._claim_dir: str | None = None  # where this kernel's claim is, until JAX starts
        # The user's namespace and how to name a code location (IPython's "Cell In[5],
        # line 3"), set by the magics; the arrays the last error's frames held, by weak
        # reference (noted after each failed cell, for the out-of-memory diagnosis).
        self.user_namespace: dict | None = None
        self.where: Callable[[str, int | None], str] = where_in_file
        self.error_hold: ErrorHold | None = None
        self.beacon: Any = None  # made by the start thread (None: none, or not yet)
        self._starter: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        """Start background sampling (not when sampling is off), the watch and the beacon.

        Idempotent. The sampler starts here; the beacon and the status watch on a thread, which
        imports what they need (:meth:`close` waits for it).
        """
        if self.sampler is not None:
            self.sampler.start()
        if self._starter is None:
            self._starter = threading.Thread(
                target=self._start_background, name="jax_nbmem-start", daemon=True
            )
            self._starter.start()

    def _start_background(self) -> None:
        try:
            from jax_nbmem.notebook.beacon import beacon_writer

            beacon = beacon_writer(self)
            if self._closed:
                return
            if self.sampler is not None:
                self.watcher.start()
            if beacon is not None:
                self.beacon = beacon
                beacon.start()  # removed at exit; when the kernel's parent dies, too:
                at_hard_exit(beacon.discard)
        except Exception:  # a beacon or watch less, said in the log; never a cell's error
            log.warning("jax_nbmem: starting the beacon or the status watch failed", exc_info=True)

    def status(self) -> StatusReport:
        """A fresh status report as this kernel sees it (reads NVML and /proc; not for hooks)."""
        from jax_nbmem.notebook.beacon import share_dir
        from jax_nbmem.tenants.status import collect

        return collect(
            control=self.control,
            in_kernel=True,
            share_dir=share_dir(self),
            own_name=self.own_name,
            own=self._own_account(),
            agent_user=getattr(self.settings, "agent_user", "") or None,
        )

    def allocator_report(self) -> str:
        """The ``%jaxalloc`` report, with what its mode takes under an MPS or HAMi cap.

        Reads NVML only when a cap variable is set (a user's command, never a hook).
        """
        from jax_nbmem.gpu import nvml

        report = self.control.report()
        return format_report(report, cap_report(report, os.environ, nvml.gpus))

    def _own_account(self):
        """This kernel as its session knows it, for its own status row (None if that fails)."""
        try:
            from jax_nbmem.notebook.beacon import own_beacon

            return own_beacon(self)
        except Exception:  # the row is then judged from outside, as any process's
            log.debug("jax_nbmem: this kernel's own account failed", exc_info=True)
            return None

    @property
    def own_name(self) -> str:
        """How messages name this process: "this kernel", or "this IPython session"."""
        return "this kernel" if self.in_kernel else "this IPython session"

    def apply_startup_mode(self) -> None:
        """Apply the mode from $JAX_NBMEM_ALLOCATOR or the config, telling the user if it fails."""
        text, source = startup_mode(self.settings)
        if not text:
            return
        # A provisioner chose the mode at launch (and set its variables already).
        reason = os.environ.get(ENV_MODE_REASON) if source.startswith("$") else None
        if reason:
            source = f"{source} (chosen at launch: {reason})"
        try:
            mode, source = self._decide(parse_mode(text), source)
        except ModeError as exc:
            self._say(f"jax_nbmem: ignoring allocator mode {text!r} from {source}: {exc}")
            return
        result = self.control.apply(mode, source)
        if reason and self.auto_choice is None:
            from jax_nbmem.tenants.auto import AutoChoice

            self.auto_choice = AutoChoice(mode, reason, {})  # said in the beacon too
        if result.too_late:
            self._say(too_late(mode, self.control.report(), self.in_kernel))
        elif self.auto_choice is not None and not reason:
            self._say(f"jax_nbmem: allocator mode auto chose '{mode}': {self.auto_choice.reason}.")

    def request(self, text: str, source: str = "%jaxalloc") -> tuple[ApplyResult, str]:
        """Apply a mode the user typed; ModeError (environment untouched) if it is invalid.

        ``auto`` is resolved here, from the GPU as it is now; a mode the site's policy forbids
        is refused (a ModeError with the administrator's reason), and nothing changes.
        """
        asked = parse_mode(text)
        mode, source = self._decide(asked, source)
        result = self.control.apply(mode, source)
        if result.too_late:
            return result, too_late(mode, self.control.report(), self.in_kernel)
        message = format_applied(result, self.in_kernel)
        overridden = overridden_lines(self.control.report())
        if overridden:  # JAX's config or XLA_FLAGS will run something else than this mode
            message += "\n" + "\n".join(f"  But: {line}." for line in overridden)
        if asked.name == "auto" and self.auto_choice is not None:
            message = f"jax_nbmem: auto chose '{mode}': {self.auto_choice.reason}.\n{message}"
        # The new mode may not fit in what the GPU has free right now: say so before JAX fails.
        report, fresh = self.watcher.fresh(_FRESH_STATUS_WAIT_S)
        lines = [message]
        if not fresh:
            lines.append(
                "  (Whether it fits this GPU is not checked yet: NVML did not answer within "
                f"{_FRESH_STATUS_WAIT_S:g} s. `%jaxmem status` shows it later.)"
            )
        elif report is not None:
            fits = [w for w in report.get("warnings", []) if w["kind"] in _WILL_NOT_FIT]
            lines.extend(map(_warning_line, fits))
        return result, "\n".join(lines)

    def cells(self) -> list[CellRecord]:
        """Every kept record, after waiting (at most a second) for the last cells' readings.

        For ``%jaxmem cells`` and ``jax_nbmem.cells()``: the reading after a cell is taken by
        the sampler's thread and may still be on its way when the next cell asks.
        """
        self.ledger.settle(_SETTLE_S)
        return self.ledger.records()

    def add_cell_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every cell (once per listener; errors are swallowed).

        It runs on the cell's path: it should only note that something changed.
        """
        if listener not in self._cell_listeners:
            self._cell_listeners.append(listener)

    def remove_cell_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener``; unknown listeners are ignored."""
        if listener in self._cell_listeners:
            self._cell_listeners.remove(listener)

    def add_record_listener(self, listener: Callable[[CellRecord], Any]) -> None:
        """Call ``listener(record)`` with each cell's :class:`CellRecord` once it is final.

        The point to update a view of the cells: the record's "after" reading is in (taken
        between that cell and the next). It is called on the sampler's thread, or on the main
        thread at the next cell's start (Run All) or at the cell's end (no sampler thread):
        it should only note the record or schedule its work. Errors are swallowed. See
        :meth:`jax_nbmem.record.ledger.Ledger.add_closed_listener`.
        """
        self.ledger.add_closed_listener(listener)

    def remove_record_listener(self, listener: Callable[[CellRecord], Any]) -> None:
        """Stop calling ``listener``; unknown listeners are ignored."""
        self.ledger.remove_closed_listener(listener)

    def cell_callbacks(
        self, execution_count: Callable[[], int | None], failed: Callable[[str], None]
    ) -> tuple[Callable[..., None], Callable[..., None]]:
        """IPython's ``pre_run_cell`` and ``post_run_cell`` callbacks for this session.

        *execution_count* reads the shell's count; *failed(name)* is called, inside the
        ``except``, when a callback fails: nothing escapes into the user's cell (IPython prints
        a traceback after every cell whose callback raised). They run around every cell, so
        they do what the session does per cell themselves, in one call each (the ledger's
        hooks aside): each call costs a cell more than its instructions, coming after
        IPython's own work has pushed our code out of the processor's caches.
        """
        control, ledger, listeners = self.control, self.ledger, self._cell_listeners

        def pre_run_cell(info: Any = None) -> None:
            try:
                count = execution_count()
                if control.backend is None:  # once JAX's start is recorded, nothing to observe
                    control.observe_cell_start(count)
                try:
                    source = info.raw_cell or ""
                except AttributeError:  # IPython before 8 gives no info
                    source = ""
                ledger.cell_started(count, source)
            except BaseException:
                failed("pre_run_cell")

        def post_run_cell(result: Any = None) -> None:
            try:
                # IPython's ExecutionResult; its `success` is a property saying just this.
                try:
                    error = result.error_in_exec or result.error_before_exec
                    count = result.execution_count
                except AttributeError:
                    error = count = None
                if control.backend is None:
                    control.observe_cell_end(count)
                ledger.cell_finished(error is None, error, count)
                if error is not None:
                    self._cell_failed(error, count)
                for listener in listeners:
                    try:
                        listener()
                    except Exception:
                        log.debug("jax_nbmem: cell listener %r failed", listener, exc_info=True)
            except BaseException:
                failed("post_run_cell")

        return pre_run_cell, post_run_cell

    def _cell_failed(self, error: BaseException, execution_count: int | None) -> None:
        """After a cell that raised: keep what its frames hold; explain an out-of-memory."""
        previous, self.error_hold = self.error_hold, self._hold_of(error, execution_count)
        if is_resource_exhausted(error):
            try:
                self._explain_oom()
                self._say_error_holds(previous, self.error_hold, execution_count)
            except Exception:
                log.debug("jax_nbmem: the out-of-memory diagnosis failed", exc_info=True)
            return
        framework = framework_of_oom(error)
        if framework is not None:  # PyTorch's, CuPy's or TensorFlow's, beside JAX's pool
            try:
                self._explain_framework_oom(framework)
                # JAX arrays an error's frames keep alive take the GPU from them too.
                self._say_error_holds(previous, self.error_hold, execution_count)
            except Exception:
                log.debug("jax_nbmem: the %s out-of-memory diagnosis failed", framework,
                          exc_info=True)  # fmt: skip

    def _explain_framework_oom(self, framework: str) -> None:
        """Under another framework's out-of-memory traceback: what JAX holds here, what to do."""
        from jax_nbmem.tenants.own_memory import framework_oom_text

        report, _ = self.watcher.fresh(_FRESH_STATUS_WAIT_S)
        control = self.control.report()
        started = control.backend is not None or control.backend_started
        mode = self.started_mode().mode_name
        self._say(framework_oom_text(framework, report or {}, self.own_name, mode, started))

    def started_mode(self):
        """The allocator settings JAX started with (or will start with, before it has)."""
        report = self.control.report()
        return report.backend.effective if report.backend is not None else report.pending

    def fit_context(self) -> dict:
        """What ``check_fit`` needs from this session, for ``%jaxmem fit`` and ``fit()`` alike.

        The mode JAX started with, the user's names, and what the last error's frames hold.
        """
        hold = self.error_hold
        return {
            "started": self.started_mode(),
            "namespace": self.user_namespace,
            "last_error_bytes": hold.alive_bytes() if hold is not None else None,
        }

    def _hold_of(self, error: BaseException, cell: int | None) -> ErrorHold | None:
        """What *error*'s frames hold that no name does (its locals only: cheap; never raises)."""
        try:
            return hold_of(error, self.user_namespace, cell=cell, where=self.where)
        except Exception:
            log.debug("jax_nbmem: reading the error's frames failed", exc_info=True)
            return None

    def _say_error_holds(
        self, previous: ErrorHold | None, current: ErrorHold | None, cell: int | None
    ) -> None:
        """After an out-of-memory error: what error frames kept alive, where it is worth saying.

        The previous error's frames held their arrays until this error replaced it, so while
        this cell ran; this error's frames hold theirs until the next error.
        """
        if previous is not None and previous.held_bytes >= _ERROR_HOLD_WORTH_SAYING:
            still = previous.alive_bytes()
            if still:
                # IPython's frame that ran the cell is in the error's traceback and holds the
                # cell's result, which holds the error: a cycle, freed only when Python's
                # garbage collector gets to it. Now is when it matters.
                gc.collect()
                left = previous.alive_bytes()
                collected, still = still - left, left
            else:
                collected = 0
            if still:
                after = (
                    f"{format_bytes(still)} of it is still held by something else "
                    "(`%jaxmem top` shows by what)"
                )
            elif collected:
                after = (
                    "they were left in a reference cycle, which jax_nbmem collected now, so "
                    "running the cell again may fit"
                )
            else:
                after = "they are released now, so running the cell again may fit"
            self._say(
                f"jax_nbmem: the error of cell [{previous.cell}] ({previous.error}) kept "
                f"{format_bytes(previous.held_bytes)} of arrays alive in its frames "
                f"({', '.join(previous.labels())}) while cell [{cell}] ran; {after}."
            )
        if current is not None and current.held_bytes >= _ERROR_HOLD_WORTH_SAYING:
            self._say(
                f"jax_nbmem: this error's frames now hold {format_bytes(current.held_bytes)} "
                f"of arrays ({', '.join(current.labels())}) until the next error: "
                "`%jaxmem free --last-error` releases them."
            )

    def _explain_oom(self) -> None:
        """Under a RESOURCE_EXHAUSTED traceback: who holds the GPU and what to do (once)."""
        report, fresh = self.watcher.fresh(_FRESH_STATUS_WAIT_S)
        if report is None:
            self._say(
                "jax_nbmem: JAX ran out of memory; who holds the GPU is not known yet (NVML "
                f"did not answer within {_FRESH_STATUS_WAIT_S:g} s). Try `%jaxmem status`."
            )
            return
        if not fresh:
            self._say("jax_nbmem: NVML is slow; this is the GPU as it was a few seconds ago.")
        ours = {gpu["index"] for gpu in report["gpus"] if gpu["ours"]}
        gpus = [gpu for gpu in report.gpu_memory() if gpu.index in ours]
        if not gpus:
            self._say(
                "jax_nbmem: JAX ran out of memory; NVML cannot show who holds the GPU "
                f"({report['nvml']['reason'] or 'no GPU visible'})."
            )
            return
        from jax_nbmem.tenants.advice import oom_diagnosis

        self._say(oom_diagnosis(report.tenants(), gpus, self.own_name))

    def shutdown(self, pid: int, *, confirm: bool) -> ShutdownResult:
        """Shut down another kernel of this user on our GPUs (see `servers.shutdown_kernel`).

        ``pid`` is the host PID the status showed; in a container it is translated, through
        the node agent's resolution, to the PID of that process here, or refused.
        """
        from jax_nbmem.node.servers import shutdown_kernel

        return shutdown_kernel(pid, self.status().tenants(), confirm=confirm)

    def elsewhere_pids(self) -> set[int]:
        """Host PIDs in the latest status that run in another PID namespace (no button there)."""
        report = self.watcher.latest()
        return {t.pid for t in report.tenants() if t.elsewhere} if report is not None else set()

    def warnings(self) -> list[dict]:
        """The latest warnings about our GPUs (from the background watch; may be a few s old)."""
        report = self.watcher.latest()
        return list(report["warnings"]) if report is not None else []

    def banner_messages(self) -> list[str]:
        """One-line status messages worth showing above the panel (NVML, sampler, JAX)."""
        messages = []
        latest = self.sampler.latest() if self.sampler else None
        from jax_nbmem.gpu import nvml  # lazily: loading the extension must not load NVML

        state = nvml.last_status()  # never waits for NVML: the panel calls this
        if not state.available:
            messages.append(f"NVML unavailable: {state.reason}.")
        elif state.reason:
            messages.append(f"NVML: {state.reason}")
        if self.sampler is None:
            messages.append("Sampling is off (c.JaxNbMem.sampling = 'off').")
        elif self.sampler.last_error:
            messages.append(f"Sampler: {self.sampler.last_error}")
        if latest is not None:
            messages.extend(f"{g.label}: {g.problem}" for g in latest.gpus if g.problem)
        messages.extend(map(_warning_line, self.warnings()))
        if not self.control.backend_started():
            pending = self.control.report().pending
            messages.append(f"JAX has not started yet; it will start with: {pending.mode_name}.")
        return messages

    def _policy(self) -> Policy:
        from jax_nbmem.tenants.auto import Policy

        try:
            return Policy.from_setting(getattr(self.settings, "policy", None))
        except ValueError as exc:
            self._say(f"jax_nbmem: ignoring the site's policy: {exc}")
            return Policy()

    def _decide(self, mode: AllocatorMode, source: str) -> tuple[AllocatorMode, str]:
        """The mode to apply for *mode*, and where it came from (main thread, a user's command).

        ``auto`` becomes a concrete mode, chosen under the claims lock so that kernels starting
        together see each other's pools (:mod:`jax_nbmem.node.claims`); this kernel's claim
        lasts 30 s, and stops counting once NVML shows its pool (nothing on a cell's path
        removes it; unloading does). Other modes pass, unless the policy forbids them.
        """
        if self.control.backend_started():
            return mode, source  # too late in any case: said by the caller
        if mode.name != "auto" and not getattr(self.settings, "policy", None):
            return mode, source  # nothing to decide: no need to load the deciding code
        from jax_nbmem.node.beacons import beacon_dirs
        from jax_nbmem.notebook.beacon import share_dir
        from jax_nbmem.tenants.auto import PolicyError, decide

        dirs = beacon_dirs(share_dir(self))
        directory = dirs[-1] if dirs else None  # the shared one when there is one
        try:
            chosen, choice = decide(
                mode,
                policy=self._policy(),
                auto_fraction=getattr(self.settings, "auto_fraction", None),
                claims_dir=directory,
                status=self.status,
            )
        except PolicyError as exc:
            raise ModeError(str(exc)) from None
        if choice is None:
            return chosen, source
        self.auto_choice = choice
        self._claim_dir = directory if choice.claim else None
        return chosen, f"{source} auto: {choice.reason}"

    def _release_claim(self) -> None:
        if self._claim_dir is not None:
            from jax_nbmem.node.claims import claim_book

            with claim_book(self._claim_dir, wait_s=0.5) as book:
                if book is not None:
                    book.release(os.getpid())
            self._claim_dir = None

    def close(self) -> None:
        """Stop whatever runs in the background; the session is not used after this."""
        self._closed = True
        starter = self._starter
        if starter is not None and starter is not threading.current_thread():
            starter.join(_START_JOIN_S)
        self._release_claim()
        self._cell_listeners.clear()
        if self.beacon is not None:
            forget_hard_exit(self.beacon.discard)
            self.beacon.close()
        self.watcher.stop()
        if self.sampler is not None:
            self.sampler.stop()
