"""Track a block of code: each device's peak and retained memory, in a script or a notebook.

``with track() as t:`` (or ``@track()`` on a function) reads memory at the block's two ends
and watches it in between with a :class:`~jax_nbmem.record.sampler.Sampler`: the running
notebook session's when one is handed over (``find_sampler``), else a private one started for
the block and stopped at its end. What the figures mean is said in :class:`Tracker`; how they
combine (exact JAX ends, JAX's own peak where it rose, sampled NVML peaks) is the per-cell
ledger's, reused here per device. Nothing here imports IPython or starts JAX's backend.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from jax_nbmem.record.combine import block_jax_peak, difference, extreme, gpu_total, peak_total
from jax_nbmem.record.sampler import QuickReading, Sampler, SamplerSource
from jax_nbmem.record.simulated import SIMULATED_KIND
from jax_nbmem.units import format_bytes, format_bytes_delta, format_duration

__all__ = ["Tracker"]

# A private sampler watches closely: a 300 ms transient must fall between two process lists.
_PRIVATE_INTERVAL_S = 0.05
_PRIVATE_PROCESS_INTERVAL_S = 0.5
_BUSY_PROCESS_INTERVAL_S = 0.1
# How long a reader waits for the reading after the block (like KernelSession.cells()).
_SETTLE_S = 1.0
_STOP_TIMEOUT_S = 2.0
_LABELS = {
    "jax_exact": "JAX, exact",
    "jax_sampled": "JAX, sampled",
    "nvml_sampled": "NVML, sampled",
    "host_rss_sampled": "host RSS, sampled",
}
_AFTER_WAITING = "GPU figures after the block: not read yet (the sampler reads them next)"


class _Run:
    """One tracked block: its sampler, what was read at its ends, and the extremes between."""

    def __init__(self) -> None:
        self.sampler: Any = None
        self.origin = "none"  # "given", "session" or "private"
        self.private = False
        self.started_mono = time.monotonic()
        self.ended_mono: float | None = None
        self.quick_before: Any = None
        self.quick_after: Any = None
        self.before: Any = None
        self.after: Any = None
        self.after_state = "none"  # "waiting" for the sampler's thread, or "taken"
        self.waited = False
        self.arrived = threading.Event()
        self.peak_tracker: Any = None
        self.peaks: Any = None
        self.busy_before = False
        self.busy_interval: tuple[float, float] | None = None  # (ours, the sampler's own)
        self.errors_before = 0
        self.error: str | None = None
        self.notes: list[str] = []

    def attempt(self, what: str, action: Callable[[], Any], default: Any = None) -> Any:
        """``action()``, or *default* with a note saying what failed: never an exception."""
        try:
            return action()
        except Exception as exc:
            self.notes.append(f"{what} failed: {type(exc).__name__}: {exc}")
            return default

    def after_arrived(self, sample: Any, started: float) -> None:
        self.after, self.after_state = sample, "taken"
        self.arrived.set()


class Tracker:
    """Per-device peak and retained bytes of one block; a context manager and a decorator.

    Devices are named ``"gpu:<n>"``, *n* being the NVML index (what ``nvidia-smi`` shows;
    ``to_dict()`` gives JAX's device id on it as ``jax_device``); a JAX GPU that NVML does not
    show is ``"jax:<id>"``. Without any GPU there is one device, ``"host"``. On a GPU,
    :attr:`peak` and :attr:`retained` are JAX's bytes in use where JAX counts that GPU (read
    exactly at both ends; the peak exact when JAX's ``peak_bytes_in_use`` rose in the block,
    else sampled, so at least that), otherwise this process's bytes per NVML (sampled peak;
    retained from a complete reading after the block). ``"host"`` is the resident memory
    (RSS) of this process. A value is ``None`` when unknown, never a guessed 0;
    :meth:`to_dict` says which source each figure came from and holds every figure.

    The sampler: ``sampler`` if given (started for the block and stopped after if it was not
    running), else ``find_sampler()``'s running sampler (the notebook session's; left running,
    its busy flag and rate given back after), else a private one on ``source`` (for tests;
    default: NVML and JAX), started for the block. During the block the process list is read
    at least every 0.1 s, so a 300 ms transient is caught. Reading :attr:`peak`,
    :attr:`retained` or :meth:`to_dict` before the block ended raises ``RuntimeError``; they,
    and ``str()``, wait up to a second for the sampler's reading after the block. A tracker
    may be entered again once its block ended (it then forgets the last one), not while it is
    open. As a decorator each call is tracked by a fresh tracker, kept as ``wrapped.tracker``
    (the last call's; ``None`` before the first). Exceptions from the block pass through
    unchanged; a fault in reading becomes a note.
    """

    def __init__(
        self,
        *,
        sampler: Sampler | None = None,
        source: SamplerSource | None = None,
        find_sampler: Callable[[], Any] | None = None,
        settle_s: float = _SETTLE_S,
    ):
        self._options = {"sampler": sampler, "source": source, "find_sampler": find_sampler}
        self._settle_s = settle_s
        self._run: _Run | None = None

    # --- the block ------------------------------------------------------------------------

    def __enter__(self) -> Tracker:
        if self._run is not None and self._run.ended_mono is None:
            raise RuntimeError("this tracker is already tracking a block; use a new track()")
        run = self._run = _Run()
        run.attempt("starting to track", lambda: self._open(run))
        run.started_mono = time.monotonic()
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> bool:
        run = self._run
        if run is None or run.ended_mono is not None:
            return False
        run.ended_mono = time.monotonic()
        if exc_type is not None:
            run.error = exc_type.__name__
        if run.sampler is not None:
            run.attempt("finishing the tracking", lambda: _close(run))
        return False  # the block's exception, if any, goes on unchanged

    def _open(self, run: _Run) -> None:
        given, source = self._options["sampler"], self._options["source"]
        find = self._options["find_sampler"]
        shared = find() if given is None and source is None and find is not None else None
        if given is not None:
            sampler, run.origin = given, "given"
        elif shared is not None and getattr(shared, "running", False):
            sampler, run.origin = shared, "session"
        else:
            sampler, run.origin = _private_sampler(source), "private"
        run.private = not sampler.running
        run.sampler = sampler
        run.errors_before = _error_count(sampler)
        run.busy_before = bool(getattr(sampler, "busy", False))
        run.quick_before = sampler.quick_reading()
        run.before = sampler.sample_now()
        run.peak_tracker = sampler.track()
        sampler.set_busy(True)
        own = getattr(sampler, "busy_process_interval", _BUSY_PROCESS_INTERVAL_S)
        if own > _BUSY_PROCESS_INTERVAL_S:
            sampler.configure(busy_process_interval=_BUSY_PROCESS_INTERVAL_S)
            run.busy_interval = (_BUSY_PROCESS_INTERVAL_S, own)
        if run.private:
            sampler.start()

    def __call__(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate *func*: each call is tracked afresh; ``wrapped.tracker`` is the last one."""
        options = dict(self._options)

        @functools.wraps(func)
        def tracked(*args: Any, **kwargs: Any) -> Any:
            tracker = Tracker(**options, settle_s=self._settle_s)
            tracked.tracker = tracker  # type: ignore[attr-defined]
            with tracker:
                return func(*args, **kwargs)

        tracked.tracker = None  # type: ignore[attr-defined]
        return tracked

    # --- what it found ----------------------------------------------------------------------

    @property
    def duration_s(self) -> float | None:
        """Seconds the block ran (so far, while it runs); ``None`` before it started."""
        run = self._run
        if run is None:
            return None
        return (run.ended_mono or time.monotonic()) - run.started_mono

    @property
    def peak(self) -> dict[str, int | None]:
        """Peak bytes per device (see the class docstring for names and sources)."""
        return self._figures()["peak"]

    @property
    def retained(self) -> dict[str, int | None]:
        """Bytes held after the block minus before, per device (may be negative)."""
        return self._figures()["retained"]

    def to_dict(self) -> dict[str, Any]:
        """Every figure, JSON-friendly.

        Keys: ``duration_s``, ``samples`` (taken inside the block), ``sampler`` (``"session"``,
        ``"private"`` or ``"given"``), ``error`` (the block's exception type, if it raised),
        ``peak``, ``retained``, ``devices`` (per device: ``peak``/``retained`` with their
        ``peak_source`` — ``"jax_exact"``, ``"jax_sampled"`` or ``"nvml_sampled"`` — and
        ``retained_source`` — ``"jax"`` or ``"nvml"``; ``jax_in_use_before``/``peak``/``after``,
        ``jax_retained``, ``peak_exact``; ``gpu_self_before``/``peak``/``after``/``retained``,
        this process per NVML), ``host`` (``rss_before``/``peak``/``after``/``retained``,
        ``live_array_bytes_before``/``after``) and ``notes``.
        """
        return self._figures()

    def _figures(self) -> dict[str, Any]:
        run = self._run
        if run is None:
            raise RuntimeError("track(): nothing tracked yet; use `with jax_nbmem.track() as t:`")
        if run.ended_mono is None:
            raise RuntimeError("track(): the block is still running; read the figures after it")
        if run.after_state == "waiting" and not run.waited:
            run.waited = True
            run.arrived.wait(self._settle_s)
        return _figures(run)

    def __str__(self) -> str:
        run = self._run
        if run is None:
            return "track: not started"
        if run.ended_mono is None:
            return f"track: running ({format_duration(self.duration_s)} so far)"
        try:
            return _summary(self._figures())
        except Exception as exc:  # printing never raises
            return f"track: {format_duration(self.duration_s)} — figures unreadable ({exc})"

    __repr__ = __str__


def _private_sampler(source: SamplerSource | None) -> Sampler:
    return Sampler(
        source,
        interval=_PRIVATE_INTERVAL_S,
        process_interval=_PRIVATE_PROCESS_INTERVAL_S,
        busy_process_interval=_BUSY_PROCESS_INTERVAL_S,
    )


def _close(run: _Run) -> None:
    """Read the block's end, give the sampler back as it was, and ask for the after reading."""
    sampler = run.sampler
    run.quick_after = run.attempt("reading JAX after the block", sampler.quick_reading)
    if run.peak_tracker is not None:
        run.peaks = run.attempt("closing the peak tracker", run.peak_tracker.close)
    run.attempt("restoring the sampler's busy flag", lambda: sampler.set_busy(run.busy_before))
    if run.busy_interval is not None:
        ours, own = run.busy_interval
        if sampler.busy_process_interval == ours:  # nobody else changed it meanwhile
            run.attempt("restoring the sampler's rate", lambda: sampler.configure(None, None, own))
    if run.private:
        run.attempt("stopping the sampler", lambda: sampler.stop(_STOP_TIMEOUT_S))
    gpus_seen = run.before is not None and bool(run.before.gpus)
    if run.private or not gpus_seen:
        # Its thread is stopped (or there is no GPU to wait for): read here, arrays included.
        run.after = run.attempt("reading after the block", sampler.sample_now)
        run.after_state = "taken"
    else:
        run.after_state = "waiting"
        run.attempt("asking for the reading after the block", lambda: sampler.request_after(
            run.after_arrived))  # fmt: skip
    errors = _error_count(sampler) - run.errors_before
    if errors > 0 and getattr(sampler, "last_error", None):
        run.notes.append(f"the sampler failed {errors} reading(s); last: {sampler.last_error}")


def _error_count(sampler: Any) -> int:
    count = getattr(sampler, "error_count", 0)
    return count if isinstance(count, int) else 0


def _one_device(reading: Any, device: Any) -> QuickReading | None:
    """A quick reading narrowed to one JAX device (``None`` stays unknown)."""
    if reading is None:
        return None
    mine = tuple(d for d in reading.jax if getattr(d, "id", None) == getattr(device, "id", None))
    return QuickReading(reading.t, reading.mono, reading.jax_up, mine)


def _devices(run: _Run) -> list[tuple[str, int | None, Any]]:
    """(name, NVML index or None, JAX device or None) for every device seen in the block."""
    samples = [s for s in (run.before, run.after) if s is not None]
    order: list[int] = []
    for sample in samples:  # a sample lists its GPUs in the order JAX numbers them
        order += [g.index for g in sample.gpus if g.index not in order]
    order += [g.index for g in getattr(run.peaks, "gpus", ()) if g.index not in order]
    reading = run.quick_after or run.quick_before
    # The simulated GPU's stand-ins for JAX's counters (the mirror's live arrays) are for the
    # cells' table, which says what they are; track() names its peak's source "jax_...": it
    # keeps the simulated GPU's own figures (NVML's), as for a JAX without counters.
    seen = reading.jax if reading is not None else ()
    jax = [d for d in seen if getattr(d, "kind", None) != SIMULATED_KIND]
    devices = [(f"gpu:{index}", index, jax[k] if k < len(jax) else None)
               for k, index in enumerate(order)]  # fmt: skip
    devices += [(f"jax:{getattr(d, 'id', k)}", None, d) for k, d in enumerate(jax[len(order) :])]
    return devices


def _device_figures(run: _Run, index: int | None, device: Any) -> dict[str, Any]:
    before, after, peaks = run.before, run.after, run.peaks
    indices = [] if index is None else [index]
    self_before = gpu_total(before, indices, "self_bytes")
    self_after = gpu_total(after, indices, "self_bytes")
    self_peak = peak_total(peaks, indices, "max_self_bytes", before, after, "self_bytes")
    jax_before = jax_after = jax_peak = None
    exact = False
    if device is not None:
        quick_before = _one_device(run.quick_before, device)
        quick_after = _one_device(run.quick_after, device)
        jax_before = quick_before.jax_in_use() if quick_before is not None else None
        jax_after = quick_after.jax_in_use() if quick_after is not None else None
        jax_peak, exact = block_jax_peak(
            quick_before, quick_after, peaks, indices, jax_before, jax_after
        )
    jax_retained = difference(jax_after, jax_before)
    self_retained = difference(self_after, self_before)
    if jax_peak is not None:
        peak, peak_source = jax_peak, "jax_exact" if exact else "jax_sampled"
    else:
        peak, peak_source = self_peak, "nvml_sampled" if self_peak is not None else None
    if jax_retained is not None:
        retained, retained_source = jax_retained, "jax"
    else:
        retained, retained_source = self_retained, "nvml" if self_retained is not None else None
    return {
        "nvml_index": index,
        "jax_device": getattr(device, "id", None),
        "peak": peak,
        "peak_source": peak_source,
        "retained": retained,
        "retained_source": retained_source,
        "jax_in_use_before": jax_before,
        "jax_in_use_peak": jax_peak,
        "jax_in_use_after": jax_after,
        "jax_retained": jax_retained,
        "peak_exact": exact,
        "gpu_self_before": self_before,
        "gpu_self_peak": self_peak,
        "gpu_self_after": self_after,
        "gpu_self_retained": self_retained,
    }


def _figures(run: _Run) -> dict[str, Any]:
    host_before = getattr(run.before, "host", None)
    host_after = getattr(run.after, "host", None)
    rss_before = getattr(host_before, "rss_bytes", None)
    rss_after = getattr(host_after, "rss_bytes", None)
    host = {
        "rss_before": rss_before,
        "rss_peak": extreme([getattr(run.peaks, "max_rss_bytes", None), rss_before, rss_after]),
        "rss_after": rss_after,
        "rss_retained": difference(rss_after, rss_before),
        "live_array_bytes_before": getattr(host_before, "live_array_bytes", None),
        "live_array_bytes_after": getattr(host_after, "live_array_bytes", None),
    }
    devices = {name: _device_figures(run, index, d) for name, index, d in _devices(run)}
    notes = list(run.notes)
    if run.after_state == "waiting":
        notes.append(_AFTER_WAITING)
    if run.quick_before is None and run.quick_after is not None:
        notes.append("JAX's backend started in the block: JAX's bytes before it are not counted")
    samples = getattr(run.peaks, "samples", 0)
    if samples == 0:
        notes.append("no sample fell inside the block: sampled peaks are its two ends")
    if devices:
        peak = {name: figures["peak"] for name, figures in devices.items()}
        retained = {name: figures["retained"] for name, figures in devices.items()}
    else:
        notes.append("no GPU seen: the host memory (RSS) of this process instead")
        peak, retained = {"host": host["rss_peak"]}, {"host": host["rss_retained"]}
    return {
        "duration_s": (run.ended_mono or run.started_mono) - run.started_mono,
        "samples": samples,
        "sampler": run.origin,
        "error": run.error,
        "peak": peak,
        "retained": retained,
        "devices": devices,
        "host": host,
        "notes": notes,
    }


def _summary(figures: dict[str, Any]) -> str:
    """One line: ``track: 1.23 s — gpu:0 peak 3.10 GiB (JAX, exact), retained +512 MiB``."""
    parts = []
    sources = {n: d["peak_source"] for n, d in figures["devices"].items()}
    for name, peak in figures["peak"].items():
        source = sources.get(name, "host_rss_sampled" if peak is not None else None)
        label = f" ({_LABELS[source]})" if source else ""
        retained = format_bytes_delta(figures["retained"][name])
        parts.append(f"{name} peak {format_bytes(peak)}{label}, retained {retained}")
    line = f"track: {format_duration(figures['duration_s'])} — " + "; ".join(parts)
    if figures["error"]:
        line += f" — raised {figures['error']}"
    if figures["notes"]:
        count = len(figures["notes"])
        line += f" ({count} note{'s' if count > 1 else ''} in .to_dict())"
    return line
