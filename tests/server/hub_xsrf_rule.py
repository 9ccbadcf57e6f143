"""An identity provider for a plain Jupyter server that asks for XSRF as JupyterHub >= 4.1 does.

JupyterHub's single-user servers refuse a cookie-authenticated request that a page makes with
``fetch`` (``Sec-Fetch-Mode`` other than ``navigate``), GETs included, unless it carries the
XSRF token; page views, websockets and token-authenticated requests pass. A plain server only
checks it on POSTs. ``--ServerApp.identity_provider_class=tests.server.hub_xsrf_rule.HubXsrfRule``
gives a plain server the hub's rule, so that the board is tested against it without a hub.
"""

from __future__ import annotations

from jupyter_server.auth.identity import PasswordIdentityProvider
from tornado import web

__all__ = ["HubXsrfRule"]


def _needs_xsrf(handler: web.RequestHandler) -> bool:
    """JupyterHub's rule (``jupyterhub._xsrf_utils._needs_check_xsrf``), for cookie logins."""
    mode = handler.request.headers.get("Sec-Fetch-Mode", "unspecified")
    site = handler.request.headers.get("Sec-Fetch-Site", "unspecified")
    read_only = handler.request.method.lower() in {"get", "head", "options"}
    if mode == "websocket" or (mode in {"navigate", "unspecified"} and read_only):
        return False
    return not (mode == "no-cors" and site == "same-origin" and read_only)


class HubXsrfRule(PasswordIdentityProvider):
    """Cookie logins count only with the XSRF token where JupyterHub asks for it."""

    async def get_user(self, handler: web.RequestHandler):
        """The user, or None (403) for a cookie-authenticated fetch without the token."""
        user = await self._get_user(handler)
        if user is None or getattr(handler, "_token_authenticated", False):
            return user
        if _needs_xsrf(handler):
            try:
                web.RequestHandler.check_xsrf_cookie(handler)
            except web.HTTPError as error:
                self.log.warning("hub XSRF rule: refused %s: %s", handler.request.path, error)
                return None
        return user
