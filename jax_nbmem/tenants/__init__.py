"""Core: who is on the GPU — processes, their beacons and servers, the warnings, the status.

`attribution` names each GPU process (this kernel, another kernel and its notebook, another
process), `beacons` writes and reads what each kernel says of itself (and checks it),
`servers` asks the running Jupyter servers, `advice` turns that into warnings and the
OOM diagnosis, `status` assembles the report behind ``jax_nbmem.status()`` and
``jax-nbmem status``, `watch` refreshes it in the background. May import `gpu`, `allocator`
and `units`; no IPython, widgets or faces.
"""
