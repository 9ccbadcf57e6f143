"""A small client of JupyterHub's REST API and of users' servers behind its proxy.

What ``jax-nbmem shutdown`` and ``jax-nbmem cull`` need: a user's server address, and a
kernel's shutdown through that server, with a hub API token (``$JUPYTERHUB_API_TOKEN``; its
scopes: ``read:servers`` to find a server, ``access:servers`` to call it). Every fault is a
:class:`HubError` that says what went wrong and what to do; the token never shows.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

__all__ = ["ENV_HUB_URL", "Hub", "HubError", "hub_from_environment"]

ENV_HUB_URL = "JAX_NBMEM_HUB_URL"
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
        request = urllib.request.Request(
            url, method=method, headers={"Authorization": f"token {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as reply:
                body = reply.read()
        except urllib.error.HTTPError as error:
            raise HubError(f"{what}: {self._refusal(error)}") from None
        except (OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise HubError(f"{what}: {url} does not answer ({reason})") from None
        try:
            return json.loads(body) if body else None
        except ValueError:
            raise HubError(f"{what}: {url} answered something that is not JSON") from None

    def _refusal(self, error: urllib.error.HTTPError) -> str:
        try:
            message = json.loads(error.read() or b"{}").get("message") or ""
        except (ValueError, AttributeError, OSError):
            message = ""
        if error.code == 403 or (error.code == 404 and message.startswith("No access")):
            return (
                f"HTTP {error.code}: the token may not do this (it needs the scopes "
                "read:servers and access:servers, or admin:servers)"
                f"{': ' + message if message else ''}"
            )
        return f"HTTP {error.code} {error.reason}{': ' + message if message else ''}"

    def users(self) -> list[dict]:
        """Every user with their servers (``list:users`` and ``read:servers``)."""
        answer = self.request("GET", self.api_url + "/users", "listing the hub's users")
        return answer if isinstance(answer, list) else []

    def server_url(self, user: str) -> str:
        """The address of ``user``'s default server through the hub's proxy."""
        quoted = urllib.parse.quote(user, safe="")
        model = self.request("GET", f"{self.api_url}/users/{quoted}", f"hub user {user}")
        server = ((model or {}).get("servers") or {}).get("") if isinstance(model, dict) else None
        if not server or not server.get("url"):
            raise HubError(f"hub user {user} has no running server")
        return self.url.rstrip("/") + server["url"]

    def server_kernels(self, server_url: str) -> list[dict]:
        """The kernels of a user's server (``GET api/kernels``)."""
        answer = self.request("GET", server_url.rstrip("/") + "/api/kernels", server_url)
        return answer if isinstance(answer, list) else []

    def shutdown_kernel(self, server_url: str, kernel_id: str) -> None:
        """Shut one kernel down through its server (``DELETE api/kernels/<id>``)."""
        url = f"{server_url.rstrip('/')}/api/kernels/{urllib.parse.quote(kernel_id, safe='')}"
        try:
            self.request("DELETE", url, f"shutting kernel {kernel_id} down")
        except HubError as error:
            if "HTTP 404" in str(error):
                raise HubError(
                    f"kernel {kernel_id} is not on {server_url} (it exited meanwhile?)"
                ) from None
            raise


def hub_from_environment(url: str | None, environ=None) -> Hub | None:
    """The hub named by ``url`` (else ``$JAX_NBMEM_HUB_URL``), with ``$JUPYTERHUB_API_TOKEN``.

    ``$JUPYTERHUB_API_URL`` is its API when set, else ``URL/hub/api``. None when neither an
    address nor a token is given; HubError when only one of them is.
    """
    environ = os.environ if environ is None else environ
    url = url or environ.get(ENV_HUB_URL) or ""
    token = environ.get("JUPYTERHUB_API_TOKEN") or ""
    if not url and not token:
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
        raise HubError(
            "no hub API token: set $JUPYTERHUB_API_TOKEN to a token with the scopes "
            "read:servers and access:servers"
        )
    api = environ.get("JUPYTERHUB_API_URL") or url.rstrip("/") + "/hub/api"
    return Hub(url=url.rstrip("/"), api_url=api.rstrip("/"), token=token)
