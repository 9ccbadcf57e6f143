"""Metric families as Prometheus's text format (0.0.4), as prometheus_client writes it, fast.

:func:`exposition` writes the same bytes as prometheus_client's ``generate_latest`` would for
the same families (labels sorted by name, values by ``floatToGoString``'s rules, ``# HELP``
escaped as it escapes it), without its per-sample checks: a node's 8 GPUs x 200 processes are
~11,000 samples, and its generic writer takes ~7x as long (``benchmarks/scrape.py``). What makes
it fast: a process's label set is written once for all the families that carry it, and each
distinct value once.

:class:`ScrapeCache` keeps the text of the snapshot being served: a scrape that comes again
before the next snapshot (a second Prometheus, a person's ``curl``) writes nothing anew, and a
``name[]`` filter renders only the families it asks for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from functools import cache

from jax_nbmem.metrics.metrics import FAMILIES, Family, Snapshot, is_fresh, metric_families

__all__ = ["ScrapeCache", "exposition", "go_float"]

_INF = float("inf")
_EXACT = 2**53  # an int below this is exactly a float, and its repr is "N.0"


def _go_int(value: int) -> str:
    """An int from 1e6 to 2**53 as Go writes its float: ``1.073741824e+09``."""
    digits = str(value)
    kept = digits.rstrip("0")
    mantissa = f"{kept[0]}.{kept[1:]}" if len(kept) > 1 else kept
    return f"{mantissa}e+{len(digits) - 1:02d}"


def go_float(value: float) -> str:
    """*value* as Prometheus's text writes it (prometheus_client's ``floatToGoString``).

    Python's shortest repr, but with an exponent from 1e+06 on, as Go writes it.
    """
    if type(value) is int and 0 < value < _EXACT:  # bytes, mostly: no float to take apart
        return f"{value}.0" if value < 1_000_000 else _go_int(value)
    value = float(value)
    if value == _INF:
        return "+Inf"
    if value == -_INF:
        return "-Inf"
    if value != value:
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _value_text(value: float) -> bytes:
    """The end of a sample's line: a space, the value, a newline."""
    if type(value) is int and 1_000_000 <= value < _EXACT:
        return f" {_go_int(value)}\n".encode()
    return f" {go_float(value)}\n".encode()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _label_writer(names: tuple[str, ...]):
    """A function from label values (strings, in ``names``' order) to ``b'{a="…",b="…"}'``."""
    if not names:
        return lambda values: b""
    order = sorted(range(len(names)), key=names.__getitem__)  # prometheus_client sorts them
    template = "{{" + ",".join(f'{names[i]}="{{{i}}}"' for i in order) + "}}"
    fill = template.format

    def write(values: tuple[str, ...]) -> bytes:
        joined = "".join(values)
        if "\\" in joined or '"' in joined or "\n" in joined:
            return fill(*[_escape(v) for v in values]).encode()
        return fill(*values).encode()  # nearly every label set: nothing to escape

    return write


@cache
def _header(name: str) -> bytes:
    help_text = FAMILIES[name].replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {help_text}\n# TYPE {name} gauge\n".encode()


class _Writer:
    r"""Writes families as bytes; a label set or value seen once is not written again.

    A line is the family's name, then its labels, then its value: the labels and the value
    are each written once into bytes (``b'{…}'``, ``b' 1.5e+09\n'``) and every line is the
    name joining them, so the text is never a ``str`` (one "…" in a notebook's name would make
    all of it a wide string, slow to build and to encode). A writer kept from one snapshot to
    the next reuses what it wrote: a process's labels rarely change between two snapshots, nor
    most of its figures.
    """

    def __init__(self) -> None:
        self._labels: dict[tuple[str, ...], dict[tuple[str, ...], bytes]] = {}
        self._values: dict[float, bytes] = {}

    def kept(self) -> int:
        """How many texts it keeps (label sets and values)."""
        return len(self._values) + sum(map(len, self._labels.values()))

    def family(self, family: Family) -> bytes:
        if not family.samples:
            return _header(family.name)
        labels = self._labels.setdefault(family.labels, {})
        values, samples = self._values, family.samples
        # What is not written yet, written first, in one pass each (no call per lookup after).
        new_labels = {v for v, _ in samples if v not in labels}
        if new_labels:
            write = _label_writer(family.labels)
            for v in new_labels:
                labels[v] = write(v)
        for x in {x for _, x in samples if x not in values}:
            values[x] = _value_text(x)
        name = family.name.encode()
        # A zero apart: 0.0 and -0.0 are one key of a dict but two texts.
        rests = [labels[v] + (values[x] if x else _value_text(x)) for v, x in samples]
        return b"".join((_header(family.name), name, name.join(rests)))


def exposition(families: Iterable[Family], names: set[str] | None = None) -> bytes:
    """The families in Prometheus's text format; ``names``: only these (``name[]=…``)."""
    writer = _Writer()
    return b"".join(writer.family(f) for f in families if names is None or f.name in names)


class ScrapeCache:
    """The text of the snapshot now served, kept until another is served or it goes stale.

    :meth:`text` is what a scrape answers: the families of ``latest()``'s snapshot (its
    freshness judged at each call), written at most once per snapshot and freshness, and a
    family only once someone asks for it. Safe to call from several threads.
    """

    def __init__(self, stale_after_s: float = float("inf")) -> None:
        self.stale_after_s = stale_after_s
        self._lock = threading.Lock()
        self._key: tuple[Snapshot | None, bool] | None = None
        self._families: list[Family] = []
        self._texts: dict[str, bytes] = {}
        self._whole: bytes | None = None
        self._writer = _Writer()
        self.writes = 0  # how many times the families were built (for tests and benchmarks)

    def text(
        self,
        snapshot: Snapshot | None,
        names: set[str] | None = None,
        *,
        now: float | None = None,
        looking_since: float | None = None,
    ) -> bytes:
        """``snapshot``'s families as text (``names``: only these), from what is kept if it can.

        ``looking_since``: when the look under way began (see :func:`.metrics.is_fresh`).
        """
        now = time.time() if now is None else now
        key = (snapshot, is_fresh(snapshot, now, self.stale_after_s, looking_since))
        with self._lock:
            if self._key is None or self._key[0] is not snapshot or self._key[1] != key[1]:
                stale_after_s = self.stale_after_s
                self._families = metric_families(
                    snapshot, now=now, stale_after_s=stale_after_s, looking_since=looking_since
                )
                self._key, self._texts, self._whole = key, {}, None
                # The writer is kept (the last snapshots' texts reused) until what it keeps
                # outgrows a few snapshots' worth: values that changed since, processes gone.
                samples = sum(len(family.samples) for family in self._families)
                if self._writer.kept() > 4 * samples + 1024:
                    self._writer = _Writer()
                self.writes += 1
            if names is None and self._whole is not None:
                return self._whole
            parts = []
            for family in self._families:
                if names is None or family.name in names:
                    text = self._texts.get(family.name)
                    if text is None:
                        text = self._texts[family.name] = self._writer.family(family)
                    parts.append(text)
            joined = b"".join(parts)
            if names is None:
                self._whole, self._texts = joined, {}  # the whole kept once, not twice
            return joined
