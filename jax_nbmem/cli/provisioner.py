"""A kernel provisioner that applies ``auto`` (and the site's policy) when a kernel launches.

For administrators who want the rule without anyone loading the extension: a kernelspec made
by ``jax-nbmem kernel install --allocator auto --provisioner`` names this provisioner
(``jax-nbmem-provisioner``, a ``jupyter_client.kernel_provisioners`` entry point). Just
before the kernel process starts, in the launcher (the Jupyter server), it reads the GPUs the
kernel will see (its own ``CUDA_VISIBLE_DEVICES``), chooses the mode under the claims lock
(:func:`jax_nbmem.tenants.auto.decide`), and writes the chosen mode's variables into the
kernel's environment, before any user code. ``JAX_NBMEM_ALLOCATOR`` then names the concrete
mode and ``JAX_NBMEM_MODE_REASON`` why, which the extension reports if it loads.

Settings, in the kernelspec's ``metadata.kernel_provisioner.config``: ``policy`` (as
``c.JaxNbMem.policy``), ``auto_fraction`` and ``share_dir``. A mode the policy refuses is
replaced by what ``auto`` chooses, and the reason says so: a kernel is never kept from
starting.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Dict, Float, Unicode

from jax_nbmem.allocator.control import ENV_ALLOCATOR, ENV_MODE_REASON
from jax_nbmem.allocator.modes import AllocatorMode, ModeError, mode_variables, parse_mode
from jax_nbmem.node.beacons import beacon_dirs
from jax_nbmem.node.sharedir import find_share_dir
from jax_nbmem.tenants.auto import Policy, PolicyError, decide
from jax_nbmem.text import printable

__all__ = ["JaxNbMemProvisioner"]

log = logging.getLogger("jax_nbmem")


class JaxNbMemProvisioner(LocalProvisioner):
    """A local kernel whose allocator mode is chosen at launch (see the module)."""

    policy = Dict({}, help="The site's policy, as c.JaxNbMem.policy.").tag(config=True)
    auto_fraction = Float(None, allow_none=True, help="As c.JaxNbMem.auto_fraction.").tag(
        config=True
    )
    share_dir = Unicode("", help="The shared beacon directory ($JAX_NBMEM_SHARE_DIR wins).").tag(
        config=True
    )

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Choose the mode for the kernel's GPUs and put it in its environment."""
        kwargs = await super().pre_launch(**kwargs)
        env = kwargs["env"]
        try:
            mode, reason = await asyncio.to_thread(self._choose, env)
        except Exception as exc:  # the kernel still starts, in the mode its spec asked for
            log.warning("jax_nbmem provisioner: no decision (%s)", printable(exc), exc_info=True)
            return kwargs
        for name, value in mode_variables(mode).items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        env[ENV_ALLOCATOR] = str(mode)
        if reason:
            env[ENV_MODE_REASON] = reason
        log.info(
            "jax_nbmem provisioner: kernel %s starts in '%s': %s",
            printable(self.kernel_id),
            printable(mode),
            printable(reason),
        )
        return kwargs

    def _choose(self, env: dict[str, str]) -> tuple[AllocatorMode, str | None]:
        from jax_nbmem.tenants.status import collect

        asked = env.get(ENV_ALLOCATOR, "auto") or "auto"
        try:
            requested = parse_mode(asked)
        except ModeError as exc:
            raise ValueError(f"the kernelspec's mode '{asked}': {exc}") from None
        policy = Policy.from_setting(self.policy)
        share = find_share_dir(environ=env, default=None, setting=self.share_dir).path
        dirs = beacon_dirs(share, env)
        options = {
            "policy": policy,
            "auto_fraction": self.auto_fraction,
            "claims_dir": dirs[-1] if dirs else None,
            "claim_key": str(self.kernel_id),
            "status": lambda: collect(environ=env, share_dir=share),
            # At launch the kernel has imported nothing yet: this server's modules are not its.
            "frameworks": (),
        }
        try:
            mode, choice = decide(requested, **options)
        except PolicyError as exc:
            mode, choice = decide(parse_mode("auto"), **options)
            return mode, f"{exc}; auto chose '{mode}': {choice.reason}"
        return mode, choice.reason if choice is not None else None
