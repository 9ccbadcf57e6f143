"""The extension's routes. Each reads the monitor's snapshot; none waits for NVML.

Every route is behind the server's own authentication: the API answers 403 without a token or
a login cookie, the board page sends the browser to the login page. The kernels' shutdown route
acts only on this server's kernels, the processes' one only on what the snapshot offers (the
notebook panel's offer: :mod:`jax_nbmem.server.offers`), and a cookie-authenticated POST needs
the XSRF token, as Jupyter's own API does (jupyter_server checks it before the handler runs).

One route serves a file, not data: ``/jax-nbmem/static/plotly.min.js``, the plotly.js of the
plotly package installed beside the server, which the notebook panel's plot loads from here
(once per browser, then revalidated) rather than carrying 4.6 MB in every notebook's widget
state. It is found without importing plotly; without plotly it answers 404 and the panel
asks its kernel instead.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from tornado import web

from jax_nbmem.node.servers import shutdown_kernel
from jax_nbmem.server.offers import THIS_SERVER

__all__ = [
    "BoardHandler",
    "HistoryHandler",
    "PlotlyHandler",
    "ProcessShutdownHandler",
    "ShutdownHandler",
    "StatusHandler",
    "plotly_dir",
    "routes",
]

_STATIC = Path(__file__).with_name("static")
AUTH_RESOURCE = "kernels"  # what Jupyter's authorizer is asked about: these are kernels' data


class _MonitorMixin:
    @property
    def monitor(self) -> Any:
        return self.settings["jax_nbmem_monitor"]


class StatusHandler(_MonitorMixin, APIHandler):
    """``GET /jax-nbmem/api/status``: the report of ``jax-nbmem status --json``, and more.

    It adds this server's ``kernels`` and the snapshot's ``server`` facts (its age, a slow
    refresh); 503 until the first snapshot is taken.
    """

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    def get(self) -> None:
        """Answer from the last snapshot."""
        snapshot = self.monitor.snapshot()
        if snapshot is None:
            self.set_status(503)
            self.set_header("Retry-After", "2")
            self.finish(json.dumps({"message": "jax_nbmem: the first snapshot is on its way"}))
            return
        self.finish(json.dumps(snapshot, default=str))


class HistoryHandler(_MonitorMixin, APIHandler):
    """``GET /jax-nbmem/api/history``: each GPU's used memory over the last minutes."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    def get(self) -> None:
        """Answer from the monitor's history."""
        self.finish(json.dumps({"gpus": self.monitor.history()}))


class ShutdownHandler(_MonitorMixin, APIHandler):
    """``POST /jax-nbmem/api/kernels/<id>/shutdown``: stop one of this server's kernels."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def post(self, kernel_id: str) -> None:
        """Shut the kernel down through the server's kernel manager; 404 if it is not ours."""
        manager = self.kernel_manager
        if kernel_id not in manager:
            raise web.HTTPError(404, f"no kernel {kernel_id} on this server")
        await manager.shutdown_kernel(kernel_id)
        await self.monitor.tick()  # the next snapshot no longer lists it
        self.finish(json.dumps({"kernel_id": kernel_id, "stopped": True}))


class ProcessShutdownHandler(_MonitorMixin, APIHandler):
    """``POST /jax-nbmem/api/processes/<pid>/shutdown``: what the panel's button does.

    Only a process the snapshot offers (``shutdown_offer``, :mod:`jax_nbmem.server.offers`):
    this server's kernel through its kernel manager, another kernel of this user through
    ``%jaxmem shutdown``'s path. 404 when no warning names the PID now, 409 with the reason
    when it cannot be offered. Answers ``pid``, ``done``, ``how`` and ``message``.
    """

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    async def post(self, pid_text: str) -> None:
        """Shut the offered process down; the blocking part runs off the event loop."""
        pid = int(pid_text)
        offer, kernel_id, tenants = self.monitor.shutdown_target(pid)
        if offer is None:
            raise web.HTTPError(404, f"no warning names PID {pid} now; nothing done")
        if not offer["offered"]:
            raise web.HTTPError(409, offer["why"])
        if kernel_id is not None and kernel_id in self.kernel_manager:
            await self.kernel_manager.shutdown_kernel(kernel_id)
            done, how, message = True, THIS_SERVER, f"Shut down kernel PID {pid} of this server."
        else:
            loop = asyncio.get_running_loop()
            outcome = await loop.run_in_executor(
                None, functools.partial(shutdown_kernel, pid, tenants, confirm=True)
            )
            done, how, message = outcome.done, outcome.how, outcome.message
        await self.monitor.tick()  # the next snapshot shows what came free
        self.finish(json.dumps({"pid": pid, "done": done, "how": how, "message": message}))


class BoardHandler(_MonitorMixin, JupyterHandler):
    """``GET /jax-nbmem/``: the GPU board, one self-contained page (no CDN)."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    def get(self) -> None:
        """The page, its script inlined, with the base URL and the XSRF token it needs."""
        page = (_STATIC / "board.html").read_text(encoding="utf-8")
        script = (_STATIC / "board.js").read_text(encoding="utf-8")
        settings = json.dumps({"baseUrl": self.base_url, "xsrfToken": self.xsrf_token.decode()})
        page = page.replace("/*SETTINGS*/", f"const SETTINGS = {settings};")
        page = page.replace("/*SCRIPT*/", script.replace("</", "<\\/"))
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(page)


def plotly_dir() -> Path | None:
    """The folder of the installed plotly package's ``plotly.min.js``, or None without it.

    Found through the import system's metadata: the server face never imports plotly.
    """
    try:
        spec = importlib.util.find_spec("plotly")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        folder = Path(location) / "package_data"
        if (folder / "plotly.min.js").is_file():
            return folder
    return None


class PlotlyHandler(JupyterHandler, web.StaticFileHandler):
    """``GET /jax-nbmem/static/plotly.min.js``: the plotly.js that draws the notebook panel.

    Logged-in users only, as every route here; a browser keeps it and revalidates it (its
    ETag: a 304 once it has it).
    """

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    def get(self, path: str, include_body: bool = True) -> Any:
        """The file (tornado's static file serving: ranges, ETag, 304)."""
        return web.StaticFileHandler.get(self, path, include_body=include_body)

    @web.authenticated
    @authorized
    def head(self, path: str) -> Any:
        """Its headers."""
        return web.StaticFileHandler.get(self, path, include_body=False)

    def set_extra_headers(self, path: str) -> None:
        """Kept by the browser, asked again each time (a 304 when unchanged)."""
        self.set_header("Cache-Control", "private, no-cache")

    def get_content_type(self) -> str:
        """JavaScript, whatever the platform's MIME table says of ``.js``."""
        return "text/javascript; charset=utf-8"


def routes(base_url: str) -> list[tuple[str, type] | tuple[str, type, dict]]:
    """The URL patterns under the server's base URL."""
    prefix = base_url.rstrip("/") + "/jax-nbmem"
    found = [
        (prefix + "/?", BoardHandler),
        (prefix + "/api/status", StatusHandler),
        (prefix + "/api/history", HistoryHandler),
        (prefix + r"/api/kernels/([\w-]+)/shutdown", ShutdownHandler),
        (prefix + r"/api/processes/([0-9]{1,10})/shutdown", ProcessShutdownHandler),
    ]
    folder = plotly_dir()
    if folder is not None:  # else 404, as for any unknown path: the panel asks its kernel
        found.append((prefix + r"/static/(plotly\.min\.js)", PlotlyHandler, {"path": str(folder)}))
    return found
