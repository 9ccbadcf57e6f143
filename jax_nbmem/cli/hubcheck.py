"""What the hub says of the culler's token before its first round: who it is, its scopes.

``GET /hub/api/user`` with the token answers with the token's owner (a service or a user)
and, on JupyterHub 3 and later, the token's scopes, expanded as the hub checks them (a role
with ``admin:servers`` shows ``read:servers`` too). The culler needs :data:`SCOPES` unfiltered
(a ``read:servers!user=alice`` finds only alice's server); :data:`STATE_SCOPE` only where a
spawner runs hub users under other Unix names (:mod:`jax_nbmem.cli.hubowner`).

The words tell apart a hub that does not answer (nothing listens, a name that does not
resolve, TLS, a timeout) from one that refuses the token (401, 403) and from one that knows
the token but not its scopes; each says what to do next.
"""

from __future__ import annotations

from dataclasses import dataclass

from jax_nbmem.cli.hubapi import SCOPES, SCOPES_TEXT, Hub, HubError
from jax_nbmem.cli.hubowner import STATE_SCOPE

__all__ = ["TokenCheck", "check_token"]

_ROLE_FIX = (
    "give the culler's service a role with these scopes in jupyterhub_config.py "
    "(c.JupyterHub.load_roles, as docs/jupyterhub_config.py has it) and restart the hub"
)


@dataclass(frozen=True)
class TokenCheck:
    """The hub's answer about the token: ``ok`` when it may do what the culler needs."""

    ok: bool
    words: str  # one clause for the start line
    missing: tuple[str, ...] = ()  # needed scopes it lacks, as SCOPES names them
    no_answer: bool = False  # the hub did not answer at all
    refused: bool = False  # the hub answered that it does not know the token (401, 403)

    @property
    def fatal(self) -> bool:
        """Whether no round could ever stop a kernel: the token refused, or a scope missing."""
        return self.refused or bool(self.missing)


def check_token(hub: Hub) -> TokenCheck:
    """Ask the hub who the token is and what it may do (see the module)."""
    try:
        model = hub.request("GET", f"{hub.api_url}/user", "checking the token with the hub")
    except HubError as error:
        if error.refused:
            return TokenCheck(False, (
                f"the hub refused this token (HTTP {error.status}): it is no token the hub "
                "knows (mistyped, revoked or expired); set $JUPYTERHUB_API_TOKEN to the "
                "culler's service token (its api_token in jupyterhub_config.py; a service the "
                "hub starts gets it from the hub)"
            ), refused=True)  # fmt: skip
        if error.no_answer:
            said = f"{error}; the token is unchecked"  # "… URL does not answer (why)"
            return TokenCheck(False, said, no_answer=True)
        return TokenCheck(False, f"the hub did not say who this token is: {error}")
    if not isinstance(model, dict):
        return TokenCheck(False, f"{hub.api_url}/user answered no user or service model; is "
                          "--hub-url a JupyterHub?")  # fmt: skip
    who = f"{model.get('kind') or 'owner'} {model.get('name') or '(unnamed)'}"
    scopes = model.get("scopes")
    if not isinstance(scopes, list):
        return TokenCheck(True, f"token of {who}; the hub does not list its scopes (JupyterHub "
                          f"before 3), so they are unchecked: it needs {SCOPES_TEXT}")  # fmt: skip
    held = {str(s) for s in scopes}
    missing = tuple(s for s in SCOPES if s not in held)
    if missing:
        limited = sorted(s for s in held if s.split("!", 1)[0] in missing and "!" in s)
        narrowed = f" (it has only {', '.join(limited)}, limited to some)" if limited else ""
        return TokenCheck(False, (
            f"the token of {who} lacks {' and '.join(missing)}{narrowed}: it needs "
            f"{SCOPES_TEXT} to stop a kernel; {_ROLE_FIX}"
        ), missing)  # fmt: skip
    state = (
        f"{STATE_SCOPE} too" if STATE_SCOPE in held
        else f"no {STATE_SCOPE} (needed only where hub users run as Unix users of other "
        "names, such as TLJH's jupyter-NAME)"
    )  # fmt: skip
    return TokenCheck(True, f"token of {who} has {SCOPES_TEXT}; {state}")
