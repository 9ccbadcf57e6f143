"""Core: what happened over time — the background sampler, its bounded history, the cell ledger.

`sampler` reads memory on a daemon thread (what it reads: `readings`), `history` keeps those
samples at bounded size with their peaks, `peaks` folds a stretch of them into extremes,
`ledger` turns them into one record per cell. May import `gpu`, `units` and `text`; no
IPython, widgets or faces.
"""
