"""Start real Jupyter kernels (jupyter_client) and run code in them, as a frontend would."""

from __future__ import annotations

import contextlib
import queue
import time

from jupyter_client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from tests.ipython_session import clean_environ

__all__ = ["execute", "ready_client", "running_kernel"]


@contextlib.contextmanager
def running_kernel(kernel_name="python3", env=None, kernel_dirs=None, extra_arguments=()):
    """A started kernel and its blocking client; shut down (and waited for) on exit."""
    spec_manager = KernelSpecManager()
    if kernel_dirs:
        spec_manager.kernel_dirs = list(kernel_dirs) + list(spec_manager.kernel_dirs)
    manager = KernelManager(kernel_name=kernel_name, kernel_spec_manager=spec_manager)
    full_env = clean_environ()
    full_env.update(env or {})
    manager.start_kernel(env=full_env, extra_arguments=list(extra_arguments))
    client = manager.blocking_client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def ready_client(connection_file: str, alive, timeout: float = 120.0) -> BlockingKernelClient:
    """A client of the kernel behind ``connection_file`` once it answers; ``alive()`` its process.

    A kernel still importing misses heartbeats, and a client that did not start it then says
    the kernel "died" (jupyter_client's RuntimeError): that is tried again, with a new client,
    while ``alive()`` and within ``timeout``; a kernel that really ended fails at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        client = BlockingKernelClient(connection_file=connection_file)
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
            return client
        except RuntimeError:
            client.stop_channels()
            if time.monotonic() > deadline or not alive():
                raise


def execute(client, code: str, timeout: float = 60) -> tuple[str, str | None]:
    """Run ``code``; return (text it printed or displayed, error name or None)."""
    msg_id = client.execute(code)
    chunks, error = [], None
    while True:
        try:
            msg = client.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no reply within {timeout}s to {code!r}") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            chunks.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            chunks.append(content["data"].get("text/plain", ""))
        elif kind == "error":
            error = content["ename"]
            chunks.append(f"{content['ename']}: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(chunks), error
