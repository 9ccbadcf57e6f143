"""Face: the ``jax-nbmem`` command (status, kernelspecs that start in an allocator mode).

A thin layer over the core: it parses arguments, calls the core and prints what it returns.
May import any core part (allocator, gpu, record, tenants, tools) and jupyter_client; never
IPython, the widgets or another face.
"""
