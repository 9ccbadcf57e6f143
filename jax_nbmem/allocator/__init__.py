"""Core: JAX's allocator modes — what each sets, what the installed jaxlib reads, this process's.

`jaxlib` knows the variables the installed jaxlib reads and the values it accepts (from its own
source, never by importing it) and reads a set of variables as jaxlib will; `modes` parses the
modes a user names and turns them into those variables; `control` applies them to this process
and remembers what JAX's backend started with; `report` says all of that in words. May import
`gpu.jaxstats` (to know whether the backend is up, without starting it), `units` and `text`; no
IPython, widgets or faces.
"""
