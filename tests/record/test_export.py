"""Cell records as data: `jax_nbmem.cells(frame=True)` and `%jaxmem cells --csv PATH`."""

from __future__ import annotations

import csv
import json
import os
import sys

import pytest

from jax_nbmem.record.export import COLUMNS, NoPandasError, records_frame, write_csv
from jax_nbmem.record.ledger import CellRecord
from tests.ipython_session import run_cells


def record(count: int, **changes) -> CellRecord:
    fields = dict(
        execution_count=count, first_line=f"x = step({count})", started_at=1_700_000_000.0 + count,
        duration_s=0.25, success=True, error=None, oom=False, gpu_count=1,
        gpu_self_before=100, gpu_self_peak=300, gpu_self_after=200,
        jax_in_use_before=10, jax_in_use_peak=30, jax_in_use_after=None, peak_exact=True,
        free_at_start=1000, free_min=900, host_rss_before=5, host_rss_peak=7, host_rss_after=6,
        live_array_bytes_before=None, live_array_bytes_after=None,
        notes=("one", "two"),
    )  # fmt: skip
    fields.update(changes)
    return CellRecord(**fields)


def test_csv_has_every_key_and_leaves_unknowns_empty(tmp_path):
    path = tmp_path / "cells.csv"
    records = [record(1), record(2, success=False, error="ValueError", error_message='a, "b"')]
    assert write_csv(records, path) == 2
    with open(path, newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    assert tuple(rows[0]) == COLUMNS == tuple(records[0].to_dict())
    assert rows[0]["gpu_self_retained"] == "100" and rows[0]["jax_in_use_after"] == ""
    assert rows[0]["jax_retained"] == "" and rows[0]["notes"] == "one; two"
    assert rows[1]["error_message"] == 'a, "b"' and rows[1]["success"] == "False"
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)  # as open() makes files, not mkstemp
    assert [p.name for p in tmp_path.iterdir()] == ["cells.csv"]


def test_csv_to_a_bad_place_leaves_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_csv([record(1)], tmp_path / "missing" / "cells.csv")
    with pytest.raises(IsADirectoryError):
        write_csv([record(1)], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_frame_without_pandas_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(NoPandasError, match="needs pandas, which is not installed here"):
        records_frame([record(1)])


def test_frame_with_pandas_holds_the_records():
    pandas = pytest.importorskip("pandas")
    frame = records_frame([record(1), record(2, gpu_self_after=None)])
    assert isinstance(frame, pandas.DataFrame) and tuple(frame.columns) == COLUMNS
    assert frame["gpu_self_after"].dtype == "Int64"
    assert frame["gpu_self_after"].tolist()[0] == 200 and frame[
        "gpu_self_after"
    ].isna().tolist() == [False, True]
    assert frame["gpu_self_retained"].tolist()[0] == 100
    assert frame["notes"].tolist()[0] == ["one", "two"]


def test_cells_csv_and_frame_in_a_shell(tmp_path):
    path = tmp_path / "out" / "cells.csv"
    path.parent.mkdir()
    outputs = run_cells(
        [
            "%load_ext jax_nbmem",
            "x = 1",
            "1 / 0",
            f"%jaxmem cells --csv {path}",
            f"%jaxmem cells --csv {tmp_path}/nowhere/cells.csv",
            f"%jaxmem cells --json --csv {path}",
            "%jaxmem status --csv x.csv",
            "import jax_nbmem, json\nrecords = jax_nbmem.cells()\n"
            "try:\n    import pandas\nexcept ImportError:\n    print(json.dumps(None))\n"
            "else:\n    frame = jax_nbmem.cells(frame=True)\n"
            "    print(json.dumps([len(frame), list(frame['execution_count'])]))",
        ]
    )
    assert outputs[3].error is None, outputs[3].text
    # The cell that loaded the extension has no record; the one running is not finished.
    assert outputs[3].stdout.strip() == f"wrote 2 cell record(s) to {path}"
    with open(path, newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    assert [row["execution_count"] for row in rows] == ["2", "3"]
    assert rows[1]["error"] == "ZeroDivisionError" and rows[1]["success"] == "False"
    assert outputs[4].error == "UsageError" and "cannot write" in outputs[4].error_text
    assert outputs[5].error == "UsageError" and "not both" in outputs[5].error_text
    assert outputs[6].error == "UsageError" and "--csv does not apply" in outputs[6].error_text
    frame = json.loads(outputs[7].stdout.strip().splitlines()[-1])
    if frame is not None:  # pandas is installed (the test extra has it)
        assert frame == [6, [2, 3, 4, 5, 6, 7]]
