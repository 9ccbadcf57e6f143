"""A host kernel's hub user, from the hub's own records, for root's stop and the culler.

On a plain host the proven owner of a kernel is its Unix user (:func:`~jax_nbmem.agent.facts.
owner_of`), and the hub was asked for the server of the hub user of that name. Where a
spawner runs hub users as Unix users of other names (TLJH: hub user ``alice`` as
``jupyter-alice``; SystemdSpawner's ``username_template``; a custom spawner), that name is no
hub user's, or someone else's. :func:`prove_hub_user` asks the hub for its record of the hub
user the kernel claims (else of its Unix user's name) and believes it only where the host
proves what the record names (:mod:`jax_nbmem.agent.hubrecord`: the spawner's PID as a real
ancestor, or its systemd unit as the kernel's cgroup):

- proven: the kernel's owner is that hub user (``is_hub_user``), whatever its Unix name;
- the record contradicts the host (another hub user's server; a Unix user named like another
  person's hub user): nothing is done, and the refusal says which fact disagrees;
- the hub shows no spawner state (a token without :data:`STATE_SCOPE`) or one this host cannot
  check: where the Unix user's name is the hub user's, as before (that name stands for the
  hub user); where it differs, nothing is done, and the refusal names the scope.

The scope is the least of the hub's that shows a spawner's state: the hub's REST API has no
request that writes one, so ``admin:server_state`` (whose name says "read and write") only
adds ``state`` to the server models the token already reads. The other ways were weighed:
the server's own token, read from its start environment, would make root act with a user's
credential and count as that user's activity at the hub; the proxy's table (scope ``proxy``)
lets a token rewrite the routes; listing every user (``list:users``) is not needed, since the
claim only selects which record is checked.
"""

from __future__ import annotations

import urllib.parse

from jax_nbmem.agent.facts import FactError, ProvenOwner
from jax_nbmem.agent.hubrecord import prove_record, server_records
from jax_nbmem.cli.hubapi import Hub, HubError
from jax_nbmem.cli.stop_target import Kernel, StopError
from jax_nbmem.text import printable

__all__ = ["STATE_SCOPE", "prove_hub_user"]

STATE_SCOPE = "admin:server_state"


def prove_hub_user(kernel: Kernel, hub: Hub) -> None:
    """Set ``kernel``'s proven owner to its hub user where the hub's records prove it.

    StopError where they contradict it, or cannot prove a claimed hub user that is not its
    Unix user's name (see the module). A kernel in a container (its runtime's record names
    its hub user) or whose process or Unix user is unproven is left as it is.
    """
    process, owner = kernel.process, kernel.proven_owner
    if process is None or owner is None or owner.is_hub_user:
        return
    if process.namespaced or process.container is not None:
        return
    unix = owner.name
    name = kernel.claimed.hub_user or unix
    try:
        model = hub.request(
            "GET", f"{hub.api_url}/users/{urllib.parse.quote(name, safe='')}",
            f"hub user {printable(name)}",
        )  # fmt: skip
        records = server_records(model, name)
    except (HubError, FactError) as error:
        if name == unix:
            return  # as before: asking for that user's server says what the hub answers
        raise _refusal(kernel, name, f"the hub's record of it is unreadable: {error}") from None
    checkable = [r for r in records if r.has_state and (r.pid or r.unit)]
    if not checkable:
        if name == unix:
            return  # nothing the host can check: the Unix user stands for the hub user
        raise _refusal(kernel, name, _unprovable(records, name))
    reasons = []
    for record in checkable:
        try:
            source = prove_record(process, kernel.ancestors, record)
        except FactError as error:
            reasons.append(str(error))
            continue
        kernel.proven_owner = ProvenOwner(name, source, is_hub_user=True)
        kernel.hub_user = name
        return
    raise _refusal(kernel, name, "; ".join(reasons))


def _unprovable(records: list, name: str) -> str:
    shown = printable(name)
    if not records:
        return f"hub user {shown} has no running server"
    if not any(r.has_state for r in records):
        return (
            f"the hub shows the spawner's record of {shown}'s server only to a token with the "
            f"scope {STATE_SCOPE}, which this one lacks"
        )
    return (
        f"the hub's record of {shown}'s server names neither a PID nor a systemd unit, so "
        "nothing on this host can be matched to it"
    )


def _refusal(kernel: Kernel, name: str, why: str) -> StopError:
    unix = kernel.proven_owner.name if kernel.proven_owner else "?"
    if name == unix:
        said = (f"the hub's records contradict what the host proves: it runs as Unix user "
                f"{printable(unix)}, and the hub's record of hub user {printable(name)} does "
                f"not prove it theirs: {why}")  # fmt: skip
    else:
        said = (f"its claims contradict what the host proves: it claims hub user "
                f"{printable(name)}, but it runs as Unix user {printable(unix)}, whose server "
                f"the hub is asked for, and the hub's records do not prove it "
                f"{printable(name)}'s: {why}")  # fmt: skip
    return StopError(
        f"{kernel.label()}: {said}; nothing done (to stop this very process regardless, "
        f"signal it: kill {kernel.pid})."
    )
