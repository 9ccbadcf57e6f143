"""Core: JAX's allocator modes — what each sets, what the installed jaxlib reads, this process's.

`modes` parses modes and turns them into environment variables (reading jaxlib's own source,
never importing it), `control` applies them to this process and remembers what JAX's backend
started with, `report` says all of that in words. May import `gpu.jaxstats` (to know whether
the backend is up, without starting it) and `units`; no IPython, widgets or faces.
"""
