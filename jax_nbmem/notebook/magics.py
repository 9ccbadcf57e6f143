"""IPython glue: the ``%jaxalloc`` and ``%jaxmem`` magics and the cell event callbacks.

Thin by design: parse, hand over to `KernelSession`, print what it says. Callbacks never raise
into a user's cell (IPython would print a traceback after every cell).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
from collections.abc import Callable

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from jax_nbmem.allocator.modes import ModeError, mode_forms
from jax_nbmem.notebook import cli_magic
from jax_nbmem.notebook.cli_magic import CliMagics
from jax_nbmem.notebook.help_texts import HelpedMagic, written_on_demand
from jax_nbmem.notebook.session import KernelSession
from jax_nbmem.notebook.settings import JaxNbMem
from jax_nbmem.notebook.shell_errors import code_location, drop_last_error, last_error_holders
from jax_nbmem.tenants.owners import SHUTDOWN_BOTH, SHUTDOWN_DRY_RUN, SHUTDOWN_YES
from jax_nbmem.text import parse_count, parse_number, printable
from jax_nbmem.tools.compare import DEFAULT_TIMEOUT_S

__all__ = ["JaxNbMemMagics", "load", "unload"]

log = logging.getLogger("jax_nbmem")

_loaded: dict[int, tuple[JaxNbMemMagics, dict, CliMagics]] = {}

# Which %jaxmem commands take which option.
_JAXMEM_OPTIONS = {
    "--json": ("status", "cells"),
    "--yes": ("shutdown",),
    "--dry-run": ("shutdown",),
    "--clear-caches": ("free",),
    "--last-error": ("free",),
    "--csv": ("cells",),
}
_JAXMEM_USAGE = (
    "usage: %jaxmem [COMMAND], COMMAND one of: panel [auto | widget | cells | static | text] "
    "(the default), status [--json], "
    "cells [--json | --csv PATH], top [N], free NAME... [--clear-caches], free --last-error, "
    "fit [--shapes] [--start] [--json] CALL, shutdown PID [--yes | --dry-run]"
)
_FIT_OPTIONS = ("--shapes", "--start", "--json")


def _usage(magic: str) -> str:
    """The magic's valid forms; the modes are those the installed jaxlib accepts."""
    if magic == "jaxmem":
        return _JAXMEM_USAGE
    return (
        "usage: %jaxalloc [MODE], MODE one of: "
        f"{', '.join(mode_forms())} (F: 0 < F <= 1); "
        "as a cell magic: %%jaxalloc compare [MODES...] [--timeout S]"
    )


# A compare run longer than a day is a typo, not a plan.
_MAX_TIMEOUT_S = 86_400.0
_MAX_TOP_ROWS = 100_000


def _refuse(magic: str, message: str) -> UsageError:
    """A UsageError that says what is wrong, then the magic's valid forms."""
    return UsageError(f"{message}\n{_usage(magic)}")


def _parse(magic, line: str):
    """Every magic's arguments, read by one function: any error is a UsageError with the usage.

    Unbalanced quotes and stray backslashes (``shlex``), unknown options, and bad values of
    typed options all end here, so nothing but a UsageError reaches the user's cell, and
    nothing has been changed yet when it does.
    """
    name = magic.__name__
    try:
        return parse_argstring(magic, line)
    except UsageError as exc:
        raise _refuse(name, f"%{name}: {printable(exc)}") from None
    except ValueError as exc:  # shlex: "No closing quotation", "No escaped character"
        raise _refuse(name, f"%{name}: cannot read the arguments ({printable(exc)})") from None


def _timeout(text: str) -> float:
    """Argparse type for ``--timeout``: plain positive seconds, at most a day."""
    try:
        return parse_number(text, "--timeout", low=0.0, high=_MAX_TIMEOUT_S)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _never_raise(callback):
    """Log, never propagate: an exception here would follow every cell the user runs.

    BaseException too: a KeyboardInterrupt that lands in our callback (the user pressed
    Interrupt at that moment) would otherwise print a traceback from jax_nbmem's code.
    IPython runs the cell regardless, so swallowing it loses nothing.
    """

    @functools.wraps(callback)
    def guarded(*args, **kwargs):
        try:
            callback(*args, **kwargs)
        except BaseException:
            _failed(callback.__name__)

    return guarded


def _failed(name: str) -> None:
    """Log the exception being handled at debug level; never raises."""
    try:
        log.debug("jax_nbmem: %s failed", name, exc_info=True)
    except BaseException:  # a second interrupt while logging: still nothing escapes
        pass


def _execution_count_reader(shell) -> Callable[[], int | None]:
    """A cheap way to read ``shell.execution_count`` before every cell.

    The trait's descriptor costs ten times a look in traitlets' own table of values, which
    is read when it holds the count (it does once the count is set, as IPython does at its
    start); else the trait itself.
    """
    values = getattr(shell, "_trait_values", None)
    if not isinstance(values, dict) or values.get("execution_count") is None:
        return lambda: shell.execution_count
    # A partial of a C method: the read costs a cell no Python frame. The post-cell hook
    # takes the count from IPython's result anyway, which wins over this one.
    return functools.partial(values.get, "execution_count")


@magics_class
class JaxNbMemMagics(Magics):
    """The magics of jax_nbmem; all state lives in `self.session`."""

    def __init__(self, shell, session: KernelSession) -> None:
        super().__init__(shell)
        self.session = session

    @magic_arguments()
    @argument(
        "mode",
        nargs="*",
        help="on | off | fraction F | platform | bfc | cuda_async | default "
        "(| vmm from jaxlib 0.10, | address from 0.11). Omit it for a report. "
        "As a cell magic: compare [MODES...].",
    )
    @argument(
        "--timeout",
        type=_timeout,
        default=None,
        help="%%%%jaxalloc compare only: seconds each mode may run "
        f"(default {DEFAULT_TIMEOUT_S:g})",
    )
    @line_cell_magic
    def jaxalloc(self, line: str = "", cell: str | None = None) -> None:
        """%jaxalloc [MODE]: choose JAX's GPU allocator mode before the backend starts.

        Put it in the first cell, right after ``%load_ext jax_nbmem``; JAX reads these settings
        once, when it first uses the device.

        Modes:
          on           JAX's default: preallocate 75% of GPU memory at start
          off          no preallocation: allocate on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false)
          fraction F   preallocate F of total GPU memory, 0 < F <= 1
          platform     allocate exactly what arrays need and free it again (slow)
          bfc, cuda_async, default, vmm, address
                       XLA_PYTHON_CLIENT_ALLOCATOR, as far as the installed jaxlib accepts it

        With no mode: report the mode requested, the variables in effect, whether JAX's backend
        has started and with which mode. Once it has started, a new mode cannot take effect in
        this kernel; you are told how to get it (restart, or a kernel that starts in that mode:
        ``jax-nbmem kernel install --allocator MODE``).

        %%jaxalloc compare [MODES...] [--timeout S]: run the cell once per mode (default: on off
        platform), each in a fresh Python process on the same GPU(s), one at a time, and report
        per mode the wall time, JAX's peak bytes in use, the peak GPU memory the process held
        (NVML), out-of-memory, and the largest free block against free memory; a bar chart and
        a one-line recommendation follow. The cell must be self-contained: import and define
        everything it uses inside the cell. Interrupting the kernel stops the subprocess.
        """
        args = _parse(self.jaxalloc, line)
        words = args.mode
        if cell is not None:
            if not words or words[0] != "compare":
                raise _refuse("jaxalloc", "%%jaxalloc is a cell magic only as %%jaxalloc compare")
            timeout = DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout
            self._compare(cell, words[1:], timeout)
            return
        if words and words[0] == "compare":
            raise _refuse("jaxalloc", "compare runs a cell: use %%jaxalloc compare as a cell magic")
        if args.timeout is not None:
            raise _refuse("jaxalloc", "%jaxalloc: --timeout is for %%jaxalloc compare")
        if not words:
            print(self.session.allocator_report())
            return
        try:
            _, message = self.session.request(" ".join(words))
        except ModeError as exc:
            raise UsageError(f"%jaxalloc: {printable(exc)}") from None  # names the modes
        print(message)

    def _compare(self, cell: str, modes: list[str], timeout_s: float) -> None:
        from jax_nbmem.tools.compare.report import compare_figure, format_compare
        from jax_nbmem.tools.compare.run import CompareError, run_compare

        def progress(mode: str, state: str) -> None:
            print(f"{mode}: {state}", flush=True)

        try:
            result = run_compare(cell, modes, timeout_s=timeout_s, on_progress=progress)
        except (ModeError, CompareError, ValueError) as exc:
            raise _refuse("jaxalloc", f"%%jaxalloc compare: {printable(exc)}") from None
        print(format_compare(result))
        # Plotly's own mime type, with no renderer of plotly's in between: frontends that know
        # it draw the chart, the others (a terminal, nbconvert to text) show one line.
        figure = compare_figure(result)
        bundle = {
            "application/vnd.plotly.v1+json": figure,
            "text/plain": f"<bar chart: {len(result.modes)} modes compared>",
        }
        display(bundle, raw=True)

    @magic_arguments()
    @argument(
        "command",
        nargs="?",
        default="panel",
        help="panel (default) | status | cells | top [N] | free NAME... | fit CALL | shutdown PID",
    )
    @argument("rest", nargs="*", help="arguments of the command")
    @argument("--json", action="store_true", help="status/cells: print JSON instead of a table")
    @argument("--csv", metavar="PATH", default=None, help="cells: write the records to PATH")
    @argument(
        "--last-error", action="store_true", help="free: release what the last error's frames hold"
    )
    @argument("--yes", action="store_true", help="shutdown: " + SHUTDOWN_YES.replace("%", "%%"))
    @argument(
        "--dry-run", action="store_true", help="shutdown: " + SHUTDOWN_DRY_RUN.replace("%", "%%")
    )
    @argument(
        "--clear-caches", action="store_true", help="free: also clear JAX's compilation caches"
    )
    @line_magic
    def jaxmem(self, line: str = "") -> None:
        """%jaxmem [COMMAND]: GPU memory of this kernel and of everyone else on its GPUs.

        Commands: panel (the default), status, cells, top, free, fit, shutdown. The help that
        ``%jaxmem?`` shows is written once, in ``help_texts``, when first asked for.
        """
        words = line.split(None, 1)
        if words and words[0] == "fit":  # a Python call follows: not for shlex/argparse
            self._fit(words[1] if len(words) > 1 else "")
            return
        args = _parse(self.jaxmem, line)
        run = {
            "panel": self._panel,
            "status": self._status,
            "cells": self._cells,
            "shutdown": self._shutdown,
            "top": self._top,
            "free": self._free,
        }.get(args.command)
        if run is None:
            raise _refuse("jaxmem", f"%jaxmem: unknown command {args.command!r}")
        for option, takes in _JAXMEM_OPTIONS.items():
            if getattr(args, option.lstrip("-").replace("-", "_")) and args.command not in takes:
                raise _refuse("jaxmem", f"%jaxmem {args.command}: {option} does not apply")
        run(args)

    def _no_more(self, args) -> None:
        if args.rest:
            extra = printable(" ".join(args.rest))
            raise _refuse("jaxmem", f"%jaxmem {args.command}: unexpected arguments: {extra}")

    def _panel(self, args) -> None:
        from jax_nbmem.notebook.panel import KINDS, show_panel

        kind = args.rest[0] if args.rest else None
        if len(args.rest) > 1 or (kind is not None and kind not in KINDS):
            wrong = printable(" ".join(args.rest))
            raise _refuse("jaxmem", f"%jaxmem panel: {wrong!r} is not one of {', '.join(KINDS)}")
        show_panel(self.session, kind)

    def _status(self, args) -> None:
        self._no_more(args)
        report = self.session.status()
        from jax_nbmem.tenants.status import format_status  # loaded when first asked

        text = format_status(report, self.session.own_name)
        print(json.dumps(report, indent=1) if args.json else text)

    def _cells(self, args) -> None:
        self._no_more(args)
        if args.json and args.csv:
            raise _refuse("jaxmem", "%jaxmem cells: --json or --csv PATH, not both")
        records = self.session.cells()
        if args.csv:
            from jax_nbmem.record.export import write_csv

            existed = os.path.exists(args.csv)
            try:
                count = write_csv(records, args.csv)
            except OSError as exc:
                raise UsageError(f"%jaxmem cells --csv: cannot write {args.csv}: {exc}") from None
            replaced = " (it replaced the file that was there)" if existed else ""
            print(f"wrote {count} cell record(s) to {os.path.abspath(args.csv)}{replaced}")
        elif args.json:
            print(json.dumps([record.to_dict() for record in records], indent=1))
        else:
            from jax_nbmem.notebook.panel_text import cells_table

            print(cells_table(self.session, records))

    def _top(self, args) -> None:
        from jax_nbmem.tools.arrays import top_arrays
        from jax_nbmem.tools.arrays_report import format_top

        if len(args.rest) > 1:
            raise UsageError("%jaxmem top: at most one number of rows, e.g. %jaxmem top 20")
        try:
            count = parse_count(args.rest[0], "rows", high=_MAX_TOP_ROWS) if args.rest else 10
        except ValueError as exc:
            raise UsageError(f"%jaxmem top: {exc}, e.g. %jaxmem top 20") from None
        print(format_top(top_arrays(self.shell.user_ns, count, frames=self._error_frames())))

    def _error_frames(self) -> list:
        """The frames the last error keeps: Python's ``sys.last_*`` and IPython's traceback."""
        from jax_nbmem.tools.last_error import error_frames

        return error_frames(last_error_holders(self.shell), self.session.where)

    def _free(self, args) -> None:
        from jax_nbmem.tools.arrays import free_names
        from jax_nbmem.tools.arrays_report import format_free

        if args.last_error:
            if args.rest or args.clear_caches:
                raise _refuse("jaxmem", "%jaxmem free --last-error takes no names or options")
            self._free_last_error()
            return
        if not args.rest:
            raise UsageError("%jaxmem free: name the variables to free, e.g. %jaxmem free x y")
        report = free_names(
            self.shell.user_ns,
            args.rest,
            clear_caches=args.clear_caches,
            frames=self._error_frames(),
        )
        if not report.any_valid:
            reasons = "; ".join(f"{o.name}: {o.reason}" for o in report.outcomes)
            raise UsageError(f"%jaxmem free: nothing to free ({reasons})")
        print(format_free(report))

    def _free_last_error(self) -> None:
        from jax_nbmem.tools.arrays_report import format_free_last_error
        from jax_nbmem.tools.last_error import free_last_error

        holders = last_error_holders(self.shell)
        error = next((h for h in holders if isinstance(h, BaseException)), None)
        if not any(holders):
            print(format_free_last_error(None, None))  # type: ignore[arg-type]
            return
        frames = self._error_frames()
        hold = self.session.error_hold
        name = type(error).__name__ if error is not None else "an error"
        if hold is not None and hold.cell is not None:
            name += f" of cell [{hold.cell}]"
        report = free_last_error(frames, self.shell.user_ns)
        del frames
        drop_last_error(self.shell)
        self.session.error_hold = None
        print(format_free_last_error(report, name))

    def _fit(self, text: str) -> None:
        from jax_nbmem.gpu import jaxstats
        from jax_nbmem.tools.fit import FitError
        from jax_nbmem.tools.fit_call import evaluate_call
        from jax_nbmem.tools.fit_report import check_fit

        words = text.split(None, 1)
        options: set[str] = set()
        while words and words[0].startswith("--"):
            if words[0] not in _FIT_OPTIONS:
                raise _refuse("jaxmem", f"%jaxmem fit: unknown option {printable(words[0])}")
            options.add(words[0])
            words = words[1].split(None, 1) if len(words) > 1 else []
        expression = " ".join(words)
        if not expression:
            raise _refuse(
                "jaxmem", "%jaxmem fit: give the call, e.g. %jaxmem fit step(state, batch)"
            )
        if "jax" not in sys.modules:
            raise UsageError(
                f"%jaxmem fit: JAX is not imported in {self.session.own_name}; import it first"
            )
        if not jaxstats.backend_initialized():
            pending = self.session.control.report().pending
            what = f"allocator mode {pending.mode_name}: {pending.describe()}"
            if "--start" not in options:
                raise UsageError(
                    "%jaxmem fit: compiling starts JAX's backend, which has not started yet; "
                    f"it would start with {what}. Set the mode first if you want another "
                    "(%jaxalloc), then add --start: %jaxmem fit --start "
                    f"{printable(expression)}"
                )
            print(f"Starting JAX's backend to compile the call, with {what}.", flush=True)
            import jax

            jax.devices()  # asked for with --start
        call = None
        try:
            call = evaluate_call(expression, self.shell.user_ns, shapes="--shapes" in options)
            report = check_fit(
                call.fn,
                call.args,
                call.kwargs,
                call=call.text,
                resident_from=call.originals,
                **self.session.fit_context(),
            )
        except FitError as exc:
            failure = str(exc)
        else:
            print(json.dumps(report.to_dict(), indent=1) if "--json" in options else report)
            return
        # Raised here, with the call let go: the UsageError becomes the last error, and its
        # frames must not keep the user's arrays (the call's arguments) alive.
        call = None
        raise UsageError(f"%jaxmem fit: {failure}")

    def _shutdown(self, args) -> None:
        example = "e.g. %jaxmem shutdown 4242 [--yes | --dry-run]"
        if args.yes and args.dry_run:
            raise UsageError(f"%jaxmem shutdown: {SHUTDOWN_BOTH}")
        if len(args.rest) != 1:
            raise UsageError(f"%jaxmem shutdown: give one PID, {example}")
        try:
            from jax_nbmem.tenants.attribution import PID_MAX

            pid = parse_count(args.rest[0], "the PID", high=PID_MAX)
        except ValueError as exc:
            raise UsageError(f"%jaxmem shutdown: {exc}, {example}") from None
        result = self.session.shutdown(pid, confirm=args.yes)
        print(printable(result.message))
        if not args.yes and result.how is not None:
            print(f"Run `%jaxmem shutdown {pid} --yes` to do it.")


def _settings_for(shell) -> JaxNbMem:
    """A fresh Configurable each load, so %reload_ext re-reads the shell's config.

    It joins the shell's configurables (in place of an earlier load's), so that
    ``%config JaxNbMem`` lists the settings and ``%config JaxNbMem.panel = "text"`` sets one.
    """
    settings = JaxNbMem(parent=shell, config=shell.config)
    configurables = getattr(shell, "configurables", None)
    if isinstance(configurables, list):
        configurables[:] = [c for c in configurables if not isinstance(c, JaxNbMem)]
        configurables.append(settings)
    return settings


def load(shell) -> None:
    """Register the magics and the cell callbacks (a second load is a no-op)."""
    if id(shell) in _loaded:
        return
    in_kernel = getattr(shell, "kernel", None) is not None
    session = KernelSession(_settings_for(shell), in_kernel=in_kernel)
    session.user_namespace = shell.user_ns
    session.where = code_location(shell)
    magics = JaxNbMemMagics(shell, session)
    shell.register_magics(magics)
    # Our own help: magic_arguments would open it with a "::" line and a usage line that
    # mixes the line and the cell magic's options. Written when first asked for.
    helps, registered = written_on_demand(in_kernel), shell.magics_manager.magics
    for kind in ("line", "cell"):
        for name, method in magics.magics.get(kind, {}).items():
            if name in ("jaxalloc", "jaxmem") and registered[kind].get(name) is method:
                registered[kind][name] = HelpedMagic(method, helps(name))
    cli = cli_magic.register(shell)  # %jaxnbmem, and !jax-nbmem lines without IPython's fork

    # The two callbacks run around every cell: the session writes them out in one function
    # each, their guard included, and they read the count from traitlets' table of values.
    pre_run_cell, post_run_cell = session.cell_callbacks(_execution_count_reader(shell), _failed)
    callbacks = {"pre_run_cell": pre_run_cell, "post_run_cell": post_run_cell}
    for event, callback in callbacks.items():
        shell.events.register(event, callback)
    _loaded[id(shell)] = (magics, callbacks, cli)
    session.apply_startup_mode()
    session.start()


def unload(shell) -> None:
    """Remove the callbacks and stop background work; the magics go with the extension."""
    entry = _loaded.pop(id(shell), None)
    if entry is None:
        return
    magics, callbacks, cli = entry
    cli_magic.unregister(shell, cli)
    for event, callback in callbacks.items():
        try:
            shell.events.unregister(event, callback)
        except ValueError:
            pass
    panel = sys.modules.get("jax_nbmem.notebook.panel")
    if panel is not None:
        _never_raise(panel.close_panels)(magics.session)
    magics.session.close()
    # IPython keeps registered magics; point them at nothing stale.
    for kind in ("line", "cell"):
        for name in list(magics.magics.get(kind, {})):
            shell.magics_manager.magics[kind].pop(name, None)
    shell.magics_manager.registry.pop(type(magics).__name__, None)


def session_of(shell) -> KernelSession | None:
    """The loaded extension's session for ``shell``, or None when it is not loaded."""
    entry = _loaded.get(id(shell))
    return entry[0].session if entry else None
