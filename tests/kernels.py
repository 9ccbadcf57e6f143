"""Start real Jupyter kernels (jupyter_client) and run code in them, as a frontend would."""

from __future__ import annotations

import contextlib
import queue

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from tests.ipython_session import clean_environ

__all__ = ["execute", "running_kernel"]


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
