"""``jax-nbmem shutdown PID``: stop a kernel, another user's too for an administrator.

Who may: the kernel's owner; root; anyone with a hub API token whose scopes reach the owner's
server (:data:`~jax_nbmem.cli.hubapi.SCOPES`). How: through the kernel's Jupyter server, so
that the server does not restart it; otherwise, for root or the owner, SIGTERM then SIGKILL of
the very PID named. It then says what came free on the GPUs, and logs each stop of another
user's kernel (who, which kernel, whose, bytes, when) as a JSON line in the administrators' log.

With someone else's authority (root, a hub token) whose kernel it is and which server is
asked come from facts the kernel could not write (:mod:`jax_nbmem.agent.facts`), never from
its claims (its beacon, ``$JUPYTERHUB_USER``, ``$JPY_PARENT_PID``, its command line):

- the hub user: :func:`~jax_nbmem.agent.facts.owner_of` (the Unix user on a plain host; a
  pod's annotation or a rootful runtime's record of a container); none proven: the hub is
  not asked; on a plain host, the hub's record of the user's server matched to host facts
  where it shows one (:mod:`jax_nbmem.cli.hubowner`: hubs whose Unix names differ);
- the server: through the hub, that user's server as the hub records it (of a user's default
  and named servers, the one whose own list has the kernel); without a hub, the
  kernel's real ancestor that is a Jupyter server
  (:func:`~jax_nbmem.agent.authority.parent_server`);
- the kernel id: its claim, used only with that server, and only once that server's own
  ``api/kernels`` lists it;
- a claim that contradicts a fact (another hub user, a ``JPY_PARENT_PID`` that is no ancestor,
  a beacon's kernel id that its command line does not name): nothing is done, and the
  refusal names the contradiction.

A kernel in a container (a PID namespace of its own), seen from the host: its kernel id comes
only from what the node agent proved (:mod:`jax_nbmem.agent.hostproof`); without that proof
the hub is not asked, and root stops the very host PID it named with signals.

The caller's own kernels through its own hub server (``$JUPYTERHUB_SERVICE_URL``) act with its
own token, which reaches its own server only: that server's list decides, as above.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from jax_nbmem.agent.authority import listed_by, parent_server
from jax_nbmem.agent.facts import FactError, ProvenKernelId, ProvenProcess, ProvenServer
from jax_nbmem.agent.facts import disagreements as _disagreements
from jax_nbmem.cli.hubapi import SCOPES_TEXT, Hub, HubError, OwnServer
from jax_nbmem.cli.hubowner import prove_hub_user
from jax_nbmem.cli.stop_target import Kernel, StopError, find
from jax_nbmem.node.servers import current_user, terminate
from jax_nbmem.rootfiles import append_line
from jax_nbmem.tenants.owners import hub_user_of, may_stop_others
from jax_nbmem.units import format_bytes

__all__ = [
    "ENV_ADMIN_LOG", "Kernel", "Plan", "StopError", "Stopped", "admin_log_path", "find", "plan",
    "stop", "whose",
]  # fmt: skip

ENV_ADMIN_LOG = "JAX_NBMEM_ADMIN_LOG"
_EXIT_WAIT_S = 15.0


@dataclass
class Stopped:
    """What ``stop`` did: how, through which server, and what came free per GPU."""

    kernel: Kernel
    how: str  # "server" or "signal"
    server: str | None
    freed: dict[int, int | None]  # GPU index -> bytes free after minus before (None: unread)
    free_after: dict[int, int | None]
    message: str


@dataclass(frozen=True)
class Plan:
    """How a kernel will be stopped, from proven facts only (the types are checked).

    ``how``: "server" or "signal"; ``by``: whose word the server takes: "own" (the caller's
    own hub server and its token), "hub" (an administrator's hub token), "runtime" (the
    proven parent server's runtime file), "signal". ``kernel_id``: listed by ``url``'s server.
    """

    how: str
    url: str | None
    by: str
    process: ProvenProcess | None = None
    kernel_id: ProvenKernelId | None = None
    server: ProvenServer | None = None

    def __post_init__(self) -> None:
        for value, kind in ((self.process, ProvenProcess), (self.kernel_id, ProvenKernelId),
                            (self.server, ProvenServer)):  # fmt: skip
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"a plan takes a {kind.__name__}, not {type(value).__name__}")
        if self.how == "server" and self.kernel_id is None:
            raise TypeError("a server is asked only for a kernel id its own list has")


def _gpu_free() -> dict[int, int | None]:
    from jax_nbmem.gpu import nvml

    return {gpu.index: gpu.free_bytes for gpu in nvml.gpus()}


def _gpu_names() -> dict[int, str]:
    """Each GPU's name for people: "GPU 0", "MIG 3g.71gb instance 1 of GPU 0"."""
    from jax_nbmem.gpu import nvml

    return {gpu.index: gpu.label for gpu in nvml.gpus()}


def _wait_gone(kernel: Kernel, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            process = psutil.Process(kernel.pid)
            if kernel.started_at is not None and abs(process.create_time() - kernel.started_at) > 1:
                return True  # the PID is another process's now
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def whose(kernel: Kernel, own_server: OwnServer | None = None) -> tuple[bool, str]:
    """Whether ``kernel`` is the caller's, and who the caller is, in the words of a refusal.

    The hub user decides where both sides' are known (the kernel's from its beacon or
    environment, the caller's own server's or ``$JUPYTERHUB_USER``): in a hub whose servers
    run in containers every Unix user may be ``jovyan``. Else the Unix user does.
    """
    me = current_user()
    own_hub = own_server.user if own_server is not None else hub_user_of(os.environ)
    if kernel.hub_user and own_hub:
        unix = f" (Unix user {me})" if me and me != own_hub else ""
        return kernel.hub_user == own_hub, f"you are hub user {own_hub}{unix}"
    # A container's user name is the container's: the same name on the host is someone else.
    mine = kernel.user is not None and kernel.user == me and kernel.user_source is None
    return mine, f"you are user {me}"


def _refuse_contradictions(kernel: Kernel, through_hub: bool) -> None:
    """StopError naming each claim that contradicts a fact (see the module)."""
    if kernel.process is None:
        return
    found = _disagreements(kernel.process, kernel.proven_owner, kernel.claimed, kernel.ancestors,
                           through_hub=through_hub)  # fmt: skip
    if found:
        raise StopError(
            f"{kernel.label()}: its claims contradict what the host proves: {'; '.join(found)}; "
            f"nothing done (to stop this very process regardless, signal it: kill {kernel.pid})."
        )


def plan(
    kernel: Kernel, hub: Hub | None, own_server: OwnServer | None = None
) -> tuple[str, str | None, str]:
    """How ``kernel`` would be stopped: ("server", its URL, by) or ("signal", None, "signal").

    ``by`` as :class:`Plan` says. StopError when this caller may not stop it, the facts do
    not allow it, or the hub refuses.
    """
    chosen = _plan(kernel, hub, own_server)
    return chosen.how, chosen.url, chosen.by


def _plan(kernel: Kernel, hub: Hub | None, own_server: OwnServer | None) -> Plan:
    mine, you = whose(kernel, own_server)
    if mine and own_server is not None:
        kernel_id = _listed(kernel, own_server.url, own_server.kernel_ids)
        return Plan("server", own_server.url, "own", kernel.process, kernel_id)
    if hub is not None:
        return _through_hub(kernel, hub, mine, you)
    if not (mine or may_stop_others()):
        raise StopError(
            f"PID {kernel.pid} is a kernel of {kernel.owner}, not yours ({you}): only its owner "
            f"or an administrator (root, or a hub API token with {SCOPES_TEXT}: --hub-url and "
            "$JUPYTERHUB_API_TOKEN) can stop it; nothing done."
        )
    _refuse_contradictions(kernel, through_hub=False)
    if kernel.process is None or kernel.pid_in_container is not None:
        return Plan("signal", None, "signal", kernel.process)  # the very PID named
    try:
        server = parent_server(kernel.process)
    except FactError:
        return Plan("signal", None, "signal", kernel.process)  # under no server: its PID
    if not kernel.kernel_id:
        return Plan("signal", None, "signal", kernel.process)
    try:
        kernel_id = listed_by(server, kernel.kernel_id)
    except FactError as error:
        raise StopError(f"{kernel.label()}: {error}; nothing done.") from None
    return Plan("server", server.url, "runtime", kernel.process, kernel_id, server)


def _through_hub(kernel: Kernel, hub: Hub, mine: bool, you: str) -> Plan:
    """Through the proven owner's server as the hub records it (see the module)."""
    if kernel.proven is False:
        raise StopError(
            f"{kernel.label()} runs in a container and the node agent has not proven "
            "which kernel it is (its kernel id and hub user would be its own claims), so "
            "its server is not asked; root can stop this very PID without --hub-url; "
            "nothing done."
        )
    if kernel.proven_owner is None:
        raise StopError(
            f"{kernel.label()}: whose it is cannot be proven ({kernel.owner_reason}); what it "
            "claims is not enough to ask the hub for a server; nothing done."
        )
    prove_hub_user(kernel, hub)  # where its Unix user is not named like its hub user
    _refuse_contradictions(kernel, through_hub=True)
    _known_id(kernel)
    name = kernel.proven_owner.name
    try:
        urls = hub.servers(name)
    except HubError as error:
        if mine:
            raise StopError(f"{error}; nothing done.") from None
        answer = (
            "the hub refused this token" if error.refused
            else "the hub did not answer" if error.no_answer
            else "the hub did not give its server"
        )  # fmt: skip
        raise StopError(
            f"PID {kernel.pid} is a kernel of {kernel.owner}, not yours ({you}), and "
            f"{answer}: {error}; nothing done."
        ) from None
    if len(urls) == 1:
        (url,) = urls.values()
        return Plan("server", url, "hub", kernel.process,
                    _listed(kernel, url, lambda: hub.kernel_ids(url)))  # fmt: skip
    url, kernel_id = _listed_by_one(kernel, list(urls.values()), hub.kernel_ids)
    return Plan("server", url, "hub", kernel.process, kernel_id)


def _listed_by_one(kernel: Kernel, urls: list[str], kernel_ids) -> tuple[str, ProvenKernelId]:
    """The one of a hub user's servers (default and named) whose own list has the kernel.

    Each is the proven owner's as the hub records it, so the one that lists the kernel's id
    is its server; a server that cannot be asked is said only where no other lists it.
    """
    kernel_id = _known_id(kernel)
    faults = []
    for url in urls:
        try:
            if kernel_id in kernel_ids(url):
                return url, ProvenKernelId(kernel_id, url)
        except HubError as error:
            faults.append(str(error))
    said = f" ({'; '.join(faults)})" if faults else ""
    raise StopError(
        f"{kernel.label()}: kernel {kernel_id} is not on the list of any of the servers of "
        f"its hub user ({', '.join(urls)}){said}, so none is asked; nothing done."
    )


def _listed(kernel: Kernel, url: str, kernel_ids) -> ProvenKernelId:
    """The kernel's id once the server at ``url`` lists it (``kernel_ids()``: its list)."""
    kernel_id = _known_id(kernel)
    try:
        listed = kernel_ids()
    except HubError as error:
        raise StopError(f"{kernel.label()}: {error}; nothing done.") from None
    if kernel_id not in listed:
        raise StopError(
            f"{kernel.label()}: kernel {kernel_id} is not on the list of the server {url} "
            "(another server's kernel, or a claim), so it is not asked; nothing done."
        )
    return ProvenKernelId(kernel_id, url)


def _known_id(kernel: Kernel) -> str:
    if not kernel.kernel_id:
        raise StopError(
            f"{kernel.label()}: its kernel id is unknown (no beacon, and its command line "
            "names no kernel-<id>.json), so its server cannot be asked; nothing done."
        )
    return kernel.kernel_id


def stop(
    kernel: Kernel,
    hub: Hub | None,
    *,
    dry_run: bool = False,
    log_path: Path | None = None,
    own_server: OwnServer | None = None,
) -> Stopped:
    """Stop ``kernel`` (see the module); StopError when nothing could be stopped.

    ``own_server``: the caller's own hub server (its own kernels go through it).
    """
    chosen = _plan(kernel, hub, own_server)
    how, server_url = chosen.how, chosen.url
    via = f"through its Jupyter server {server_url}" if how == "server" else "with SIGTERM"
    if dry_run:
        names = _gpu_names()
        held = ", ".join(
            f"{format_bytes(b)} on {names.get(g, f'GPU {g}')}" for g, b in kernel.gpu_bytes.items()
        )
        message = f"Would stop {kernel.label()} {via}" + (f"; it holds {held}" if held else "")
        return Stopped(kernel, how, server_url, {}, {}, message + ". Nothing done (--dry-run).")
    before = _gpu_free()
    if chosen.process is not None and not chosen.process.still_running():
        raise StopError(f"{kernel.label()} exited meanwhile; nothing done.")
    if not psutil.pid_exists(kernel.pid):
        raise StopError(f"{kernel.label()} exited meanwhile; nothing done.")
    message = _act(chosen, kernel, hub, own_server) or f"Stopped {kernel.label()} {via}."
    after = _gpu_free()
    freed = {
        g: None if after.get(g) is None or before.get(g) is None else after[g] - before[g]
        for g in kernel.gpu_bytes
    }
    names = _gpu_names()
    for gpu in sorted(freed):
        came = freed[gpu]
        message += (
            f" {names.get(gpu, f'GPU {gpu}')}: it held {format_bytes(kernel.gpu_bytes[gpu])}; "
            + (f"{format_bytes(max(came, 0))} came free" if came is not None else "free unread")
            + (f", {format_bytes(after[gpu])} free now." if after.get(gpu) is not None else ".")
        )
    if not kernel.gpu_bytes:
        message += " It held no GPU memory."
    if how == "signal":
        message += " Its Jupyter server may restart it, without its memory until it runs JAX."
    stopped = Stopped(kernel, how, server_url, freed, after, message)
    if chosen.by == "hub" or not whose(kernel, own_server)[0]:
        _log(stopped, hub if chosen.by == "hub" else None, log_path)
    return stopped


def _act(chosen: Plan, kernel: Kernel, hub: Hub | None, own_server: OwnServer | None) -> str:
    """Do what ``chosen`` says; the signal's own message, or "" (StopError: nothing done)."""
    if chosen.how == "server":
        kernel_id = chosen.kernel_id.kernel_id
        try:
            if chosen.by == "own":
                own_server.shutdown_kernel(kernel_id)
            elif chosen.by == "hub":
                hub.shutdown_kernel(chosen.url, kernel_id)
            else:
                chosen.server.server.request("DELETE", f"api/kernels/{kernel_id}", 15.0)
        except (HubError, OSError) as error:
            raise StopError(f"{error}; nothing done.") from None
        if not _wait_gone(kernel, _EXIT_WAIT_S):
            raise StopError(
                f"{chosen.url} accepted the shutdown of {kernel.label()}, but the process was "
                f"still running {_EXIT_WAIT_S:g} s later"
            )
        return ""
    result = terminate(kernel.pid, kernel.started_at, 5.0, kernel.label())
    if not result.done:
        raise StopError(result.message)
    return result.message


def admin_log_path() -> Path:
    """``$JAX_NBMEM_ADMIN_LOG``, else /var/log/jax_nbmem/admin.log for root, else the user's."""
    if os.environ.get(ENV_ADMIN_LOG):
        return Path(os.environ[ENV_ADMIN_LOG])
    if may_stop_others():
        return Path("/var/log/jax_nbmem/admin.log")
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "jax_nbmem" / "admin.log"


def _log(stopped: Stopped, hub: Hub | None, log_path: Path | None) -> None:
    """One JSON line per administrator's stop; a log that cannot be written is said."""
    kernel = stopped.kernel
    entry = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "by": current_user(),
        "by_hub": hub.url if hub is not None else None,
        "action": "shutdown",
        "how": stopped.how,
        "server": stopped.server,
        "freed_bytes": {str(g): b for g, b in stopped.freed.items()},
        **{k: v for k, v in asdict(kernel).items() if k != "gpu_bytes"},
        "gpu_bytes": {str(g): b for g, b in kernel.gpu_bytes.items()},
    }
    path = log_path or admin_log_path()
    try:
        append_line(path, json.dumps(entry) + "\n")  # never through a link, nor in others' folders
        stopped.message += f" Logged in {path}."
    except OSError as error:
        stopped.message += f" (Not logged: cannot write {path}: {error.strerror or error}.)"
