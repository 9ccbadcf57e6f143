"""What the sidebar offers to shut down: the panel's offer, decided by the server.

The notebook panel offers a button for each kernel that a ``blocking-preallocation`` warning
names, and its click goes through ``%jaxmem shutdown``'s path
(:func:`jax_nbmem.node.servers.shutdown_kernel`): the PID must be a Jupyter kernel of this
user among the GPU's processes, started when the report saw it (a reused PID is left alone), and
it is stopped through the Jupyter server that runs it, else by signal. The sidebar once offered
a button for every kernel of its own server instead, a harmless one included, and none for the
same user's blocking kernel of another server (issue 49).

Here each blocking process gets a ``shutdown_offer``: ``offered``, ``how`` (``this server``:
this server's own kernel, stopped by its kernel manager; ``server``: through the Jupyter server
that runs it; ``signal``) and ``why`` (the dry run's words, or why it cannot be offered: another
user's kernel, another container's, not a kernel). Only processes a warning names get one: a
harmless kernel is never offered in a blocking one's place.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from jax_nbmem.node.servers import shutdown_kernel

__all__ = ["THIS_SERVER", "blocking_pids", "shutdown_offers"]

log = logging.getLogger("jax_nbmem")

THIS_SERVER = "this server"
_BLOCKING = "blocking-preallocation"


def blocking_pids(report: Mapping[str, Any]) -> list[int]:
    """The PIDs the report's ``blocking-preallocation`` warnings name, in order."""
    pids = {w.get("pid") for w in report.get("warnings") or [] if w.get("kind") == _BLOCKING}
    return sorted(pid for pid in pids if isinstance(pid, int))


def shutdown_offers(
    report: Mapping[str, Any], tenants: Iterable[Any], own: Mapping[int, Mapping[str, Any]]
) -> dict[int, dict[str, Any]]:
    """Each blocking PID's offer (see the module); *own*: this server's kernels by host PID.

    Runs the shutdown's dry run (no I/O on the server's event loop: the monitor's worker
    thread calls this); never raises.
    """
    tenants = list(tenants)
    offers: dict[int, dict[str, Any]] = {}
    for pid in blocking_pids(report):
        kernel = own.get(pid)
        if kernel is not None:
            notebook = kernel.get("notebook")
            label = f"kernel PID {pid}" + (f" ({notebook})" if notebook else "")
            why = f"Would shut down {label}, a kernel of this Jupyter server; nothing done yet."
            offers[pid] = {"offered": True, "how": THIS_SERVER, "why": why}
            continue
        try:
            outcome = shutdown_kernel(pid, tenants, confirm=False)
        except Exception as exc:  # said, never raised into the monitor
            log.debug("jax_nbmem: no shutdown offer for PID %d", pid, exc_info=True)
            offers[pid] = {"offered": False, "how": None, "why": f"{type(exc).__name__}: {exc}"}
            continue
        offered = outcome.how is not None
        offers[pid] = {"offered": offered, "how": outcome.how, "why": outcome.message}
    return offers
