"""User settings as traitlets, so ``ipython_config.py`` / ``ipython_kernel_config.py`` can set them.

Example::

    c.InteractiveShellApp.extensions = ["jax_nbmem"]
    c.JaxNbMem.allocator = "off"

The environment variable ``JAX_NBMEM_ALLOCATOR`` (what a jax-nbmem kernelspec sets) wins over the
config file: it is the more specific of the two, chosen per kernel.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from traitlets import Bool, Dict, Enum, Float, Integer, Unicode
from traitlets.config import Configurable

from jax_nbmem.allocator.control import ENV_ALLOCATOR

__all__ = ["JaxNbMem", "startup_mode"]


class JaxNbMem(Configurable):
    """Settings of the jax_nbmem IPython extension."""

    allocator = Unicode(
        "",
        help="Allocator mode applied when the extension loads: on, off, 'fraction 0.3', platform, "
        "bfc, cuda_async, ... Empty: leave JAX's settings alone. JAX_NBMEM_ALLOCATOR overrides it.",
    ).tag(config=True)

    auto_fraction = Float(
        None,
        allow_none=True,
        min=0.01,
        max=1.0,
        help="With `%jaxalloc auto` on a shared GPU: preallocate this share when it fits what is "
        "free (with a margin) instead of turning preallocation off. None: off.",
    ).tag(config=True)

    policy = Dict(
        {},
        help="A site's rules, for administrators: {'max_fraction': 0.5} caps every pool, "
        "{'shared_preallocation': False} forbids preallocating on a GPU others use; 'reason' "
        "is said when a mode is refused. `auto` keeps to it; an explicit mode it forbids is "
        "refused and nothing changes.",
    ).tag(config=True)

    sample_interval = Float(
        0.1, min=0.01, help="Seconds between two GPU memory samples while the extension is loaded."
    ).tag(config=True)

    process_interval = Float(
        1.0,
        min=0.05,
        help="Seconds between two reads of the GPU process list when no cell runs "
        "(it costs milliseconds in NVML; a running cell is watched more closely).",
    ).tag(config=True)

    status_interval = Float(
        5.0,
        min=0.5,
        help="Seconds between two looks at who else is on the GPU (reads /proc and may ask "
        "Jupyter servers; the warnings in the panel come from it).",
    ).tag(config=True)

    beacon = Bool(
        True,
        help="Keep a beacon: a small world-readable file saying this kernel's allocator mode, "
        "JAX pool and idleness, so that other kernels, the CLI and the server judge it by its "
        "facts (no token, environment or cell source is in it).",
    ).tag(config=True)

    share_dir = Unicode(
        "",
        help="A directory every user's kernels write their beacons to (what each kernel says of "
        "its mode, pool and idleness), e.g. a sticky world-writable folder on a shared GPU node. "
        "Empty: the user's Jupyter runtime directory only. $JAX_NBMEM_SHARE_DIR overrides it.",
    ).tag(config=True)

    agent_user = Unicode(
        "",
        help="The user (a name or a uid) the node agent runs as, when not root: its resolution "
        "in <share_dir>/agent is trusted only from root or this user. $JAX_NBMEM_AGENT_USER "
        "overrides it.",
    ).tag(config=True)

    max_cells = Integer(
        10_000, min=1, help="How many cell records %jaxmem cells keeps; older ones are dropped."
    ).tag(config=True)

    sampling = Enum(
        ["auto", "off"], "auto", help="'off' disables the background sampler (no live panel)."
    ).tag(config=True)

    panel = Enum(
        ["auto", "widget", "cells", "static", "text"],
        "auto",
        help="How %jaxmem shows the panel: 'widget', live (a thread follows the GPU; after each "
        "cell the main thread sends too); 'cells', the same widget updated only after each "
        "cell; 'static', a picture replaced after each cell through its display id (for "
        "frontends without widgets, and Colab); 'text'; or 'auto': static in Colab, text in a "
        "terminal, widget elsewhere. `%jaxmem panel KIND` chooses for one display.",
    ).tag(config=True)


def startup_mode(settings: JaxNbMem, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The mode to apply at load and where it comes from; ``("", "")`` when none is asked for."""
    environ = os.environ if environ is None else environ
    from_env = environ.get(ENV_ALLOCATOR, "").strip()
    if from_env:
        return from_env, f"${ENV_ALLOCATOR}"
    if settings.allocator.strip():
        return settings.allocator.strip(), "c.JaxNbMem.allocator"
    return "", ""
