"""Cell records as data: a pandas DataFrame, or a CSV file.

The columns are :meth:`CellRecord.to_dict`'s keys, in its order: every field, then the
``*_retained`` differences. A value that could not be measured stays missing (``None`` in the
frame, an empty field in the CSV), never 0. pandas is imported only when a frame is asked for.
"""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from jax_nbmem.record.ledger import CellRecord

__all__ = ["COLUMNS", "NoPandasError", "records_frame", "write_csv"]

COLUMNS: tuple[str, ...] = (
    *(f.name for f in fields(CellRecord)),
    "gpu_self_retained",
    "jax_retained",
    "host_rss_retained",
)


class NoPandasError(ImportError):
    """``cells(frame=True)`` was asked for where pandas is not installed."""


def records_frame(records: Sequence[CellRecord]) -> Any:
    """The records as a ``pandas.DataFrame``, one row per cell, :data:`COLUMNS` as columns.

    Raises:
        NoPandasError: pandas is not installed (``pip install pandas``); the records are
            still there as ``cells()`` and ``%jaxmem cells --csv PATH``.
    """
    try:
        import pandas
    except ImportError:
        raise NoPandasError(
            "jax_nbmem.cells(frame=True) needs pandas, which is not installed here: "
            "`pip install pandas`, or use jax_nbmem.cells() (records with to_dict()) or "
            "`%jaxmem cells --csv PATH`"
        ) from None
    rows = [record.to_dict() for record in records]
    frame = pandas.DataFrame.from_records(rows, columns=list(COLUMNS))
    # Byte counts with a gap would turn into floats (NaN): keep them whole, with <NA> gaps.
    for name in COLUMNS:
        if name.endswith(("_before", "_peak", "_after", "_retained", "_start", "_min")):
            frame[name] = frame[name].astype("Int64")
    return frame


def write_csv(records: Sequence[CellRecord], path: str | os.PathLike[str]) -> int:
    """Write the records to *path* as CSV (header :data:`COLUMNS`); return the rows written.

    The file appears whole or not at all: it is written beside *path* and renamed over it.
    ``notes`` are joined with "; ". Raises OSError (with the reason) when *path* cannot be
    written; nothing is left behind then.
    """
    target = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(target)
    if os.path.isdir(target):
        raise IsADirectoryError(f"{target} is a directory")
    descriptor, temporary = tempfile.mkstemp(prefix=".jax_nbmem-", suffix=".csv", dir=directory)
    try:
        os.chmod(temporary, 0o666 & ~_umask())  # as open() would make it, not mkstemp's 0600
        with os.fdopen(descriptor, "w", newline="", encoding="utf-8") as stream:
            writer = csv.writer(stream)
            writer.writerow(COLUMNS)
            for record in records:
                data = record.to_dict()
                data["notes"] = "; ".join(data["notes"])
                writer.writerow(["" if data[name] is None else data[name] for name in COLUMNS])
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return len(records)


def _umask() -> int:
    """This process's umask, read without changing it (os.umask would, for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
