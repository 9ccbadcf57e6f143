"""Core: what the hardware and JAX say — NVML, the GPUs this process sees, JAX's allocator stats.

`nvml` is the only module of jax_nbmem that imports pynvml, and turns every failure into a
value with a reason; `visible` maps CUDA_VISIBLE_DEVICES to NVML devices; `jaxstats` reads
JAX's ``memory_stats()`` and live arrays only once the user's code has started the backend.
The bottom layer: imports nothing of jax_nbmem but `units`.
"""
