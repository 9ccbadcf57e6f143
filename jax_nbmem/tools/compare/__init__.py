"""``%%jaxalloc compare``: the same cell once per allocator mode, each in a fresh process.

`run` starts the subprocesses (`child` is what runs in each) and gathers their `results`;
`advice` picks the mode to recommend; `report` says it all as a table and a bar chart.
"""

# Here rather than in `run` (which re-exports it): the magics' help says it, and loading the
# extension should not import the code that starts the subprocesses (issue 38).
DEFAULT_TIMEOUT_S = 600.0
