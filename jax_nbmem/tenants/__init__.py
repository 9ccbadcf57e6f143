"""Core: the report — who is on the GPU, and what a person should be told about it.

`attribution` names each GPU process (this kernel, another kernel and its notebook, another
process) and `verdicts` judges its memory (a preallocated pool or not); `containers` does so
from inside a container with the node agent's resolution; `advice` turns that into warnings
and the OOM diagnosis, `status` assembles the report behind ``jax_nbmem.status()`` and
``jax-nbmem status``, `watch` refreshes it in the background, `auto` picks a kernel's mode from
it, `culling` is the culler's policy and `publishers` which kernels a server publishes itself.
What kernels, servers and the agent leave one another in the share directory is
:mod:`jax_nbmem.node`. May import `node`, `agent` (the host's proof, a container's name),
`gpu`, `allocator` and the shared modules; no IPython, widgets, `metrics` or faces.
"""
