"""Liveness that crosses PID namespaces: a lock each kernel holds for its whole life.

A kernel in one container cannot test another container's PID (it is no PID here, or someone
else's), but it can test a lock: every kernel holds an exclusive ``flock`` on
``jax_nbmem-alive-<key>.lock`` beside its beacon (``key`` as the beacon's, see
:func:`jax_nbmem.node.identity.beacon_key`), and the kernel's end, even by SIGKILL, releases
it. :func:`lock_alive` asks without waiting: refused means alive, granted means its holder is
gone. A lock proves liveness only: anyone could hold a lock of any name, so whatever it vouches
for stays a claim.

**Squatted names** (issue 45). In a shared, sticky directory anyone may make a kernel's lock
name first: a file she holds locked for ever (the kernel would look alive after its end), one
she keeps private, a FIFO, a folder, a link. A kernel takes only its own user's regular file of
one link at its name, opened ``O_NOFOLLOW | O_NONBLOCK`` (never blocking, never elsewhere);
anything else there, it holds ``jax_nbmem-alive-<key>.<16 random hex digits>.lock`` instead
(:data:`FALLBACK_LOCK`: unpredictable, so nobody can take it first) and says why in its
``problems``. A reader counts only a lock owned by the beacon's owner (``owner``), and finds a
kernel's fallback by one listing of the directory (:func:`fallback_locks`; at most
:data:`MAX_FALLBACKS` of the owner's files a key). The agent's clean-up removes both
(:mod:`jax_nbmem.agent.publish`).
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import stat
from collections.abc import Iterable, Sequence

from jax_nbmem.node.beacon_files import MAX_FALLBACKS, names_by_key, owned_by

__all__ = [
    "FALLBACK_LOCK",
    "MAX_FALLBACKS",
    "AliveLock",
    "fallback_locks",
    "held_elsewhere",
    "lock_alive",
    "lock_path",
]

_PREFIX = "jax_nbmem-alive-"
_SUFFIX = ".lock"
# <key>.<suffix>: a key as a writer spells it (<pid> or <ns inode>-<pid>), as beacons' fallbacks.
FALLBACK_LOCK = re.compile(
    r"jax_nbmem-alive-([1-9][0-9]{0,19}(?:-[1-9][0-9]{0,9})?)\.([0-9a-f]{16})\.lock"
)
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def lock_path(directory: str, key: str) -> str:
    """The alive lock's path for the beacon key ``key`` in ``directory``."""
    return os.path.join(directory, f"{_PREFIX}{key}{_SUFFIX}")


def _fallback_path(directory: str, key: str) -> str:
    return os.path.join(directory, f"{_PREFIX}{key}.{secrets.token_hex(8)}{_SUFFIX}")


def _create(path: str) -> int:
    # A lock needs no write permission: read-only. O_EXCL: a name made meanwhile is not ours.
    fd = os.open(path, _OPEN | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.fchmod(fd, 0o644)  # whatever the umask: others test it
    except OSError:
        pass
    return fd


def _not_ours(info: os.stat_result) -> str | None:
    """Why the file opened is no lock of this user's (None: it is)."""
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != os.geteuid():
        return f"owned by uid {info.st_uid}"
    if info.st_nlink != 1:
        return f"a file of {info.st_nlink} links"
    return None


def _take(path: str) -> tuple[int, str, str | None]:
    """A descriptor of this user's lock at ``path`` (made if missing), else at a fallback name.

    Returns (descriptor, the path it is at, why ``path`` was not used or None); OSError when
    neither can be had.
    """
    try:
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        try:
            return _create(path), path, None
        except FileExistsError:  # made meanwhile: whoever made it, it is not ours to trust
            why = "made by another meanwhile"
    except OSError as error:  # a link (ELOOP), another's private file (EACCES)...
        why = error.strerror or str(error)
    else:
        why = _not_ours(os.fstat(fd))
        if why is None:
            return fd, path, None
        os.close(fd)
    fallback = _fallback_path(os.path.dirname(path), _key_of(path))
    return _create(fallback), fallback, why


def _key_of(path: str) -> str:
    return os.path.basename(path)[len(_PREFIX) : -len(_SUFFIX)]


def fallback_locks(directory: str) -> dict[str, list[str]]:
    """The fallback lock names in ``directory`` by key (one listing), whoever made them."""
    return names_by_key(directory, FALLBACK_LOCK)


def lock_alive(
    directory: str, key: str, owner: int | None = None, fallbacks: Sequence[str] = ()
) -> bool | None:
    """Whether the kernel of ``key`` holds its lock: True alive, False gone, None no lock.

    ``owner``: the UID of the beacon's owner; a lock file of anyone else is no lock (a
    squatter's). None counts any owner's (for a caller that knows none). ``fallbacks``: the
    key's names from :func:`fallback_locks`, asked too. Never blocks, never raises; a lock file
    that is no regular file (or a symlink) is None.
    """
    paths = [lock_path(directory, key)]
    if owner is not None:  # the owner's only: a squatter's look-alikes never crowd them out
        paths += owned_by(directory, list(fallbacks), owner)
    else:
        paths += [os.path.join(directory, name) for name in fallbacks[:MAX_FALLBACKS]]
    answers = [_alive_at(path, owner) for path in paths]
    if True in answers:
        return True
    return False if False in answers else None


def _alive_at(path: str, owner: int | None) -> bool | None:
    try:
        fd = os.open(path, _OPEN)
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (owner is not None and info.st_uid != owner):
            return None
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
    could not take, or took under a fallback name, in ``problems``; never raises. ``paths``
    are the names held or to take (a fallback replaces a squatted name).
    """

    def __init__(self, directories: Iterable[str], key: str) -> None:
        self.paths = [lock_path(d, key) for d in directories]
        self._fds: dict[str, int] = {}
        self.problems: dict[str, str] = {}

    @property
    def held(self) -> list[str]:
        """The paths whose lock this process holds."""
        return list(self._fds)

    def hold(self) -> None:
        """Take each lock not held yet."""
        for number, path in enumerate(self.paths):
            if path in self._fds:
                continue
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd, taken, why = _take(path)
            except (OSError, ValueError) as exc:
                self.problems[path] = getattr(exc, "strerror", None) or str(exc)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:  # held by another (a live kernel of the same key?)
                os.close(fd)
                self.problems[path] = f"held by another process ({exc.strerror or exc})"
                continue
            if why is None:
                self.problems.pop(path, None)
            else:
                self.problems[path] = f"its name is taken ({why}): held as {taken} instead"
                self.paths[number] = taken
            self._fds[taken] = fd

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
