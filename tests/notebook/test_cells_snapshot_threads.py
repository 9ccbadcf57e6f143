"""Issue 46 item 2: a snapshot of the records, taken from any thread, is consecutive, each once.

As the issue measured it: a real IPython shell with the extension, its ledger kept full
(``max_cells = 40``, so every cell's end drops the oldest record), the main thread running cells
back to back while threads call ``jax_nbmem.cells()`` in a loop and others ``jax_nbmem.status()``.
The issue saw 3 snapshots in 322 hold a record twice and lose its neighbour; the threads here
take thousands, with the interpreter switching threads far more often than by default so that
an interleaving that is rare on a quiet machine comes round many times.
"""

import json

from tests.ipython_session import run_cells

CELLS = 3000
MAX_CELLS = 40

START_READERS = f"""
import sys, threading, time, jax_nbmem
sys.setswitchinterval(1e-5)  # hand the GIL round often: the race's window comes round more
_stop, _bad, _errors, _taken = threading.Event(), [], [], [0]

def _read_cells():
    while not _stop.is_set():
        try:
            counts = [r.execution_count for r in jax_nbmem.cells()]
        except Exception as exc:
            _errors.append(repr(exc))
            continue
        _taken[0] += 1
        if len(counts) > {MAX_CELLS} or counts != list(range(counts[0], counts[0] + len(counts))):
            _bad.append(counts)

def _read_status():
    while not _stop.is_set():
        try:
            jax_nbmem.status()
        except Exception as exc:
            _errors.append(repr(exc))
        time.sleep(0.01)

_threads = [threading.Thread(target=_read_cells, daemon=True) for _ in range(4)]
_threads += [threading.Thread(target=_read_status, daemon=True) for _ in range(2)]
for _t in _threads:
    _t.start()
"""

REPORT = """
_stop.set()
for _t in _threads:
    _t.join(30)
sys.setswitchinterval(0.005)
_ledger = [r.execution_count for r in jax_nbmem.cells()]
print(json.dumps({"bad": _bad[:5], "bad_count": len(_bad), "taken": _taken[0],
                  "errors": _errors[:5], "alive": sum(t.is_alive() for t in _threads),
                  "ledger": _ledger}))
"""


def test_snapshots_of_a_full_ledger_from_many_threads_hold_consecutive_records_each_once():
    cells = [
        f"get_ipython().config.JaxNbMem.max_cells = {MAX_CELLS}",
        "%load_ext jax_nbmem",
        "import json",
        START_READERS,
        *["x = 1"] * CELLS,
        REPORT,
    ]
    outputs = run_cells(cells, timeout=600)
    assert all(o.error is None for o in outputs), [o for o in outputs if o.error][:3]
    found = json.loads(outputs[-1].stdout.strip().splitlines()[-1])
    assert found["errors"] == [] and found["alive"] == 0, found
    # Enough snapshots that a race in one of a hundred could not hide.
    assert found["taken"] >= 500, found
    assert found["bad_count"] == 0, found
    ledger = found["ledger"]
    assert len(ledger) == MAX_CELLS and ledger == list(range(ledger[0], ledger[0] + MAX_CELLS))
