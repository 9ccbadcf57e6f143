"""Who a process in a container is, in its container's own words: its user there.

The host's account name for a container process's uid is nobody's (uid 1000 in every
docker-stacks container is ``jovyan``; on the host it is whoever got 1000 first), so it is
never shown for one. What is shown instead is the container's own user name for the uid the
process has *there* (mapped back through ``/proc/PID/uid_map`` when the container has a user
namespace of its own), read from the container's ``/etc/passwd``, else the bare uid.

The container's files are the container's to write (docker-stacks images make ``/etc/passwd``
group-writable), so the name is the container's claim, and reading it from the host must not
let the container choose what the host opens: ``openat2`` (Linux 5.6, syscall 437) with
``RESOLVE_IN_ROOT`` resolves every link inside ``/proc/PID/root`` as the container would,
``RESOLVE_NO_MAGICLINKS`` refuses ``/proc`` links, and the file is first opened as a path
only (``O_PATH``: nothing is opened for reading yet, so a FIFO cannot block and a device is
never opened), checked to be a regular file, then read through that very descriptor, at most
:data:`MAX_BYTES`. Where ``openat2`` is missing, nothing is read and the uid is shown.
"""

from __future__ import annotations

import ctypes
import os
import stat

__all__ = ["MAX_BYTES", "container_uid", "container_user", "read_in_root"]

MAX_BYTES = 1 << 20
_SYS_OPENAT2 = 437  # the same on every architecture (a syscall added after the unification)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_NAME_CHARS = 64


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]  # fmt: skip


_libc = None


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(flags, 0, resolve)
    fd = _libc.syscall(_SYS_OPENAT2, dirfd, path.encode(), ctypes.byref(how),
                       ctypes.sizeof(how))  # fmt: skip
    if fd < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error), path)
    return fd


def read_in_root(root: str, path: str, max_bytes: int = MAX_BYTES) -> bytes | str:
    """The bytes of the regular file ``path`` as seen inside ``root``, or why not.

    ``root`` is a process's ``/proc/PID/root``; links resolve inside it. Never raises.
    """
    try:
        base = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        return f"its root is unreadable: {error.strerror or error}"
    try:
        found = _openat2(base, path.lstrip("/"), os.O_PATH | os.O_CLOEXEC,
                         _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)  # fmt: skip
    except OSError as error:
        return f"its {path} cannot be opened: {error.strerror or error}"
    finally:
        os.close(base)
    try:
        info = os.fstat(found)
        if not stat.S_ISREG(info.st_mode):
            return f"its {path} is not a regular file"
        if info.st_size > max_bytes:
            return f"its {path} is over {max_bytes >> 10} KiB"
        # The O_PATH descriptor opened for reading through its own /proc/self/fd entry: the
        # same inode, checked above, whatever the container renames meanwhile.
        fd = os.open(f"/proc/self/fd/{found}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return os.read(fd, max_bytes + 1)[:max_bytes]
        finally:
            os.close(fd)
    except OSError as error:
        return f"its {path} cannot be read: {error.strerror or error}"
    finally:
        os.close(found)


def container_uid(uid_map: str, host_uid: int) -> int | None:
    """The uid that host uid ``host_uid`` is inside a user namespace (its ``uid_map``)."""
    for line in uid_map.splitlines():
        fields = line.split()
        if len(fields) == 3 and all(f.isdigit() for f in fields):
            inside, outside, count = (int(f) for f in fields)
            if outside <= host_uid < outside + count:
                return inside + host_uid - outside
    return None


def container_user(proc: str, pid: int, host_uid: int) -> tuple[int | None, str | None, str]:
    """(its uid in the container, the container's name for it or None, why no name).

    Never raises; the name is the container's claim (see the module).
    """
    try:
        with open(f"{proc}/{pid}/uid_map", encoding="ascii") as file:
            uid = container_uid(file.read(65536), host_uid)
    except (OSError, ValueError) as error:
        return None, None, f"its uid map is unreadable: {getattr(error, 'strerror', error)}"
    if uid is None:
        return None, None, f"host uid {host_uid} is not mapped in its user namespace"
    data = read_in_root(f"{proc}/{pid}/root", "/etc/passwd")
    if isinstance(data, str):
        return uid, None, data
    for line in data.decode("utf-8", "replace").splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2] == str(uid) and fields[0]:
            name = "".join(c for c in fields[0][:_NAME_CHARS] if c.isprintable())
            if name:
                return uid, name, ""
    return uid, None, f"uid {uid} is not in its /etc/passwd"
