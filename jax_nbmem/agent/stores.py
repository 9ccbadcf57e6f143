"""Containers' names as their runtimes recorded them: Docker's and Podman's stores on the host.

- Docker: ``<data root>/containers/<id>/config.v2.json``, its ``Name`` (a container's host
  name is its id, not its name). Rootless Docker keeps the same under
  ``~/.local/share/docker``.
- Podman (containers/storage): ``<graphroot>/<driver>-containers/containers.json``, a list of
  ``{"id", "names": [...]}`` (``vfs-containers``, ``overlay-containers``, ...; mode 0600, root's
  graphroot is ``/var/lib/containers/storage``). A rootless Podman's store is in its user's
  home (``~/.local/share/containers/storage``). Podman's own database
  (``libpod/bolt_state.db``, BoltDB) holds the same names; it is not read: the storage's
  list is plain JSON and always written beside it.

A store is trusted only as its owner's word: a rootful runtime's files must be root's, a
rootless one's the container's user's (and what that user wrote is that user's claim: anyone
who can make a container can name it ``jupyter-bob``). Files are opened without following a
link, must be regular and are size-capped; Podman's list is parsed again only when it changes.
Each lookup gives ``{"name": ...}`` or ``{"name_reason": ...}``, never raises.
"""

from __future__ import annotations

import json
import os
import pwd
import stat

__all__ = ["PODMAN_ROOT", "docker_name", "podman_config_path", "podman_name", "rootless_home"]

PODMAN_ROOT = "/var/lib/containers/storage"
_MAX_CONFIG_BYTES = 4 << 20
_MAX_LIST_BYTES = 32 << 20
_MAX_STORES = 16
# Podman lists by path: (the file's identity, {id: name}).
_podman_lists: dict[str, tuple[tuple, dict[str, str]]] = {}


def rootless_home(uid: int) -> str | None:
    """The host account's home of ``uid`` (a rootless runtime's store is there), or None."""
    try:
        return pwd.getpwuid(uid).pw_dir or None
    except (KeyError, OverflowError):
        return None


def _read_owned(path: str, owner: int, cap: int) -> bytes | str:
    """The bytes of the regular file ``path`` owned by ``owner``, or why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        return f"cannot read {path}: {error.strerror or error}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return f"{path} is not a regular file"
        if info.st_uid not in (owner, os.geteuid()):  # the reader's own: as sure as the reader
            return f"{path} is owned by uid {info.st_uid}, not by uid {owner}: not trusted"
        if info.st_size > cap:
            return f"{path} is over {cap >> 20} MiB"
        return os.read(fd, cap + 1)[: cap + 1]
    except OSError as error:
        return f"cannot read {path}: {error.strerror or error}"
    finally:
        os.close(fd)


def docker_name(data_root: str, container_id: str, owner: int = 0) -> dict:
    """``{"name"}`` from Docker's ``config.v2.json`` under ``data_root``, or ``{"name_reason"}``."""
    path = os.path.join(data_root, "containers", container_id, "config.v2.json")
    data = _read_owned(path, owner, _MAX_CONFIG_BYTES)
    if isinstance(data, str):
        return {"name_reason": data}
    try:
        name = json.loads(data).get("Name")
    except (ValueError, AttributeError, RecursionError):
        return {"name_reason": f"{path} is not Docker's container config"}
    if not isinstance(name, str) or not name.strip("/"):
        return {"name_reason": f"{path} names no container"}
    return {"name": name.lstrip("/")[:256]}


def podman_name(graphroot: str, container_id: str, owner: int = 0) -> dict:
    """``{"name"}`` from Podman's storage under ``graphroot``, or ``{"name_reason"}``."""
    try:
        drivers = sorted(e for e in os.listdir(graphroot) if e.endswith("-containers"))
    except OSError as error:
        return {"name_reason": f"cannot list Podman's store {graphroot}: {error.strerror}"}
    if not drivers:
        return {"name_reason": f"Podman's store {graphroot} lists no containers"}
    reasons = []
    for driver in drivers[:_MAX_STORES]:
        names = _podman_list(os.path.join(graphroot, driver, "containers.json"), owner)
        if isinstance(names, str):
            reasons.append(names)
        elif container_id in names:
            return {"name": names[container_id]}
    return {"name_reason": "; ".join(reasons) or f"{container_id[:12]} is not in {graphroot}"}


def podman_config_path(graphroot: str, container_id: str) -> str:
    """Where Podman keeps ``container_id``'s OCI config: the driver store that holds it.

    Each storage driver has its own ``<driver>-containers`` folder (``vfs``, ``overlay``,
    ``btrfs``, ...), so the record is looked for in every one, never in one driver's name.
    Raises LookupError, naming each store looked in, when none holds it.
    """
    if not container_id or "/" in container_id or container_id.startswith("."):
        raise LookupError(f"{container_id!r} is not a container id")
    try:
        drivers = sorted(e for e in os.listdir(graphroot) if e.endswith("-containers"))
    except OSError as error:
        raise LookupError(f"cannot list Podman's store {graphroot}: {error.strerror}") from None
    for driver in drivers[:_MAX_STORES]:
        path = os.path.join(graphroot, driver, container_id, "userdata", "config.json")
        if os.path.lexists(path):
            return path
    looked = ", ".join(drivers[:_MAX_STORES]) or "no <driver>-containers folder"
    raise LookupError(
        f"no store of Podman's under {graphroot} holds container {container_id[:12]} "
        f"(looked in: {looked})"
    )


def _podman_list(path: str, owner: int) -> dict[str, str] | str:
    """The ``{id: first name}`` of one ``containers.json``, parsed again only when changed."""
    try:
        info = os.lstat(path)
    except OSError as error:
        return f"cannot read {path}: {error.strerror or error}"
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_uid)
    cached = _podman_lists.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    data = _read_owned(path, owner, _MAX_LIST_BYTES)
    if isinstance(data, str):
        return data
    try:
        entries = json.loads(data)
    except (ValueError, RecursionError):
        return f"{path} is not Podman's container list"
    names = {}
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        found = entry.get("names")
        first = found[0] if isinstance(found, list) and found else None
        if isinstance(first, str) and first:
            names[entry["id"]] = first[:256]
    if len(_podman_lists) >= 64:
        _podman_lists.clear()
    _podman_lists[path] = (key, names)
    return names
