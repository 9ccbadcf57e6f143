"""Whatever a user types after %jaxalloc or %jaxmem, the answer is the magic's work or a
UsageError naming the valid forms, and a refused %jaxalloc leaves the environment as it was.

A fixed list of inputs that escaped as internal exceptions once (quotes, other scripts'
digits, NaN, huge numbers), then a few hundred random ones built from the same pieces, all
run in one real IPython shell.
"""

from __future__ import annotations

import json
import random

import pytest

from tests.ipython_session import run_cells

pytestmark = pytest.mark.kernel

KNOWN_BAD = {
    "jaxalloc": [
        '"off',
        "'fraction 0.5",
        "off\\",
        "fraction ０.５",  # fullwidth digits: float() accepts them
        "fraction nan",
        "fraction inf",
        "fraction 1e999",
        "fraction -0",
        "fraction 0.5 0.5",
        "fraction=",
        "off --timeout 5",
        "off --timeout",
        "--bogus",
        "compare",
        "\x1b[2J",
        "of\u202ef",
    ],
    "jaxmem": [
        'top "x',
        "top ¹",
        "top ٣",  # Arabic-Indic three
        "top 0",
        "top 1e3",
        "top 99999999999999999999999999",
        "top 5 6",
        "shutdown ²",
        "shutdown -1",
        "shutdown 4294967296",
        "shutdown",
        "shutdown 1 2",
        "status extra",
        "cells --yes --json x",
        "bogus",
        "--json",
        "'",
        "\\",
        "free",
    ],
}
PIECES = [
    '"', "'", "\\", "０.５", "¹", "²", "٣", "nan", "inf", "-1", "1e999", "9" * 30, "0.3",
    "fraction", "off", "on", "platform", "compare", "top", "status", "cells", "shutdown",
    "--json", "--yes", "--timeout", "--clear-caches", "--bogus", "=", "\x1b[2J", "\u202e", "",
]  # fmt: skip
# Commands the random part leaves out: the panel displays a widget, free deletes names.
LEFT_OUT = ("panel", "free")

FUZZ = """
import json, os
from IPython.core.error import UsageError
_ip = get_ipython()
_cases = json.loads({cases!r})
_outcomes = []
_env = lambda: {{k: v for k, v in os.environ.items() if k.startswith("XLA_")}}
for _magic, _line in _cases:
    _before = _env()
    try:
        _ip.run_line_magic(_magic, _line)
        _outcomes.append([_magic, _line, "ok", True])
    except UsageError as _exc:
        _named = "usage:" in str(_exc) or "valid modes" in str(_exc) or "e.g." in str(_exc)
        _outcomes.append([_magic, _line, "UsageError", _env() == _before and _named])
    except BaseException as _exc:
        _outcomes.append([_magic, _line, type(_exc).__name__, False])
print("@@" + json.dumps(_outcomes))
"""


def random_lines(rng: random.Random, count: int) -> list[list[str]]:
    cases = []
    while len(cases) < count:
        words = rng.choices(PIECES, k=rng.randint(1, 4))
        line = rng.choice(["", " "]).join(words)
        magic = rng.choice(["jaxalloc", "jaxmem"])
        if magic == "jaxmem" and line.split()[:1] and line.split()[0] in LEFT_OUT:
            continue
        cases.append([magic, line])
    return cases


def test_every_input_is_the_magics_work_or_a_usage_error_that_changes_nothing():
    cases = [[magic, line] for magic, lines in KNOWN_BAD.items() for line in lines]
    cases += random_lines(random.Random(20261201), 300)
    out = run_cells(["%load_ext jax_nbmem", FUZZ.format(cases=json.dumps(cases))], timeout=300)
    assert out[1].error is None, out[1].text
    outcomes = json.loads(out[1].stdout.rsplit("@@", 1)[1])
    assert len(outcomes) == len(cases)
    escaped = [o for o in outcomes if o[2] not in ("ok", "UsageError")]
    assert escaped == []
    careless = [o for o in outcomes if o[2] == "UsageError" and not o[3]]
    assert careless == []  # every refusal names the valid forms and changed nothing
    known = {(m, line): kind for m, line, kind, _ in outcomes}
    for magic, lines in KNOWN_BAD.items():
        for line in lines:
            assert known[(magic, line)] == "UsageError", (magic, line)
