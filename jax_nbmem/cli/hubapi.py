"""A small client of JupyterHub's REST API and of users' servers behind its proxy.

What ``jax-nbmem shutdown`` and ``jax-nbmem cull`` need: a user's server address, and a
kernel's shutdown through that server, with an administrator's hub API token
(``$JUPYTERHUB_API_TOKEN``, the scopes :data:`SCOPES`: ``read:servers`` to find a server,
``access:servers`` to call it) — a :class:`Hub`. A hub user's own kernels need no such token:
in their server, its terminals and kernels, JupyterHub sets the server's own address and token
(``$JUPYTERHUB_SERVICE_URL``, ``$JUPYTERHUB_API_TOKEN``), which may call that server only —
an :class:`OwnServer`. Every fault is a :class:`HubError` that says what went wrong and what
to do; the token never shows.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

__all__ = [
    "ENV_HUB_URL",
    "SCOPES",
    "SCOPES_TEXT",
    "Hub",
    "HubError",
    "OwnServer",
    "hub_from_environment",
    "own_server_from_environment",
]

ENV_HUB_URL = "JAX_NBMEM_HUB_URL"
# What an administrator's token needs to stop another user's kernel (the culler's too): one
# set, said in these words by every message, help text and docs page.
SCOPES = ("read:servers", "access:servers")
SCOPES_TEXT = "the scopes read:servers and access:servers"
_TIMEOUT_S = 10.0


class HubError(RuntimeError):
    """A hub or a user's server that did not answer, or refused; the message says why."""


@dataclass(frozen=True)
class Hub:
    """The hub at ``url`` (its public address, the proxy's) and its API at ``api_url``."""

    url: str
    api_url: str
    token: str = field(repr=False)

    def request(self, method: str, url: str, what: str) -> object:
        """One request with the token; the decoded JSON answer (None when empty)."""
        return _request(method, url, self.token, what)

    def server_url(self, user: str) -> str:
        """The address of ``user``'s default server through the hub's proxy."""
        quoted = urllib.parse.quote(user, safe="")
        model = self.request("GET", f"{self.api_url}/users/{quoted}", f"hub user {user}")
        server = ((model or {}).get("servers") or {}).get("") if isinstance(model, dict) else None
        if not server or not server.get("url"):
            raise HubError(f"hub user {user} has no running server")
        return self.url.rstrip("/") + server["url"]

    def shutdown_kernel(self, server_url: str, kernel_id: str) -> None:
        """Shut one kernel down through its server (``DELETE api/kernels/<id>``)."""
        _shutdown_kernel(server_url, kernel_id, self.token)

    def kernel_ids(self, server_url: str) -> set[str]:
        """The ids of the kernels that the server at ``server_url`` lists (``api/kernels``)."""
        return _kernel_ids(server_url, self.token)


@dataclass(frozen=True)
class OwnServer:
    """A hub user's own single-user server, as JupyterHub tells its processes.

    ``url`` is the server's own address (``$JUPYTERHUB_SERVICE_URL``, not through the proxy),
    ``token`` the server's (``$JUPYTERHUB_API_TOKEN``: it may call that server, and nothing of
    the hub's users), ``user`` its hub user (``$JUPYTERHUB_USER``).
    """

    url: str
    user: str
    token: str = field(repr=False)

    def shutdown_kernel(self, kernel_id: str) -> None:
        """Shut one of this server's kernels down (``DELETE api/kernels/<id>``)."""
        _shutdown_kernel(self.url, kernel_id, self.token)

    def kernel_ids(self) -> set[str]:
        """The ids of this server's kernels (``api/kernels``)."""
        return _kernel_ids(self.url, self.token)


def _request(method: str, url: str, token: str, what: str) -> object:
    """One request with ``token``; the decoded JSON answer (None when empty)."""
    request = urllib.request.Request(
        url, method=method, headers={"Authorization": f"token {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as reply:
            body = reply.read()
    except urllib.error.HTTPError as error:
        raise HubError(f"{what}: {_refusal(error)}") from None
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise HubError(f"{what}: {url} does not answer ({reason})") from None
    try:
        return json.loads(body) if body else None
    except ValueError:
        raise HubError(f"{what}: {url} answered something that is not JSON") from None


def _refusal(error: urllib.error.HTTPError) -> str:
    try:
        message = json.loads(error.read() or b"{}").get("message") or ""
    except (ValueError, AttributeError, OSError):
        message = ""
    if error.code == 403 or (error.code == 404 and message.startswith("No access")):
        return (
            f"HTTP {error.code}: the token may not do this (it needs {SCOPES_TEXT})"
            f"{': ' + message if message else ''}"
        )
    return f"HTTP {error.code} {error.reason}{': ' + message if message else ''}"


def _shutdown_kernel(server_url: str, kernel_id: str, token: str) -> None:
    url = f"{server_url.rstrip('/')}/api/kernels/{urllib.parse.quote(kernel_id, safe='')}"
    try:
        _request("DELETE", url, token, f"shutting kernel {kernel_id} down")
    except HubError as error:
        if "HTTP 404" in str(error):
            raise HubError(
                f"kernel {kernel_id} is not on {server_url} (another server's kernel, or it "
                "exited meanwhile)"
            ) from None
        raise


def _kernel_ids(server_url: str, token: str) -> set[str]:
    url = f"{server_url.rstrip('/')}/api/kernels"
    kernels = _request("GET", url, token, f"listing the kernels of {server_url}")
    if not isinstance(kernels, list):
        raise HubError(f"{server_url} answered something that is not a list of kernels")
    return {k["id"] for k in kernels if isinstance(k, dict) and isinstance(k.get("id"), str)}


def own_server_from_environment(environ=None) -> OwnServer | None:
    """The caller's own single-user server when it runs in one (its kernels, its terminals).

    JupyterHub sets ``$JUPYTERHUB_SERVICE_URL``, ``$JUPYTERHUB_API_TOKEN`` and
    ``$JUPYTERHUB_USER`` in every single-user server it spawns; its kernels and terminals
    inherit them. None where any of them is missing.
    """
    environ = os.environ if environ is None else environ
    url = environ.get("JUPYTERHUB_SERVICE_URL") or ""
    token = environ.get("JUPYTERHUB_API_TOKEN") or ""
    user = (environ.get("JUPYTERHUB_USER") or "").strip()
    if not (url and token and user):
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return OwnServer(url=url, user=user, token=token)


def hub_from_environment(url: str | None, environ=None) -> Hub | None:
    """The hub named by ``url`` (else ``$JAX_NBMEM_HUB_URL``), with ``$JUPYTERHUB_API_TOKEN``.

    ``$JUPYTERHUB_API_URL`` is its API when set, else ``URL/hub/api``. None when neither an
    address nor a token is given, or only the token of the single-user server the caller runs
    in (see :func:`own_server_from_environment`: that token calls its own server, nothing
    more); HubError when only one of them is otherwise.
    """
    environ = os.environ if environ is None else environ
    url = url or environ.get(ENV_HUB_URL) or ""
    token = environ.get("JUPYTERHUB_API_TOKEN") or ""
    if not url and not token:
        return None
    if not url and own_server_from_environment(environ) is not None:
        return None
    if not url:
        raise HubError(
            "a hub token is set but no hub address: pass --hub-url (the hub's public address, "
            f"e.g. http://127.0.0.1:8000) or set ${ENV_HUB_URL}"
        )
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HubError(f"--hub-url {url!r} is not an http(s) address")
    if not token:
        raise HubError(f"no hub API token: set $JUPYTERHUB_API_TOKEN to a token with {SCOPES_TEXT}")
    api = environ.get("JUPYTERHUB_API_URL") or url.rstrip("/") + "/hub/api"
    return Hub(url=url.rstrip("/"), api_url=api.rstrip("/"), token=token)
