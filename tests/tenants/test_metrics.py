"""A status report as metric families: names, labels, and unknowns left out (never 0)."""

from jax_nbmem.tenants.metrics import KERNEL_LABELS, metric_families

GIB = 1024**3


def report():
    return {
        "gpus": [{"index": 0, "uuid": "GPU-a", "used_bytes": 30 * GIB, "total_bytes": 80 * GIB},
                 {"index": 1, "uuid": "GPU-b", "used_bytes": None, "total_bytes": 80 * GIB}],
        "processes": [
            {"pid": 11, "gpu": 0, "used_bytes": 20 * GIB, "kind": "kernel", "kernel_id": "k1",
             "notebook": "/home/ada/work/a.ipynb", "notebook_shown": "work/a.ipynb",
             "user": "ada", "preallocated": True, "mode": "on", "idle_s": 7200.0,
             "jax": {"bytes_in_use": GIB, "pool_bytes": 20 * GIB, "bytes_limit": 60 * GIB}},
            {"pid": 12, "gpu": 0, "used_bytes": None, "kind": "process", "kernel_id": None,
             "notebook": None, "user": "bob", "preallocated": None, "idle_s": None, "jax": None},
        ],
        "warnings": [{"kind": "blocking-preallocation", "gpu": 0, "pid": 11, "message": "…"}],
    }  # fmt: skip


def families():
    return {family.name: family for family in metric_families(report())}


def test_gpu_and_kernel_gauges_carry_the_contract_labels():
    found = families()
    used = found["jax_nbmem_gpu_memory_used_bytes"]
    assert used.labels == ("gpu_uuid", "gpu")
    assert used.samples == [(("GPU-a", "0"), 30 * GIB)]  # GPU 1's unknown is left out
    assert len(found["jax_nbmem_gpu_memory_total_bytes"].samples) == 2
    memory = found["jax_nbmem_kernel_gpu_memory_bytes"]
    assert memory.labels == KERNEL_LABELS == ("kernel_id", "notebook", "user", "gpu_uuid", "pid")
    assert memory.samples == [(("k1", "work/a.ipynb", "ada", "GPU-a", "11"), 20 * GIB)]
    assert found["jax_nbmem_kernel_jax_pool_bytes"].samples[0][1] == 20 * GIB
    assert found["jax_nbmem_kernel_jax_bytes_in_use"].samples[0][1] == GIB
    assert found["jax_nbmem_kernel_jax_bytes_limit"].samples[0][1] == 60 * GIB
    (prealloc,) = found["jax_nbmem_kernel_preallocated"].samples
    assert prealloc == (("k1", "work/a.ipynb", "ada", "GPU-a", "11", "on"), 1.0)
    assert found["jax_nbmem_kernel_idle_seconds"].samples == [
        (("k1", "work/a.ipynb", "ada", "GPU-a", "11"), 7200.0)
    ]


def test_warnings_are_counted_by_kind_with_zero_for_the_known_ones():
    warnings = dict(families()["jax_nbmem_warnings"].samples)
    assert warnings[("blocking-preallocation",)] == 1.0
    assert warnings[("prealloc-will-fail",)] == 0.0 and warnings[("pid-namespace",)] == 0.0


def test_a_process_that_is_no_kernel_has_empty_kernel_labels_but_its_pid():
    report_ = report()
    report_["processes"][1]["used_bytes"] = 5 * GIB
    memory = {f.name: f for f in metric_families(report_)}["jax_nbmem_kernel_gpu_memory_bytes"]
    assert (("", "", "bob", "GPU-a", "12"), 5 * GIB) in memory.samples
