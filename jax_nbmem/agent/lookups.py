"""The node agent's expensive look-ups, off its serving thread and fair between callers.

Judging a line can cost: the host's view of a PID (``/proc`` files, a container's name), and
over TCP the search for the process that holds the caller's socket (a ``/proc`` walk, its
network namespace's TCP table, file descriptor scans: with 12,000 sockets in a namespace, a
large part of a second). The serving thread only accepts, reads, parses and writes; each
line's judgement is a job here, queued under the caller's group (:mod:`.admission`), and run
by a few worker threads so that:

- a group has at most one job running: however many lines one namespace floods, it holds one
  worker, and every other group's job finds another;
- groups take turns (round robin over the groups with work waiting), never first come first
  served across groups;
- each group has a budget of worker CPU time (``budget_s``, refilled at ``budget_s`` per
  ``window_s``): a group that spent it waits until it refills, so one caller's cost cannot
  take the machine's cores (this is Python: its CPU also costs everyone the GIL).

A finished job's result is handed to ``deliver`` on the worker thread (the server queues it
for its own thread and wakes its selector). :meth:`Lookups.stop` ends the workers; jobs not
run by then are dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

__all__ = ["Lookups"]

log = logging.getLogger("jax_nbmem")


class _Group:
    __slots__ = ("jobs", "running", "tokens", "stamp")

    def __init__(self, budget_s: float, now: float) -> None:
        self.jobs: deque = deque()
        self.running = False
        self.tokens = budget_s
        self.stamp = now


class Lookups:
    """Worker threads running jobs fairly by group (see the module)."""

    def __init__(
        self,
        deliver: Callable[[Any, Any], None],
        *,
        workers: int = 4,
        budget_s: float = 1.0,
        window_s: float = 10.0,
    ) -> None:
        self.deliver = deliver
        self.workers = workers
        self.budget_s = budget_s
        self.rate = budget_s / window_s
        self._groups: OrderedDict[tuple, _Group] = OrderedDict()
        self._ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._refill_in: float | None = None
        self.done = 0  # jobs run

    def start(self) -> None:
        """Start the workers (again after :meth:`stop`)."""
        with self._ready:
            self._stopping = False
        for number in range(self.workers):
            thread = threading.Thread(
                target=self._work, name=f"jax-nbmem-agent-lookup-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop the workers (waiting for running jobs); a second call is a no-op."""
        with self._ready:
            self._stopping = True
            self._groups.clear()
            self._ready.notify_all()
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.join(5.0)

    def submit(self, group: tuple, token: Any, job: Callable[[], Any]) -> None:
        """Run ``job()`` under ``group``; ``deliver(token, its result)`` when done."""
        with self._ready:
            found = self._groups.get(group)
            if found is None:
                found = self._groups[group] = _Group(self.budget_s, time.monotonic())
            found.jobs.append((token, job))
            self._ready.notify()

    def waiting(self, group: tuple) -> int:
        """How many jobs of ``group`` wait or run."""
        with self._ready:
            found = self._groups.get(group)
            return 0 if found is None else len(found.jobs) + found.running

    def _next(self) -> tuple[tuple, _Group] | None:
        """The next group to serve (round robin), or None (``_refill_in``: when to look again)."""
        now = time.monotonic()
        self._refill_in = None
        for key, group in list(self._groups.items()):
            group.tokens = min(self.budget_s, group.tokens + (now - group.stamp) * self.rate)
            group.stamp = now
            if group.running:
                continue
            if not group.jobs:
                if group.tokens >= self.budget_s:
                    del self._groups[key]  # nothing owed, nothing waiting: forgotten
                continue
            if group.tokens <= 0:
                wait = -group.tokens / self.rate
                self._refill_in = wait if self._refill_in is None else min(self._refill_in, wait)
                continue
            self._groups.move_to_end(key)  # its turn taken: the others come first next time
            return key, group
        return None

    def _work(self) -> None:
        while True:
            with self._ready:
                while True:
                    if self._stopping:
                        return
                    found = self._next()
                    if found is not None:
                        break
                    self._ready.wait(self._refill_in)
                _key, group = found
                token, job = group.jobs.popleft()
                group.running = True
            began = time.thread_time()
            try:
                result = job()
            except Exception as error:  # a job's fault is that caller's answer, never a crash
                log.warning("jax-nbmem agent: a look-up failed", exc_info=True)
                result = error
            cost = time.thread_time() - began
            with self._ready:
                group.running = False
                group.tokens -= cost  # kept (the group stays listed) until it refills
                self.done += 1
                self._ready.notify()
            try:
                self.deliver(token, result)
            except Exception:
                log.warning("jax-nbmem agent: a look-up's result was lost", exc_info=True)
