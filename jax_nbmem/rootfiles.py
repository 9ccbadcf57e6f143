"""Files root touches on a shared node: never through a user's link, never blocking on a FIFO.

Root's tools (the node agent, ``status``, ``stop``, the culler, the simulated GPU's set-up and
registrar) run where users may write folders. Two rules, kept here once (docs/security.md,
"What root opens, and where"):

* **Writing** (:func:`append_line`, :func:`write_file`, :func:`private_folder`): the folder is
  reached one component at a time from ``/`` with ``O_NOFOLLOW`` (a symbolic link is followed
  only where root or this user owns it *and* the folder holding it, so ``/var/run`` still
  works), and it must be owned by root or this user and writable by nobody else. What is
  written is opened relative to that folder's descriptor with ``O_NOFOLLOW``, created ``O_EXCL``
  or checked as a regular file of ours, and its mode set with ``fchmod`` on what was opened. A
  user who can write a folder on the way can then neither swap it nor point root elsewhere.
* **Reading** what a user may have written (:func:`read_regular`): opened ``O_NOFOLLOW |
  O_NONBLOCK`` (a FIFO never hangs the reader), a regular file of at most ``max_bytes``, read
  once; anything else is an :class:`UnsafeFile` that says why.

:func:`lock_file` is the one kind of file root shares with users on purpose (the simulated GPU's
``gpu.state.lock``, in a folder everyone writes): see there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

__all__ = [
    "UnsafeFile",
    "append_line",
    "lock_file",
    "private_folder",
    "read_regular",
    "write_file",
]

_FOLDER = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_LINKS = 40  # as the kernel's own limit on links in one path


class UnsafeFile(OSError):
    """A path root will not use as asked (a link, another user's folder, a FIFO...): says why."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _trusted(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _folder_fault(info: os.stat_result, where: str) -> str | None:
    """Why root may not write in the folder ``where`` (its ``fstat``), or None."""
    if not _trusted(info.st_uid):
        return f"{where} belongs to uid {info.st_uid}, not to root or this user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{where} is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _components(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


@contextlib.contextmanager
def private_folder(path: str | os.PathLike[str], *, create: bool = False,
                   mode: int = 0o755) -> Iterator[int]:  # fmt: skip
    """An ``O_PATH`` descriptor of the folder ``path``, safe for root to write in (see module).

    ``create``: missing folders are made (``mode``, whatever the umask). Raises
    :class:`UnsafeFile` naming the folder and why, or OSError (a folder missing).
    """
    where = os.path.abspath(os.fspath(path))
    fd = os.open("/", _FOLDER)
    try:
        pending, shown, links = _components(where), "", 0
        while pending:
            name = pending.pop(0)
            fd, shown, links, more = _step(fd, name, shown, links, create=create, mode=mode)
            pending[:0] = more
        fault = _folder_fault(os.fstat(fd), where)
        if fault is not None:
            raise UnsafeFile(errno.EPERM, f"{fault}: root writes nothing there")
        yield fd
    finally:
        os.close(fd)


def _step(fd: int, name: str, shown: str, links: int, *, create: bool, mode: int):
    """One component: (the next folder's descriptor, its path, links so far, names to walk)."""
    here = shown or "/"
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        if not create or name == "..":
            raise
        os.mkdir(name, mode, dir_fd=fd)
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode) and _trusted(info.st_uid):
            _fchmod_folder(fd, name, mode)
    if stat.S_ISLNK(info.st_mode):
        links += 1
        folder_fault = _folder_fault(os.fstat(fd), here) if name != ".." else None
        if links > _MAX_LINKS or folder_fault or not _trusted(info.st_uid):
            why = folder_fault or f"it belongs to uid {info.st_uid}"
            raise UnsafeFile(errno.ELOOP, f"{shown}/{name} is a symbolic link root does not "
                                          f"follow ({why})")  # fmt: skip
        target = os.readlink(name, dir_fd=fd)
        more = _components(target)
        if target.startswith("/"):
            os.close(fd)
            return os.open("/", _FOLDER), "", links, more
        return fd, shown, links, more
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFile(errno.ENOTDIR, f"{shown}/{name} is not a folder")
    next_fd = os.open(name, _FOLDER, dir_fd=fd)
    os.close(fd)
    shown = os.path.dirname(shown) if name == ".." else f"{shown}/{name}"
    return next_fd, shown, links, []


def _fchmod_folder(parent: int, name: str, mode: int) -> None:
    folder = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=parent)  # fmt: skip
    try:
        os.fchmod(folder, mode)
    finally:
        os.close(folder)


def _ours(fd: int, shown: str) -> os.stat_result:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeFile(errno.EINVAL, f"{shown} is not a regular file")
    if not _trusted(info.st_uid):
        raise UnsafeFile(errno.EPERM, f"{shown} belongs to uid {info.st_uid}")
    return info


def append_line(path: str | os.PathLike[str], line: str, *, mode: int = 0o644) -> None:
    """Append ``line`` to the log ``path``, its folder made if missing (see the module).

    Raises :class:`UnsafeFile` or OSError, having written nothing.
    """
    path = os.path.abspath(os.fspath(path))
    name = os.path.basename(path)
    with private_folder(os.path.dirname(path), create=True) as folder:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        fd = os.open(name, flags | os.O_CLOEXEC, mode, dir_fd=folder)
        try:
            _ours(fd, path)
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)


def write_file(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Write ``path`` whole (a new file of ours renamed over it), mode ``mode`` (see the module)."""
    path = os.path.abspath(os.fspath(path))
    name = os.path.basename(path)
    with private_folder(os.path.dirname(path)) as folder:
        _replace_in(folder, name, data, mode)


def _replace_in(folder: int, name: str, data: bytes, mode: int) -> None:
    """A new file beside ``name`` (``O_EXCL``: never a link), ``fchmod``, renamed over it."""
    for _ in range(100):
        partial = f".{name}.{os.urandom(6).hex()}"
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=folder)  # fmt: skip
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name", name)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(partial, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial, dir_fd=folder)
        raise


def read_regular(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` (at most ``max_bytes``), never blocking.

    Raises :class:`UnsafeFile` (a link, a FIFO, a device, a folder, too big) or OSError
    (missing, unreadable), each naming the file.
    """
    shown = os.fspath(path)
    try:
        fd = os.open(shown, _READ)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeFile(errno.ELOOP, f"{shown} is a symbolic link: not read") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(errno.EINVAL, f"{shown} is not a regular file: not read")
        if info.st_size > max_bytes:
            raise UnsafeFile(errno.EFBIG, f"{shown} is over {max_bytes} bytes: not read")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise UnsafeFile(errno.EFBIG, f"{shown} grew over {max_bytes} bytes: not read")
    return b"".join(chunks)


def lock_file(path: str | os.PathLike[str], *, shared_mode: int | None = None) -> int:
    """A read-only descriptor of the lock file ``path`` (``flock`` needs no more), made if missing.

    Never through a link and never blocking: a link, a FIFO or another non-regular file there
    raises :class:`UnsafeFile`. ``shared_mode`` (root setting up a lock every user takes): what
    is there unless a regular file of ours is replaced by a new one of ours (written aside and
    renamed over it: a link's target is never touched), then given ``shared_mode`` by
    ``fchmod``.
    """
    shown = os.fspath(path)
    folder_path, name = os.path.split(os.path.abspath(shown))
    folder = os.open(folder_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if shared_mode is not None:
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(name, dir_fd=folder, follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode) or not _trusted(info.st_uid):
                    _replace_in(folder, name, b"", shared_mode)
        try:
            fd = os.open(name, _READ | os.O_CREAT, 0o666, dir_fd=folder)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise UnsafeFile(errno.ELOOP, f"{shown} is a symbolic link: not used") from None
            raise
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(errno.EINVAL, f"{shown} is not a regular file: not used")
        if shared_mode is not None:
            if not _trusted(info.st_uid):  # swapped since: another's file keeps its mode
                raise UnsafeFile(errno.EPERM, f"{shown} belongs to uid {info.st_uid}: not used")
            os.fchmod(fd, shared_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd
