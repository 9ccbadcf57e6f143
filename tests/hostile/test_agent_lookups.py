"""The agent's look-ups: a caller group that spent its CPU budget waits; the others do not."""

import threading
import time

from jax_nbmem.agent.lookups import Lookups
from tests.waiting import wait_for


def _burn(seconds: float) -> str:
    began = time.thread_time()
    while time.thread_time() - began < seconds:
        pass
    return "burnt"


def test_a_group_over_its_budget_waits_while_another_is_served_at_once():
    done, lock = {}, threading.Lock()

    def deliver(token, result):
        with lock:
            done[token] = result

    # 50 ms of CPU per 100 s: mallory's first job (100 ms) leaves her in debt for ~100 s.
    lookups = Lookups(deliver, workers=2, budget_s=0.05, window_s=100.0)
    lookups.start()
    try:
        lookups.submit(("pid_ns", 1), "mallory-1", lambda: _burn(0.1))
        wait_for("mallory's first job", lambda: "mallory-1" in done)
        lookups.submit(("pid_ns", 1), "mallory-2", lambda: "judged")
        lookups.submit(("pid_ns", 2), "bob", lambda: "judged")
        wait_for("bob's job", lambda: "bob" in done)
        assert "mallory-2" not in done and lookups.waiting(("pid_ns", 1)) == 1
    finally:
        lookups.stop()
    assert "mallory-2" not in done  # dropped at stop, never run
    lookups.stop()  # a second stop is a no-op
