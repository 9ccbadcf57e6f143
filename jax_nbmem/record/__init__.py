"""Core: what happened over time — the background sampler, its bounded history, the cell ledger.

`sampler` reads memory on a daemon thread, `history` keeps those samples at bounded size with
their peaks, `ledger` turns them into one record per cell. May import `gpu` and `units`; no
IPython, widgets or faces.
"""
