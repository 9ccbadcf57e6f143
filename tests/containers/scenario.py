"""Issue 31's and 39's two users, whatever makes their containers: the cells and the waits.

Alice's ``hog.ipynb`` runs in the default mode (a 60 GiB pool of an 80 GiB simulated GPU);
Bob's ``work.ipynb`` ran ``%jaxalloc off`` (a few hundred MiB). ``listed`` is the simulated
GPU's view (host PID -> bytes), as :meth:`tests.containers.Node.listed` gives it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.waiting import wait_for

__all__ = ["hog_and_work", "refreshes_seen", "resolved", "written_at"]

GiB, MiB = 1 << 30, 1 << 20


def hog_and_work(listed: Callable[[], dict[int, int]], hog, work) -> None:
    """Run Alice's and Bob's cells in kernels ``hog`` and ``work``; back once both hold."""
    hog.run("%load_ext jax_nbmem")
    hog.run("import jax.numpy as jnp\nx = jnp.ones((1024, 1024))\nx.block_until_ready()")
    work.run("%load_ext jax_nbmem")
    work.run("%jaxalloc off")
    work.run("import jax.numpy as jnp\ny = jnp.ones((256, 256))\ny.block_until_ready()")

    def on_the_gpu():
        held = listed()
        return held.get(hog.pid, 0) >= 60 * GiB and 0 < held.get(work.pid, 0) < 400 * MiB

    wait_for("alice's pool and bob's context on the GPU, by host PID", on_the_gpu)


def resolved(share_dir: Path, *pids: int) -> dict | None:
    """The agent's resolution once every one of ``pids`` is a proven kernel in it."""
    try:
        content = json.loads((share_dir / "agent" / "resolution.json").read_text())
    except (OSError, ValueError):
        return None
    proven = {entry["pid"] for entry in content["processes"] if entry.get("kernel")}
    return content if set(pids) <= proven else None


def written_at(share_dir: Path) -> float | None:
    """When the agent last wrote its resolution (None: none readable yet)."""
    try:
        return json.loads((share_dir / "agent" / "resolution.json").read_text())["written_at"]
    except (OSError, ValueError, KeyError):
        return None


def refreshes_seen(share_dir: Path, count: int) -> None:
    """Wait until the agent has written its resolution ``count`` more times from now."""
    seen = [written_at(share_dir)]

    def more():
        now = written_at(share_dir)
        if now is not None and now != seen[-1]:
            seen.append(now)
        return len(seen) > count

    wait_for(f"{count} more of the agent's refreshes", more, timeout=60, every=0.05)
