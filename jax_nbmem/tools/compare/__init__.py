"""``%%jaxalloc compare``: the same cell once per allocator mode, each in a fresh process.

`run` starts the subprocesses (`child` is what runs in each) and gathers their `results`;
`advice` picks the mode to recommend; `report` says it all as a table and a bar chart.
"""
