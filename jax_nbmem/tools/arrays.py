"""Which live JAX arrays are largest and who names them; freeing arrays by name.

The core of ``%jaxmem top`` and ``%jaxmem free``; the user's namespace comes in as a plain
mapping, and IPython's output history is known by its names (``Out``, ``_oh``, ``_``, ``_12``).
JAX is read through ``sys.modules`` only once the user's code has started its backend.

Who holds an array: every name (private ones too), the items of a list, tuple or dict one level
below a name, and ``Out[N]`` (one level down as well). Other holders (an object's attribute, a
closure, another module, deeper nesting, JAX's caches) cannot be named, but CPython's reference
count shows them. The frames the last error keeps alive (``tools.last_error``) are holders
too: their locals are named ``big in step() (Cell In[5], line 3)``. Array objects sharing one
device buffer (``unsafe_buffer_pointer``) count as one array: on the CPU backend, printing an
array makes such a twin.

The rule for freeing: ``free_names`` calls ``Array.delete()`` only when every reference to the
array, and to each twin on its buffer, is one of the names being freed (or their containers).
Otherwise the name is kept whole and its holders are said, because deleting a buffer that is
still held makes its holder's next use fail with "Array has been deleted".
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jax_nbmem.gpu import jaxstats
from jax_nbmem.tools.last_error import (
    FRAME_REFERENCES,
    ErrorFrame,
    container_items,
    frame_slots,
)
from jax_nbmem.tools.memory import MemoryReading, measure_memory

__all__ = [
    "ArrayRow",
    "FreeReport",
    "MemoryReading",
    "NameOutcome",
    "TopReport",
    "free_names",
    "measure_memory",
    "top_arrays",
]

# Names IPython keeps for its output history; the arrays they hold are "history", not names.
_HISTORY_NAMES = frozenset({"_", "__", "___", "_oh"})
_HISTORY_NUMBERED = re.compile(r"^_\d+$")
_OUTPUT_CACHE = "Out"
_CONTAINERS = (list, tuple, dict)


@dataclass(frozen=True)
class ArrayRow:
    """One live array. Byte counts are ``None`` where JAX could not tell them.

    ``nbytes`` is the logical size; ``shard_bytes`` sums ``nbytes`` over the shards on this
    host's devices (larger than ``nbytes`` for a replicated array); ``on_device_bytes`` is
    ``on_device_size_in_bytes()`` (with padding and tiling). ``names`` are the user's names
    for it (``w``, ``params['w']``, ``batch[0]``); ``history`` its entries in IPython's
    output history (``Out[12]``); ``frames`` the locals of the last error's frames that hold
    it (``big in step() (Cell In[5], line 3)``).
    """

    shape: tuple[int, ...]
    dtype: str
    devices: tuple[str, ...]
    nbytes: int | None
    shard_bytes: int | None
    on_device_bytes: int | None
    names: tuple[str, ...]
    history: tuple[str, ...]
    frames: tuple[str, ...] = ()

    @property
    def size_bytes(self) -> int:
        """The best size known: on-device, else per-shard total, else logical, else 0."""
        for value in (self.on_device_bytes, self.shard_bytes, self.nbytes):
            if value is not None:
                return value
        return 0


@dataclass(frozen=True)
class TopReport:
    """The largest live arrays. ``available`` is False (with ``reason``) before JAX starts.

    ``unnamed_*`` count arrays that neither a name, the output history nor the last error's
    frames hold; ``history_only_*`` those that only IPython's output history holds (a common
    leak); ``error_only_*`` those that only the last error's frames hold (no name, no history).
    """

    available: bool
    reason: str | None = None
    rows: tuple[ArrayRow, ...] = ()
    live_count: int = 0
    live_bytes: int = 0
    unnamed_count: int = 0
    unnamed_bytes: int = 0
    history_only_count: int = 0
    history_only_bytes: int = 0
    error_only_count: int = 0
    error_only_bytes: int = 0


@dataclass(frozen=True)
class NameOutcome:
    """What ``free`` did with one name: ``status`` is ``freed``, ``kept`` or ``invalid``.

    ``kept`` names hold arrays that something else also holds (``held_by`` lists it);
    ``invalid`` names do not exist or hold no JAX array (``reason`` says which).
    """

    name: str
    status: str
    reason: str | None = None
    arrays: int = 0
    bytes: int = 0
    held_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class FreeReport:
    """The outcome of ``free_names``: one entry per name asked for, and memory before/after."""

    outcomes: tuple[NameOutcome, ...]
    caches_cleared: bool
    deleted_arrays: int
    deleted_bytes: int
    before: MemoryReading
    after: MemoryReading

    @property
    def any_valid(self) -> bool:
        """Whether at least one name held JAX arrays (the magic refuses when none did)."""
        return any(o.status != "invalid" for o in self.outcomes)


@dataclass
class _Holders:
    """Every slot in the namespace that refers to a live array, keyed by ``id(array)``.

    ``labels`` holds ``(label, kind, top-level name, id of the container or None)``. The
    containers are kept (``containers``) so that their own outside references can be counted.
    """

    live: dict[int, Any]
    labels: dict[int, list[tuple[str, str, str, int | None]]] = field(default_factory=dict)
    slots: dict[int, int] = field(default_factory=dict)  # references we can name
    outside: dict[int, int] = field(default_factory=dict)  # references we cannot
    containers: dict[int, Any] = field(default_factory=dict)
    twins: dict[int, list[int]] = field(default_factory=dict)  # arrays on the same buffer


def top_arrays(
    namespace: Mapping[str, Any], n: int = 10, *, frames: Sequence[ErrorFrame] = ()
) -> TopReport:
    """Return the *n* largest live JAX arrays with the names in *namespace* that hold them.

    *frames*: the frames the last error keeps (``tools.last_error.error_frames``), whose
    locals are named as holders too. Never starts JAX: before the user's code has started the
    backend the report is empty and ``reason`` says so.
    """
    reason = _not_ready_reason()
    if reason is not None:
        return TopReport(available=False, reason=reason)
    holders = _scan(namespace, frames)
    # Every array is sized and classified, but only the rows shown are described: reading an
    # array's shape, dtype and devices costs more than all the rest, times 20,000 arrays.
    found = []
    for group in _unique_groups(holders):
        if len(group) == 1:
            labels = holders.labels.get(group[0], ())
        else:
            labels = [entry for array_id in group for entry in holders.labels.get(array_id, [])]
        names: list[str] = []
        in_frames: list[str] = []
        history: list[str] = []
        for entry in labels:  # most arrays have one label or none: no generators here
            kind = entry[1]
            if kind == "name":
                names.append(entry[0])
            elif kind == "frame":
                in_frames.append(entry[0])
            elif kind == "history":
                history.append(entry[0])
        if history:
            history = _history_labels(labels)
        array = holders.live[group[0]]
        found.append((_size_of(array), array, _unique(names), history, _unique(in_frames)))
    holders.live.clear()
    found.sort(key=lambda entry: entry[0], reverse=True)
    rows = [_describe(*entry[1:]) for entry in found[: max(0, n)]]
    sizes: dict[str, list[int]] = {"unnamed": [], "history": [], "error": []}
    for size, _, names, history, in_frames in found:
        if names:
            continue
        if history:
            sizes["history"].append(size)
        elif in_frames:
            sizes["error"].append(size)
        else:
            sizes["unnamed"].append(size)
    live_count, live_bytes = len(found), sum(entry[0] for entry in found)
    del found
    return TopReport(
        available=True,
        rows=tuple(rows),
        live_count=live_count,
        live_bytes=live_bytes,
        unnamed_count=len(sizes["unnamed"]),
        unnamed_bytes=sum(sizes["unnamed"]),
        history_only_count=len(sizes["history"]),
        history_only_bytes=sum(sizes["history"]),
        error_only_count=len(sizes["error"]),
        error_only_bytes=sum(sizes["error"]),
    )


def free_names(
    namespace: MutableMapping[str, Any],
    names: Sequence[str],
    *,
    clear_caches: bool = False,
    measure: Callable[[], MemoryReading] = measure_memory,
    frames: Sequence[ErrorFrame] = (),
) -> FreeReport:
    """Delete *names* from *namespace* and the device buffers of the arrays they alone hold.

    A name may hold an array or a list/tuple/dict of arrays (one level down). A name is freed
    as a whole or not at all: if any of its arrays is held by another name, container, output
    history entry or anything outside the namespace, the name and its arrays are kept. With
    *clear_caches*, ``jax.clear_caches()`` runs first, so arrays that only compiled functions
    held (as constants) can be freed too. *frames* (the last error's) are named as holders.
    """
    jax = sys.modules.get("jax") if _not_ready_reason() is None else None
    before = measure()
    if jax is not None and clear_caches:
        jax.clear_caches()  # first: compiled functions holding an array as a constant let go
    asked = list(dict.fromkeys(names))
    holders = _scan(namespace, frames) if jax is not None else _Holders({})
    _count_outside(holders)
    outcomes = [_judge(namespace, name, set(asked), holders) for name in asked]
    doomed = {array_id for outcome, ids in outcomes for array_id in ids}
    deleted_bytes = sum(_nbytes(holders.live[i]) or 0 for i in doomed)
    for array_id in doomed:
        holders.live[array_id].delete()
    for outcome, _ in outcomes:
        if outcome.status == "freed":
            del namespace[outcome.name]
    holders.live.clear()
    holders.containers.clear()
    return FreeReport(
        outcomes=tuple(outcome for outcome, _ in outcomes),
        caches_cleared=jax is not None and clear_caches,
        deleted_arrays=len(doomed),
        deleted_bytes=deleted_bytes,
        before=before,
        after=measure(),
    )


def _judge(
    namespace: Mapping[str, Any], name: str, asked: set[str], holders: _Holders
) -> tuple[NameOutcome, list[int]]:
    """Decide one name's fate; return the outcome and, if freed, the ids of its arrays."""
    if name not in namespace:
        return NameOutcome(name, "invalid", reason="no such name"), []
    value = namespace[name]
    if name in (_OUTPUT_CACHE, "_oh") and value is namespace.get(_OUTPUT_CACHE):
        return NameOutcome(name, "invalid", reason="IPython's output history: %reset -f out"), []
    array_ids = _array_ids(value, holders.live)
    if not array_ids:
        if _is_deleted(value):
            return NameOutcome(name, "invalid", reason="its array is already deleted"), []
        what = "holds no JAX array" if isinstance(value, _CONTAINERS) else "is not a JAX array"
        return NameOutcome(name, "invalid", reason=f"{what} (it is a {type(value).__name__})"), []
    held_by: list[str] = []
    for array_id in array_ids:
        for member in sorted(holders.twins[array_id], key=lambda m: m != array_id):
            held_by.extend(_holders_of(holders, member, asked, alias=member != array_id))
    total = sum(_nbytes(holders.live[i]) or 0 for i in array_ids)
    if held_by:
        shown = tuple(_unique(held_by))
        return NameOutcome(name, "kept", "also held elsewhere", len(array_ids), total, shown), []
    return NameOutcome(name, "freed", None, len(array_ids), total), array_ids


def _holders_of(holders: _Holders, array_id: int, asked: set[str], alias: bool) -> list[str]:
    """Say what, besides the names in *asked*, holds this array (or an alias of its buffer)."""
    entries = holders.labels.get(array_id, [])
    found = _plain_labels([entry for entry in entries if entry[2] not in asked])
    for _, _, root, container in entries:
        # A container someone else also holds keeps its items reachable through them.
        if container is not None and holders.outside.get(container, 0) > 0:
            found.append(f"{root} (a container also held from outside the namespace)")
    outside = holders.outside.get(array_id, 0)
    if outside > 0 and alias:
        found.append("another Array object on the same device buffer")
    elif outside > 0:
        found.append(f"{outside} reference(s) from outside the namespace")
    return found


def _group_twins(live: Mapping[int, Any]) -> dict[int, list[int]]:
    """Map each live array to the arrays on its device buffer (itself included)."""
    groups: dict[Any, list[int]] = {}
    for array_id, array in live.items():
        try:
            key: Any = (array.platform(), array.unsafe_buffer_pointer())
        except Exception:  # sharded or deleted arrays have no single pointer: alone
            key = array_id
        groups.setdefault(key, []).append(array_id)
    return {array_id: group for group in groups.values() for array_id in group}


def _unique_groups(holders: _Holders) -> list[list[int]]:
    return list({id(group): group for group in holders.twins.values()}.values())


def _count_outside(holders: _Holders) -> None:
    """Count references to each array and container that are not namespace slots or ours.

    Called when our only reference is in ``holders``. The fixed overhead (that dict,
    ``getrefcount``'s argument) is measured on a probe held the same way, so the count does not
    depend on the interpreter's conventions.
    """
    probes = {0: object()}
    overhead = sys.getrefcount(probes[0])
    for kept in (holders.live, holders.containers):
        for key in kept:
            holders.outside[key] = sys.getrefcount(kept[key]) - overhead - holders.slots.get(key, 0)


def _scan(namespace: Mapping[str, Any], frames: Sequence[ErrorFrame] = ()) -> _Holders:
    """Find every slot that holds a live array: names, items, history, error frames' locals."""
    holders = _Holders(_live_arrays())
    holders.twins = _group_twins(holders.live)
    output_cache = namespace.get(_OUTPUT_CACHE)
    for name, value in _slots(namespace, output_cache):
        _add_slot(holders, name, name, _kind_of(name), value)
    for frame in frames:
        for name, value in frame_slots(frame):
            suffix = f" in {frame.label}"
            _add_slot(holders, name, name + suffix, "frame", value, FRAME_REFERENCES, suffix)
    return holders


def _add_slot(
    holders: _Holders,
    name: str,
    root: str,
    kind: str,
    value: Any,
    references: int = 1,
    suffix: str = "",
) -> None:
    """Note one slot's array, or the arrays of the container in it (one level down).

    *references*: how many references the slot itself makes to its value (a frame's local
    makes two before Python 3.13); a container's items are referred to once, by it.
    *suffix* follows every label (`` in step() (Cell In[5], line 3)``).
    """
    if id(value) in holders.live:
        holders.labels.setdefault(id(value), []).append((name + suffix, kind, root, None))
        holders.slots[id(value)] = holders.slots.get(id(value), 0) + references
    elif isinstance(value, _CONTAINERS):
        container = id(value)
        first_time = container not in holders.containers
        found = False
        for label, item in container_items(name, value):
            if id(item) in holders.live:
                found = True
                entry = (label + suffix, kind, root, container)
                holders.labels.setdefault(id(item), []).append(entry)
                if first_time:  # one reference per item, however many names reach it
                    holders.slots[id(item)] = holders.slots.get(id(item), 0) + 1
        if found:
            holders.containers[container] = value
            holders.slots[container] = holders.slots.get(container, 0) + references


def _slots(namespace: Mapping[str, Any], output_cache: Any) -> Iterator[tuple[str, Any]]:
    """Top-level slots: every name, with ``Out``'s entries standing in for ``Out`` itself."""
    for name, value in list(namespace.items()):
        if value is namespace:  # e.g. `ns = get_ipython().user_ns`: the names themselves
            continue
        if value is output_cache and name in (_OUTPUT_CACHE, "_oh") and isinstance(value, dict):
            if name == _OUTPUT_CACHE:
                for number, entry in list(value.items()):
                    yield f"{_OUTPUT_CACHE}[{number}]", entry
            continue
        yield name, value


def _array_ids(value: Any, live: Mapping[int, Any]) -> list[int]:
    if id(value) in live:
        return [id(value)]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return list(dict.fromkeys(id(item) for item in value if id(item) in live))
    return []


def _kind_of(name: str) -> str:
    history = name.startswith(f"{_OUTPUT_CACHE}[") or name in _HISTORY_NAMES
    if history or _HISTORY_NUMBERED.match(name):
        return "history"
    return "private" if name.startswith("_") else "name"


def _history_labels(labels: list[tuple[str, str, str, int | None]]) -> list[str]:
    """``Out[N]`` entries, or the ``_``-style names when the array is not in ``Out``."""
    history = [label for label, kind, _, _ in labels if kind == "history"]
    from_out = [label for label in history if label.startswith(f"{_OUTPUT_CACHE}[")]
    return _unique(from_out or history)


def _plain_labels(labels: list[tuple[str, str, str, int | None]]) -> list[str]:
    """Names (private ones too), then output history without ``_``/``_N`` duplicates."""
    named = [label for label, kind, _, _ in labels if kind != "history"]
    return _unique([*named, *_history_labels(labels)])


def _live_arrays() -> dict[int, Any]:
    """Live arrays of every started backend by ``id``; empty if JAX cannot list them."""
    jax = sys.modules.get("jax")
    live: dict[int, Any] = {}
    for platform in jaxstats.initialized_platforms() or (None,):
        try:
            arrays = jax.live_arrays(platform) if platform else jax.live_arrays()
        except Exception:  # a platform JAX lists but cannot enumerate: skip it
            continue
        for array in arrays:
            if not _is_deleted(array):
                live[id(array)] = array
        del arrays
    return live


def _size_of(array: Any) -> int:
    """An array's size as :attr:`ArrayRow.size_bytes` gives it, read in the same order."""
    try:
        return int(array.on_device_size_in_bytes())  # the usual case, and the cheapest
    except Exception:
        pass
    for read in (
        lambda: sum(int(s.data.nbytes) for s in array.addressable_shards),
        lambda: int(array.nbytes),
    ):
        value = _or_none(read)
        if value is not None:
            return value
    return 0


def _describe(
    array: Any, names: Sequence[str], history: Sequence[str], frames: Sequence[str] = ()
) -> ArrayRow:
    """Read one array's shape, dtype, devices and sizes; what JAX cannot say is ``None``."""
    devices = _or_none(lambda: sorted(array.devices(), key=lambda d: (str(d.platform), d.id)))
    return ArrayRow(
        shape=tuple(int(d) for d in getattr(array, "shape", ())),
        dtype=str(getattr(array, "dtype", "?")),
        devices=tuple(f"{d.platform}:{d.id}" for d in devices or ()),
        nbytes=_nbytes(array),
        shard_bytes=_or_none(lambda: sum(int(s.data.nbytes) for s in array.addressable_shards)),
        on_device_bytes=_or_none(lambda: int(array.on_device_size_in_bytes())),
        names=tuple(names),
        history=tuple(history),
        frames=tuple(frames),
    )


def _or_none(read: Callable[[], Any]) -> Any:
    """Return ``read()``, or ``None`` when JAX cannot say (older release, deleted array)."""
    try:
        return read()
    except Exception:
        return None


def _not_ready_reason() -> str | None:
    if "jax" not in sys.modules:
        return "JAX is not imported in this process, so there are no JAX arrays"
    if not jaxstats.backend_initialized():
        return "JAX's backend has not started yet (no arrays made); it was left unstarted"
    return None


def _nbytes(array: Any) -> int | None:
    return _or_none(lambda: int(array.nbytes))


def _is_deleted(value: Any) -> bool:
    try:
        return bool(value.is_deleted()) if hasattr(value, "is_deleted") else False
    except Exception:
        return False


def _unique(labels: Any) -> list[str]:
    if isinstance(labels, list) and len(labels) < 2:
        return labels
    return list(dict.fromkeys(labels))
