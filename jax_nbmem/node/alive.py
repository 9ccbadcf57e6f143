"""Liveness that crosses PID namespaces: a lock each kernel holds for its whole life.

A kernel in one container cannot test another container's PID (it is no PID here, or someone
else's), but it can test a lock: every kernel holds an exclusive ``flock`` on
``jax_nbmem-alive-<key>.lock`` beside its beacon (``key`` as the beacon's, see
:func:`jax_nbmem.node.identity.beacon_key`), and the kernel's end, even by SIGKILL, releases
it. :func:`lock_alive` asks without waiting: refused means alive, granted means its holder is
gone. A lock proves liveness only: anyone could hold a lock of any name, so whatever it vouches
for stays a claim.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

__all__ = ["AliveLock", "held_elsewhere", "lock_alive", "lock_path"]

_PREFIX = "jax_nbmem-alive-"
_SUFFIX = ".lock"


def lock_path(directory: str, key: str) -> str:
    """The alive lock's path for the beacon key ``key`` in ``directory``."""
    return os.path.join(directory, f"{_PREFIX}{key}{_SUFFIX}")


def _open(path: str, create: bool) -> int:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if not create:
            raise
        # A lock needs no write permission: read-only, so that a file another user left
        # (a dead kernel of the same key, in a shared folder) can still be locked.
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.fchmod(fd, 0o644)  # whatever the umask: others test it
        except OSError:
            pass
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a device: nobody's lock
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def lock_alive(directory: str, key: str) -> bool | None:
    """Whether the kernel of ``key`` holds its lock: True alive, False gone, None no lock.

    Never blocks, never raises; a lock file that is no regular file (or a symlink) is None.
    """
    try:
        fd = _open(lock_path(directory, key), create=False)
    except (OSError, ValueError):
        return None
    try:
        return held_elsewhere(fd)
    finally:
        os.close(fd)


def held_elsewhere(fd: int) -> bool | None:
    """Whether another open file holds ``fd``'s file locked (its writer runs); None: unknown.

    Tries a shared lock without blocking and lets it go at once.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


class AliveLock:
    """The locks this process holds in ``directories`` for ``key``; ``release()`` lets go.

    ``hold()`` takes whichever it does not hold yet (cheap when all are held) and says what it
    could not take in ``problems``; never raises.
    """

    def __init__(self, directories: list[str], key: str) -> None:
        self.paths = [lock_path(d, key) for d in directories]
        self._fds: dict[str, int] = {}
        self.problems: dict[str, str] = {}

    @property
    def held(self) -> list[str]:
        """The paths whose lock this process holds."""
        return list(self._fds)

    def hold(self) -> None:
        """Take each lock not held yet."""
        for path in self.paths:
            if path in self._fds:
                continue
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = _open(path, create=True)
            except (OSError, ValueError) as exc:
                self.problems[path] = getattr(exc, "strerror", None) or str(exc)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:  # held by another (a live kernel of the same key?)
                os.close(fd)
                self.problems[path] = f"held by another process ({exc.strerror or exc})"
                continue
            self.problems.pop(path, None)
            self._fds[path] = fd

    def release(self) -> None:
        """Remove the lock files and let go of them; a second call is a no-op."""
        fds, self._fds = self._fds, {}
        for path, fd in fds.items():
            try:
                os.unlink(path)
            except OSError:
                pass
            try:
                os.close(fd)
            except OSError:
                pass
