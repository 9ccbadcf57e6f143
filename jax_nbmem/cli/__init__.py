"""Face: the ``jax-nbmem`` command (status, the node exporter, kernelspecs in a mode).

A thin layer over the core: it parses arguments, calls the core and prints what it returns.
May import any core part (allocator, gpu, record, node, agent, tenants, metrics, tools, and
the shared modules), jupyter_client and prometheus_client (the exporter); never IPython, the
widgets or another face.
"""
