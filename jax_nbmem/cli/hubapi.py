"""A small client of JupyterHub's REST API and of users' servers behind its proxy.

What ``jax-nbmem shutdown`` and ``jax-nbmem cull`` need: a user's server address, and a
kernel's shutdown through that server, with an administrator's hub API token
(``$JUPYTERHUB_API_TOKEN``, the scopes :data:`SCOPES`) — a :class:`Hub`. That token goes to
the hub's API only, never to a user's server, which is a process its user controls: what a
user's server is sent is a token the hub issues for that one server, on demand
(``POST users/NAME/tokens`` with the scope ``access:servers!server=NAME/``, owned by that
user, expiring in :data:`SERVER_TOKEN_S` seconds and revoked once used), whose power is what
that user could already do to their own server. ``read:servers`` finds a server; ``tokens``
issues those tokens.

A hub user's own kernels need no such token: in their server, its terminals and kernels,
JupyterHub sets the server's own address and token (``$JUPYTERHUB_SERVICE_URL``,
``$JUPYTERHUB_API_TOKEN``), which may call that server only — an :class:`OwnServer`.

Every request is one exchange (:func:`~jax_nbmem.node.exchange.exchange`): no redirect is
followed (a credential goes only where it was addressed), and the whole of it — connecting,
sending, every byte of the answer — ends within :data:`REQUEST_S` seconds, however slowly
the other side answers. Every fault is a :class:`HubError` that says what went wrong and
what to do; no token ever shows.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field

from jax_nbmem.node.exchange import exchange

__all__ = [
    "ENV_HUB_URL",
    "REQUEST_S",
    "SCOPES",
    "SCOPES_TEXT",
    "SERVER_TOKEN_S",
    "Hub",
    "MAX_SERVERS",
    "HubError",
    "OwnServer",
    "hub_from_environment",
    "own_server_from_environment",
]

ENV_HUB_URL = "JAX_NBMEM_HUB_URL"
# What an administrator's token needs to stop another user's kernel (the culler's too): one
# set, said in these words by every message, help text and docs page.
SCOPES = ("read:servers", "tokens")
SCOPES_TEXT = "the scopes read:servers and tokens"
REQUEST_S = 10.0  # one whole exchange, answer included
SERVER_TOKEN_S = 120  # a one-server token's life, should its revocation not get through
MAX_SERVERS = 32  # of one hub user's, asked for a kernel (JupyterHub's named_server_limit)


class HubError(RuntimeError):
    """A hub or a user's server that did not answer, or refused; the message says why.

    ``status`` is the HTTP status of a refusing answer (else None); ``no_answer`` is true
    where none came (connection refused, a name that does not resolve, TLS, a timeout):
    "the hub refused this token" is said of 401 and 403 only.
    """

    def __init__(self, message: str, status: int | None = None, *, no_answer: bool = False):
        super().__init__(message)
        self.status = status
        self.no_answer = no_answer

    @property
    def refused(self) -> bool:
        """Whether the other side answered that the token may not (401, 403)."""
        return self.status in (401, 403)


@dataclass(frozen=True)
class Hub:
    """The hub at ``url`` (its public address, the proxy's) and its API at ``api_url``."""

    url: str
    api_url: str
    token: str = field(repr=False)
    # Each server address servers() gave, whose it is and its name: only those are asked.
    _named: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False, compare=False)

    def request(self, method: str, url: str, what: str, body: object = None) -> object:
        """One request with the hub token, to the hub's API only; the decoded JSON answer."""
        if not url.startswith(self.api_url + "/"):
            raise HubError(f"{what}: {url} is not the hub's API ({self.api_url}); not sent")
        return _request(method, url, self.token, what, body)

    def servers(self, user: str) -> dict[str, str]:
        """The addresses of ``user``'s running servers through the hub's proxy, by name.

        ``""`` is the default server; a named one (``c.JupyterHub.allow_named_servers``) is
        at the path the hub records for it (``/user/NAME/SERVER/``). At most
        :data:`MAX_SERVERS`, the default first; HubError when none runs.
        """
        quoted = urllib.parse.quote(user, safe="")
        model = self.request("GET", f"{self.api_url}/users/{quoted}", f"hub user {user}")
        servers = (model or {}).get("servers") if isinstance(model, dict) else None
        found: dict[str, str] = {}
        for name in sorted(servers if isinstance(servers, dict) else (), key=_default_first):
            server = servers[name]
            if len(found) >= MAX_SERVERS or not isinstance(server, dict):
                continue
            if not server.get("url") or server.get("stopped") is True:
                continue
            path = str(server["url"])
            if not path.startswith("/") or path.startswith("//"):
                raise HubError(f"the hub records hub user {user}'s server at {path!r}, not a path")
            url = self.url.rstrip("/") + path
            self._named[url] = (user, str(name))
            found[str(name)] = url
        if not found:
            raise HubError(f"hub user {user} has no running server")
        return found

    def server_url(self, user: str, server: str = "") -> str:
        """The address of ``user``'s server ``server`` (default: the default server)."""
        found = self.servers(user)
        if server not in found:
            which = f"server {server!r}" if server else "default server"
            raise HubError(f"hub user {user} has no running {which}")
        return found[server]

    @contextlib.contextmanager
    def server_token(self, user: str, server: str = "") -> Iterator[str]:
        """A token the hub issues for ``user``'s server ``server`` alone, revoked afterwards.

        ``server``: its name, ``""`` for the default server.
        """
        quoted = urllib.parse.quote(user, safe="")
        issued = self.request(
            "POST", f"{self.api_url}/users/{quoted}/tokens",
            f"a token for hub user {user}'s server",
            {"scopes": [f"access:servers!server={user}/{server}"], "expires_in": SERVER_TOKEN_S,
             "note": "jax-nbmem: one kernel's shutdown (revoked once used)"},
        )  # fmt: skip
        if not isinstance(issued, dict) or not isinstance(issued.get("token"), str):
            raise HubError(f"the hub issued no token for hub user {user}'s server")
        try:
            yield issued["token"]
        finally:
            token_id = issued.get("id")
            if isinstance(token_id, str):
                with contextlib.suppress(HubError):  # it expires by itself in any case
                    self.request(
                        "DELETE",
                        f"{self.api_url}/users/{quoted}/tokens/"
                        f"{urllib.parse.quote(token_id, safe='')}",
                        "revoking the server's token",
                    )  # fmt: skip

    def shutdown_kernel(self, server_url: str, kernel_id: str, user: str | None = None) -> None:
        """Shut one kernel down through ``server_url`` (an address :meth:`servers` gave).

        With a token for that server alone (:meth:`server_token`); ``user`` defaults to
        whose :meth:`servers` gave that address.
        """
        with self.server_token(*self._whose(server_url, user)) as token:
            _shutdown_kernel(server_url, kernel_id, token)

    def kernel_ids(self, server_url: str, user: str | None = None) -> set[str]:
        """The ids of the kernels the server at ``server_url`` lists (as in shutdown_kernel)."""
        with self.server_token(*self._whose(server_url, user)) as token:
            return _kernel_ids(server_url, token)

    def _whose(self, server_url: str, user: str | None) -> tuple[str, str]:
        """(hub user, server name) of an address; a ``user`` given names the default server."""
        if not _same_origin(server_url, self.url):
            raise HubError(f"{server_url} is not behind the hub's proxy ({self.url}); not asked")
        named = self._named.get(server_url)
        if user and (named is None or named[0] != user):
            return user, ""
        if not named:
            raise HubError(f"{server_url} is no server the hub named; not asked")
        return named


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


def _default_first(name: object) -> tuple[bool, str]:
    return (name != "", str(name))


def _same_origin(url: str, base: str) -> bool:
    one, two = urllib.parse.urlsplit(url), urllib.parse.urlsplit(base)
    return (one.scheme, one.netloc.lower()) == (two.scheme, two.netloc.lower())


def _request(method: str, url: str, token: str, what: str, body: object = None) -> object:
    """One exchange with ``token``; the decoded JSON answer (None when empty).

    A redirect is an answer, not an address to go to: HubError, and nothing is sent there.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HubError(f"{what}: {url} is not an http(s) address")
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    headers = {"Authorization": f"token {token}", "Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        connection = (
            http.client.HTTPSConnection(parts.hostname, parts.port, timeout=REQUEST_S,
                                        context=ssl.create_default_context())
            if parts.scheme == "https"
            else http.client.HTTPConnection(parts.hostname, parts.port, timeout=REQUEST_S)
        )  # fmt: skip
        answer = exchange(connection, method, path, headers, REQUEST_S, data)
    except TimeoutError:
        raise HubError(
            f"{what}: {url} does not answer (no full answer within {REQUEST_S:g} s: a "
            "firewall, or a hub too busy to answer); given up",
            no_answer=True,
        ) from None
    except (OSError, http.client.HTTPException, ValueError) as error:
        said = f"{what}: {url} does not answer ({_reason(error, token, parts)})"
        raise HubError(said, no_answer=True) from None
    if 300 <= answer.status < 400:
        raise HubError(
            f"{what}: {url} answered HTTP {answer.status} with a redirect to "
            f"{answer.location or 'nowhere'}, which is not followed (a credential is sent only "
            "where it was addressed)",
            answer.status,
        )
    if answer.status >= 400:
        refusal = _refusal(answer.status, answer.reason, answer.body)
        raise HubError(f"{what}: {refusal}", answer.status)
    try:
        return json.loads(answer.body) if answer.body else None
    except ValueError:
        said = f"{what}: {url} answered something that is not JSON"
        raise HubError(said, answer.status) from None


def _reason(error: BaseException, token: str, parts: urllib.parse.SplitResult) -> str:
    """Why no answer came, in an administrator's words: which of the usual causes it is."""
    text = str(getattr(error, "reason", None) or error) or type(error).__name__
    text = text.replace(token, "***") if token else text
    where = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    if isinstance(error, ConnectionRefusedError):
        return f"connection refused: nothing listens at {where}; is the hub running there?"
    if isinstance(error, socket.gaierror):
        return f"the name {parts.hostname} does not resolve (DNS: {text})"
    if isinstance(error, ssl.SSLError):
        return (
            f"TLS with {where} failed ({text}); is the address https where the hub is http, "
            "or its certificate not one this machine trusts?"
        )
    if isinstance(error, http.client.HTTPException) and parts.scheme == "http":
        return f"{text}: not an HTTP answer (is the hub https?)"
    return text


def _refusal(status: int, reason: str, body: bytes) -> str:
    try:
        message = json.loads(body or b"{}").get("message") or ""
    except (ValueError, AttributeError):
        message = ""
    message = str(message)[:500]
    if status == 403 or (status == 404 and message.startswith("No access")):
        return (
            f"HTTP {status}: the token may not do this (it needs {SCOPES_TEXT})"
            f"{': ' + message if message else ''}"
        )
    return f"HTTP {status} {reason}{': ' + message if message else ''}"


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
