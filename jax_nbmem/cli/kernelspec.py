"""Jupyter kernelspecs that start a kernel in a given allocator mode (through jupyter_client).

The spec's ``env`` sets JAX's variables directly, so the mode holds even if the extension fails
to load, and ``JAX_NBMEM_ALLOCATOR``, so the extension reports where the mode came from.
The kernel loads the extension itself (``--ext jax_nbmem``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from jax_nbmem.allocator.control import ENV_ALLOCATOR
from jax_nbmem.allocator.modes import AllocatorMode, mode_variables
from jax_nbmem.allocator.report import kernel_display_name, kernel_name

# The entry point (pyproject.toml) of jax_nbmem.cli.provisioner.JaxNbMemProvisioner.
PROVISIONER_NAME = "jax-nbmem-provisioner"

__all__ = [
    "InstalledKernel",
    "KernelSpecError",
    "destination",
    "install",
    "list_kernels",
    "remove",
    "spec_for",
]

_METADATA_KEY = "jax_nbmem"


class KernelSpecError(RuntimeError):
    """A kernelspec operation that cannot be done; the message says why."""


@dataclass(frozen=True)
class InstalledKernel:
    """A jax_nbmem kernelspec found by jupyter_client."""

    name: str
    display_name: str
    allocator: str
    resource_dir: str
    env: dict[str, str]

    def to_dict(self) -> dict:
        """A JSON-friendly form."""
        return dict(vars(self))


def _manager(prefix: str | None = None):
    from jupyter_client.kernelspec import KernelSpecManager

    manager = KernelSpecManager()
    if prefix:
        # Also look in the prefix we may have installed into, so list/remove see it.
        extra = str(Path(prefix) / "share" / "jupyter" / "kernels")
        if extra not in manager.kernel_dirs:
            manager.kernel_dirs.append(extra)
    return manager


def spec_for(
    mode: AllocatorMode,
    display_name: str | None = None,
    python: str | None = None,
    provisioner: bool = False,
) -> dict:
    """The kernel.json content for a kernel that starts in ``mode``.

    ``provisioner``: the kernel is launched by jax_nbmem's provisioner, which decides ``auto``
    (and applies a site's policy) at launch and sets the variables itself.
    """
    env = (
        {}
        if provisioner
        else {name: value for name, value in mode_variables(mode).items() if value is not None}
    )
    env[ENV_ALLOCATOR] = str(mode)
    metadata: dict = {"debugger": True, _METADATA_KEY: {"allocator": str(mode)}}
    if provisioner:
        metadata["kernel_provisioner"] = {"provisioner_name": PROVISIONER_NAME, "config": {}}
    return {
        "argv": [
            python or sys.executable,
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
            "--ext",
            "jax_nbmem",
        ],
        "display_name": display_name or kernel_display_name(mode),
        "language": "python",
        "env": env,
        # jupyter_client merges `env` into the server's environment, so a variable set there
        # (say the deprecated fraction name) still reaches the kernel: the extension, loaded
        # before any cell, applies JAX_NBMEM_ALLOCATOR and unsets what contradicts the mode.
        # ipykernel (6+) speaks the debug protocol: JupyterLab's debugger works for the kernel.
        "metadata": metadata,
    }


def install(
    mode: AllocatorMode,
    *,
    name: str | None = None,
    display_name: str | None = None,
    user: bool = False,
    prefix: str | None = None,
    replace: bool = False,
    provisioner: bool = False,
) -> InstalledKernel:
    """Write the kernelspec and return where jupyter_client put it.

    Refuses to overwrite a kernelspec of the same name in the same place unless ``replace``:
    it may be someone's own, or another mode's.
    """
    name = name or kernel_name(mode) + ("-provisioned" if provisioner else "")
    spec = spec_for(mode, display_name, provisioner=provisioner)
    manager = _manager(prefix)
    existing = _existing(manager, name, user=user, prefix=prefix)
    if existing is not None and not replace:
        raise KernelSpecError(
            f"a kernelspec {name!r} is already installed in {existing}; pass --replace to "
            "overwrite it, or --name for another name"
        )
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
        try:
            where = manager.install_kernel_spec(folder, name, user=user, prefix=prefix)
        except (OSError, ValueError) as exc:
            raise KernelSpecError(f"cannot install kernelspec {name!r}: {exc}") from exc
    return InstalledKernel(name, spec["display_name"], str(mode), where, spec["env"])


def destination(manager, name: str, *, user: bool, prefix: str | None) -> Path:
    """Where jupyter_client puts kernelspec *name*: as ``install_kernel_spec`` decides."""
    from jupyter_core.paths import SYSTEM_JUPYTER_PATH

    if user:
        return Path(manager.user_kernel_dir) / name
    if prefix:
        return Path(prefix).absolute() / "share" / "jupyter" / "kernels" / name
    return Path(SYSTEM_JUPYTER_PATH[0]) / "kernels" / name


def _existing(manager, name: str, *, user: bool, prefix: str | None) -> str | None:
    """The folder of kernelspec *name* where this install would write, if there is one."""
    folder = destination(manager, name, user=user, prefix=prefix)
    return str(folder) if (folder / "kernel.json").exists() else None


def list_kernels(prefix: str | None = None) -> list[InstalledKernel]:
    """The kernelspecs made by jax_nbmem that jupyter_client can find."""
    manager = _manager(prefix)
    found = []
    for name, entry in sorted(manager.get_all_specs().items()):
        spec = entry.get("spec", {})
        ours = spec.get("metadata", {}).get(_METADATA_KEY)
        if not ours:
            continue
        found.append(
            InstalledKernel(
                name,
                spec.get("display_name", name),
                ours.get("allocator", "?"),
                entry.get("resource_dir", ""),
                dict(spec.get("env", {})),
            )
        )
    return found


def remove(name: str, prefix: str | None = None) -> str:
    """Remove a jax_nbmem kernelspec; refuses specs jax_nbmem did not make. Returns its folder."""
    manager = _manager(prefix)
    ours = {kernel.name: kernel for kernel in list_kernels(prefix)}
    if name not in ours:
        known = ", ".join(sorted(ours)) or "none installed"
        exists = name in manager.find_kernel_specs()
        why = "it was not made by jax_nbmem" if exists else "no such kernelspec"
        raise KernelSpecError(f"not removing {name!r}: {why} (jax_nbmem kernels: {known})")
    try:
        return manager.remove_kernel_spec(name)
    except (OSError, KeyError) as exc:
        raise KernelSpecError(f"cannot remove kernelspec {name!r}: {exc}") from exc
