"""Core: tools a user runs on purpose — ``%jaxmem top/free`` and ``%%jaxalloc compare``.

`arrays` finds and frees live JAX arrays, `compare` runs a cell once per allocator mode in
fresh subprocesses (`_compare_child` is what runs there); the `*_report` modules put their
results into words. May import `gpu`, `allocator`, `record`, `units` and `text`; no IPython, widgets
or faces.
"""
