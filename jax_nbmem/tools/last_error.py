"""What an error leaves behind: the frames its traceback keeps, and the arrays in their locals.

After a failed cell, Python keeps the last exception (``sys.last_exc`` from 3.12,
``sys.last_value`` and ``sys.last_traceback``; IPython keeps its traceback too), and with it every
frame it passed through: the locals of the function that failed stay alive, device arrays
included, until the next error replaces them. This module finds those frames, names the arrays
they hold (``big in step() (Cell In[5], line 3)``), and releases them on request.

Plain Python: the face hands in whatever holds the error (exceptions, tracebacks) and, for
labels, a function that names a code location (IPython's "Cell In[5]"). JAX is read through
``sys.modules`` only: no JAX imported, no arrays.
"""

from __future__ import annotations

import gc
import os
import sys
import weakref
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from jax_nbmem.gpu import jaxstats
from jax_nbmem.tools.memory import MemoryReading, measure_memory

__all__ = [
    "FRAME_REFERENCES",
    "ErrorFrame",
    "ErrorHold",
    "LastErrorReport",
    "container_items",
    "error_frames",
    "frame_slots",
    "free_last_error",
    "hold_of",
    "release_frames",
    "where_in_file",
]

# How many references one local of a finished function frame makes to its value: the frame's
# own slot, and (before Python 3.13, PEP 667) the f_locals dict that reading f_locals fills.
FRAME_REFERENCES = 2 if sys.version_info < (3, 13) else 1
# A container bigger than this in a frame's locals is not searched item by item.
_CONTAINER_ITEMS = 1000
_MAX_EXCEPTIONS = 100  # a chain of causes and contexts longer than this is cut
_KEY_REPR_LIMIT = 40


def where_in_file(filename: str, lineno: int | None) -> str:
    """The default label of a code location: ``file.py:12``."""
    return f"{os.path.basename(filename) or filename}:{lineno if lineno is not None else '?'}"


@dataclass(frozen=True)
class ErrorFrame:
    """One frame an error keeps alive; ``label`` says where (``step() (Cell In[5], line 3)``)."""

    function: str
    where: str
    frame: FrameType

    @property
    def label(self) -> str:
        """``function() (where)``: how a holder in this frame is named."""
        return f"{self.function}() ({self.where})"


def error_frames(
    holders: Iterable[Any], where: Callable[[str, int | None], str] = where_in_file
) -> list[ErrorFrame]:
    """Every function frame that *holders* keep alive, outermost first, each once.

    *holders* are exceptions and tracebacks (``None`` is skipped). An exception brings its
    traceback, its ``__cause__`` and ``__context__`` and, for an exception group, its members.
    Module-level frames are left out: their locals are a module's (or the notebook's) globals,
    which hold nothing because of the error.
    """
    frames: dict[int, ErrorFrame] = {}
    for traceback in _tracebacks(holders):
        for frame, lineno in _walk(traceback):
            if id(frame) in frames or frame.f_locals is frame.f_globals:
                continue
            code = frame.f_code
            frames[id(frame)] = ErrorFrame(code.co_name, where(code.co_filename, lineno), frame)
    return list(frames.values())


def frame_slots(frame: ErrorFrame) -> Iterator[tuple[str, Any]]:
    """Each local of *frame* as ``(name, value)``; nothing for a frame already cleared."""
    try:
        local_values = dict(frame.frame.f_locals)
    except Exception:  # a frame that cannot show its locals holds nothing we can name
        return
    yield from local_values.items()


@dataclass(frozen=True)
class ErrorHold:
    """The arrays an error's frames held when it was noted, kept by weak reference only.

    ``arrays`` holds ``(weak reference, bytes, label)`` for every JAX array the frames held that
    no name in the namespace held. ``error`` is the exception's type name and ``cell`` the
    execution count of the cell that raised it.
    """

    cell: int | None
    error: str
    arrays: tuple[tuple[Any, int, str], ...]

    @property
    def held_bytes(self) -> int:
        """Bytes of the arrays noted, alive or not."""
        return sum(size for _, size, _ in self.arrays)

    def alive_bytes(self) -> int:
        """Bytes of the noted arrays that are still alive now."""
        return sum(size for ref, size, _ in self.arrays if _alive(ref))

    def labels(self, count: int = 3) -> list[str]:
        """The holders of the largest arrays, largest first."""
        ranked = sorted(self.arrays, key=lambda entry: entry[1], reverse=True)
        return list(dict.fromkeys(label for _, _, label in ranked))[:count]


def hold_of(
    error: BaseException,
    namespace: Mapping[str, Any] | None,
    *,
    cell: int | None = None,
    where: Callable[[str, int | None], str] = where_in_file,
) -> ErrorHold | None:
    """Note which JAX arrays *error*'s frames hold and no name in *namespace* does.

    Cheap enough for a failed cell's path: it reads the frames' locals (one level into lists,
    tuples and dicts), never ``jax.live_arrays()``. None when JAX is not imported.
    """
    array_type = _array_type()
    if array_type is None:
        return None
    named = _names_by_id(namespace or {}, array_type)
    found = _frame_arrays(error_frames([error], where), array_type, leave_out=named)
    return ErrorHold(cell, type(error).__name__, tuple(found.values()))


@dataclass(frozen=True)
class LastErrorReport:
    """What ``free_last_error`` did: frames cleared, arrays released, memory before and after.

    ``released_*`` count the arrays the frames held that are gone now; ``kept`` lists those
    still alive because something else holds them too, as ``(holder in the frame, bytes,
    names that hold it)``; no names means an unnamed holder (an object, a closure, a cache).
    ``live_bytes_*`` is the sum over ``jax.live_arrays()`` (``None`` before JAX starts); the
    ``before``/``after`` readings are JAX's ``bytes_in_use`` and this process's GPU bytes,
    ``None`` where they cannot be read (the CPU backend, no NVML).
    """

    frames: int
    released_arrays: int
    released_bytes: int
    kept: tuple[tuple[str, int, tuple[str, ...]], ...]
    before: MemoryReading
    after: MemoryReading
    live_bytes_before: int | None
    live_bytes_after: int | None

    @property
    def live_bytes_returned(self) -> int | None:
        """Drop in the live arrays' bytes, or None when they could not be summed."""
        if self.live_bytes_before is None or self.live_bytes_after is None:
            return None
        return self.live_bytes_before - self.live_bytes_after


def free_last_error(
    frames: list[ErrorFrame],
    namespace: Mapping[str, Any] | None = None,
    *,
    measure: Callable[[], MemoryReading] | None = None,
) -> LastErrorReport:
    """Clear *frames* (see :func:`release_frames`) and report what came back.

    *measure* reads memory before and after (default: :func:`~.memory.measure_memory`:
    JAX's bytes in use and this process's GPU bytes per NVML).
    """
    measure = measure or measure_memory
    array_type = _array_type()
    held = _frame_arrays(frames, array_type) if array_type is not None else {}
    names = _names_by_id(namespace or {}, array_type) if array_type is not None else {}
    before, live_before = measure(), jaxstats.live_array_bytes()
    cleared = release_frames(frames)
    after, live_after = measure(), jaxstats.live_array_bytes()
    released = [size for ref, size, _ in held.values() if not _alive(ref)]
    kept = tuple(
        (label, size, tuple(names.get(array_id, ())))
        for array_id, (ref, size, label) in held.items()
        if _alive(ref)
    )
    return LastErrorReport(
        frames=cleared,
        released_arrays=len(released),
        released_bytes=sum(released),
        kept=kept,
        before=before,
        after=after,
        live_bytes_before=live_before,
        live_bytes_after=live_after,
    )


def release_frames(frames: Iterable[ErrorFrame]) -> int:
    """Clear the locals of *frames* (``frame.clear()``); return how many were cleared.

    A frame still running (a suspended generator's, say) is left alone. A garbage collection
    follows, so that arrays caught in reference cycles with those locals go too.
    """
    cleared = 0
    for entry in frames:
        try:
            entry.frame.clear()
            # Before Python 3.13 the f_locals dict (filled whenever f_locals was read) keeps its
            # values past clear(); reading f_locals again syncs it with the now empty frame.
            entry.frame.f_locals  # noqa: B018
            cleared += 1
        except RuntimeError:  # "cannot clear an executing frame"
            continue
    gc.collect()
    return cleared


def _tracebacks(holders: Iterable[Any]) -> Iterator[TracebackType]:
    seen: set[int] = set()
    pending = [h for h in holders if h is not None]
    while pending and len(seen) < _MAX_EXCEPTIONS:
        item = pending.pop(0)
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, TracebackType):
            yield item
        elif isinstance(item, BaseException):
            pending.extend(
                h for h in (item.__traceback__, item.__cause__, item.__context__) if h is not None
            )
            pending.extend(getattr(item, "exceptions", ()) or ())  # an exception group


def _walk(traceback: TracebackType | None) -> Iterator[tuple[FrameType, int | None]]:
    while traceback is not None:
        yield traceback.tb_frame, traceback.tb_lineno
        traceback = traceback.tb_next


def container_items(name: str, container: Any) -> Iterator[tuple[str, Any]]:
    """A list's, tuple's or dict's items, labelled as ``d['k']`` or ``lst[1]``.

    One labelling for every holder jax_nbmem names (``top``, ``free``, the error's frames).
    """
    if isinstance(container, dict):
        for key, item in list(container.items()):
            yield f"{name}[{_key_repr(key)}]", item
    else:
        for index, item in enumerate(container):
            yield f"{name}[{index}]", item


def _key_repr(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= _KEY_REPR_LIMIT else text[: _KEY_REPR_LIMIT - 1] + "…"


def _with_items(name: str, value: Any) -> Iterator[tuple[str, Any]]:
    """The value itself, then the items of a list, tuple or dict one level down.

    Containers larger than ``_CONTAINER_ITEMS`` are not searched: this runs after a failed
    cell, on its path.
    """
    yield name, value
    if isinstance(value, (dict, list, tuple)) and len(value) <= _CONTAINER_ITEMS:
        yield from container_items(name, value)


def _frame_arrays(
    frames: Iterable[ErrorFrame], array_type: type, leave_out: Container[int] = frozenset()
) -> dict[int, tuple[Any, int, str]]:
    """The JAX arrays in *frames*' locals by id, as ``(weak reference, bytes, holder)``.

    Only weak references leave this function, so the caller keeps no array alive.
    """
    found: dict[int, tuple[Any, int, str]] = {}
    for frame in frames:
        for name, value in frame_slots(frame):
            for label, item in _with_items(name, value):
                if not isinstance(item, array_type) or id(item) in leave_out or id(item) in found:
                    continue
                size = _nbytes(item)
                if size is not None:
                    found[id(item)] = (weakref.ref(item), size, f"{label} in {frame.label}")
    return found


def _names_by_id(namespace: Mapping[str, Any], array_type: type) -> dict[int, list[str]]:
    """The labels (``x``, ``d['k']``) under which *namespace* holds each JAX array, by id."""
    named: dict[int, list[str]] = {}
    for name, value in list(namespace.items()):
        if value is namespace:
            continue
        for label, item in _with_items(name, value):
            if isinstance(item, array_type):
                named.setdefault(id(item), []).append(label)
    return named


def _array_type() -> type | None:
    jax = sys.modules.get("jax")
    array_type = getattr(jax, "Array", None) if jax is not None else None
    return array_type if isinstance(array_type, type) else None


def _nbytes(array: Any) -> int | None:
    try:
        return None if array.is_deleted() else int(array.nbytes)
    except Exception:
        return None


def _alive(ref: Any) -> bool:
    array = ref()
    return array is not None and _nbytes(array) is not None
