"""A command's work bounded by a deadline: whatever it waits on, the command ends and says so."""

from __future__ import annotations

import threading

__all__ = ["within"]


def within(deadline_s: float, work):
    """``work()``'s result, or TimeoutError once ``deadline_s`` seconds have passed.

    The work runs on a daemon thread: whatever it waits on (a server, a file, a process
    that will not exit), this command ends by the deadline and says so.
    """
    done: dict = {}

    def run() -> None:
        try:
            done["result"] = work()
        except BaseException as error:  # handed to the caller as it is
            done["error"] = error

    thread = threading.Thread(target=run, daemon=True, name="jax-nbmem-shutdown")
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        raise TimeoutError(
            f"not finished within --deadline {deadline_s:g} s, so given up; whatever was "
            "under way may still complete (see the administrators' log), nothing more is done"
        )
    if "error" in done:
        raise done["error"]
    return done["result"]
