"""One HTTP exchange that ends by a deadline, whatever the other side does, and follows nothing.

What ``jax-nbmem`` sends to a Jupyter server or a hub goes through :func:`exchange`: one
request on one connection, no redirect followed (a ``3xx`` is an answer like any other, so
a credential in its headers goes nowhere else), and one deadline for the whole of it —
connecting, sending, the status line, every byte of the body. A per-read timeout alone lets
a server that sends a byte every few seconds hold the caller for ever; here a watchdog shuts
the socket down when the deadline passes, which ends any read in progress. The body is read
up to a bound, never to the end of whatever the other side sends.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass

__all__ = ["Answer", "exchange"]

MAX_BODY_BYTES = 8 << 20


@dataclass(frozen=True)
class Answer:
    """What came back: the status, its reason, a redirect's ``Location``, the body (bounded)."""

    status: int
    reason: str
    location: str | None
    body: bytes


def exchange(
    connection: http.client.HTTPConnection,
    method: str,
    path: str,
    headers: dict[str, str],
    timeout: float,
    body: bytes | None = None,
    max_body: int = MAX_BODY_BYTES,
) -> Answer:
    """Send one request on ``connection`` and read its answer, all within ``timeout`` seconds.

    Raises TimeoutError when the deadline passes (the socket is shut down then),
    ``http.client.HTTPException`` or OSError when the exchange fails, ValueError when the
    body exceeds ``max_body``. The connection is closed on return.
    """
    deadline = time.monotonic() + timeout
    connection.timeout = timeout  # connecting: bounded by the socket's own timeout
    try:
        connection.connect()
    except OSError:
        connection.close()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no connection within {timeout:g} s") from None
        raise
    left = deadline - time.monotonic()
    if left <= 0:
        connection.close()
        raise TimeoutError(f"no connection within {timeout:g} s")
    # From here on the socket exists, so the watchdog can end any read in progress.
    watchdog = threading.Timer(left, _abort, args=(connection,))
    watchdog.daemon = True
    watchdog.name = "jax-nbmem-http-deadline"
    watchdog.start()
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        content = response.read(max_body + 1)
    except (OSError, http.client.HTTPException, ValueError):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no full answer within {timeout:g} s") from None
        raise
    finally:
        watchdog.cancel()
        watchdog.join()  # at once once cancelled: no thread outlives the exchange
        connection.close()
    if time.monotonic() >= deadline:
        raise TimeoutError(f"no full answer within {timeout:g} s")
    if len(content) > max_body:
        raise ValueError(f"an answer larger than {max_body >> 20} MiB")
    return Answer(response.status, response.reason, response.getheader("Location"), content)


def _abort(connection: http.client.HTTPConnection) -> None:
    """Shut the connection's socket down: a read in progress returns at once."""
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed or never connected
            pass
