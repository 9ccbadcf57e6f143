"""A status snapshot as metric families: names, labels, scope, health, and unknowns left out."""

import socket

import pytest

from jax_nbmem.metrics.metrics import (
    FAMILIES,
    GPU_LABELS,
    KERNEL_LABELS,
    NVML_REASONS,
    Snapshot,
    is_fresh,
    metric_families,
    nvml_reason,
)

GIB = 1024**3
NOW = 1_800_000_000.0


def report():
    return {
        "nvml": {"available": True, "reason": None},
        "gpus": [{"index": 0, "uuid": "GPU-a", "name": "H200", "used_bytes": 30 * GIB,
                  "total_bytes": 80 * GIB, "reserved_bytes": GIB // 2},
                 {"index": 1, "uuid": "GPU-b", "name": "H200", "used_bytes": None,
                  "total_bytes": 80 * GIB}],
        "processes": [
            {"pid": 11, "gpu": 0, "used_bytes": 20 * GIB, "kind": "kernel", "kernel_id": "k1",
             "notebook": "/home/ada/work/a.ipynb", "notebook_shown": "work/a.ipynb",
             "user": "ada", "hub_user": "ada@hub", "preallocated": True, "mode": "on",
             "idle_s": 7200.0,
             "jax": {"bytes_in_use": GIB, "pool_bytes": 20 * GIB, "bytes_limit": 60 * GIB}},
            {"pid": 11, "gpu": 1, "used_bytes": GIB, "kind": "kernel", "kernel_id": "k1",
             "notebook": "/home/ada/work/a.ipynb", "notebook_shown": "work/a.ipynb",
             "user": "ada", "preallocated": False, "mode": "on", "idle_s": 7200.0},
            {"pid": 12, "gpu": 0, "used_bytes": None, "kind": "process", "kernel_id": None,
             "notebook": None, "user": "bob", "preallocated": None, "idle_s": None, "jax": None},
        ],
        "warnings": [{"kind": "blocking-preallocation", "gpu": 0, "pid": 11, "message": "…"},
                     {"kind": "pid-namespace", "gpu": None, "pid": None, "message": "…"}],
    }  # fmt: skip


def families(snapshot="default", **kwargs):
    snapshot = Snapshot(report(), NOW - 1, 0.02) if snapshot == "default" else snapshot
    kwargs.setdefault("now", NOW)
    kwargs.setdefault("stale_after_s", 15)
    return {family.name: family for family in metric_families(snapshot, **kwargs)}


def samples(found, name):
    family = found[name]
    return [(dict(zip(family.labels, v, strict=True)), value) for v, value in family.samples]


def test_gpu_and_kernel_gauges_carry_dcgm_exporter_s_label_names():
    found = families()
    assert GPU_LABELS == ("UUID", "gpu", "Hostname", "gpu_uuid", "GPU_I_ID", "GPU_I_PROFILE")
    ((labels, used),) = samples(found, "jax_nbmem_gpu_memory_used_bytes")  # GPU 1's: unknown
    assert used == 30 * GIB and labels["UUID"] == labels["gpu_uuid"] == "GPU-a"
    assert labels["gpu"] == "0" and labels["Hostname"]
    assert len(found["jax_nbmem_gpu_memory_total_bytes"].samples) == 2
    assert [v for _, v in samples(found, "jax_nbmem_gpu_memory_reserved_bytes")] == [GIB // 2]
    assert found["jax_nbmem_kernel_gpu_memory_bytes"].labels == KERNEL_LABELS
    memory = samples(found, "jax_nbmem_kernel_gpu_memory_bytes")
    host = socket.gethostname()
    # No container: its labels are empty, which Prometheus reads as absent (the same series).
    assert memory[0] == (
        {"UUID": "GPU-a", "gpu": "0", "gpu_uuid": "GPU-a", "Hostname": host, "kernel_id": "k1",
         "notebook": "work/a.ipynb", "user": "ada", "hub_user": "ada@hub", "pid": "11",
         "GPU_I_ID": "", "GPU_I_PROFILE": "", "container": "", "pod": "", "namespace": "",
         "user_source": "", "hub_user_source": "claimed"},
        20 * GIB,
    )  # fmt: skip
    assert memory[1][0]["UUID"] == "GPU-b" and memory[1][0]["hub_user"] == ""  # not known
    assert len(memory) == 2  # bob's process: its bytes unknown, so no sample


def test_unit_suffixed_names_only_the_pre_release_names_are_gone():
    found = families()
    # No release carried jax_nbmem_kernel_jax_bytes_in_use / _bytes_limit: dropped, not kept
    # beside the unit-suffixed names (CHANGELOG.md).
    for gone in ("jax_nbmem_kernel_jax_bytes_in_use", "jax_nbmem_kernel_jax_bytes_limit"):
        assert gone not in found and gone not in FAMILIES
    for name in ("jax_nbmem_kernel_jax_in_use_bytes", "jax_nbmem_kernel_jax_limit_bytes"):
        assert found[name].samples and "Deprecated" not in found[name].documentation
    assert found["jax_nbmem_kernel_jax_in_use_bytes"].samples[0][1] == GIB
    assert found["jax_nbmem_kernel_jax_pool_bytes"].samples[0][1] == 20 * GIB
    prealloc = samples(found, "jax_nbmem_kernel_preallocated")
    assert [(p["UUID"], p["mode"], v) for p, v in prealloc] == [("GPU-a", "on", 1.0),
                                                                ("GPU-b", "on", 0.0)]  # fmt: skip
    idle = samples(found, "jax_nbmem_kernel_idle_seconds")[0]
    activity = samples(found, "jax_nbmem_kernel_last_activity_timestamp_seconds")[0]
    assert idle[1] == 7200.0 and activity[1] == NOW - 1 - 7200.0
    for name in found:
        assert name in FAMILIES and (name.endswith(("_bytes", "_seconds", "_info")) or name in (
            "jax_nbmem_up", "jax_nbmem_nvml_up", "jax_nbmem_kernel_preallocated",
            "jax_nbmem_warnings"))  # fmt: skip


def test_warnings_carry_the_gpu_and_the_pid_and_zero_for_the_known_kinds():
    warnings = samples(families(), "jax_nbmem_warnings")
    assert (
        {"kind": "blocking-preallocation", "UUID": "GPU-a", "gpu": "0", "pid": "11",
         "Hostname": socket.gethostname(), "user": "ada", "kernel_id": "k1", "GPU_I_ID": "",
         "GPU_I_PROFILE": ""}, 1.0,
    ) in warnings  # fmt: skip
    kinds = {labels["kind"]: value for labels, value in warnings if not labels["pid"]}
    assert kinds["prealloc-will-fail"] == 0.0 and kinds["pid-namespace"] == 1.0
    assert kinds["agent-stale"] == 0.0  # a series to watch before any agent ever stops


def mig_report():
    """GPU 0 split (root reads it) into instance 3 (3g.71gb, NVML device 2); a kernel on it."""
    place = {
        "parent_index": 0,
        "parent_uuid": "GPU-a",
        "gpu_instance_id": 3,
        "compute_instance_id": 0,
        "profile": "3g.71gb",
    }
    return {
        "nvml": {"available": True, "reason": None},
        "gpus": [{"index": 0, "uuid": "GPU-a", "used_bytes": 31 * GIB, "total_bytes": 141 * GIB,
                  "mig": None, "mig_mode": True},
                 {"index": 1, "uuid": "GPU-b", "used_bytes": GIB, "total_bytes": 141 * GIB,
                  "mig": None},
                 {"index": 2, "uuid": "MIG-c", "used_bytes": 30 * GIB, "total_bytes": 71 * GIB,
                  "mig": place}],
        "processes": [{"pid": 11, "gpu": 2, "used_bytes": 30 * GIB, "kind": "kernel",
                       "kernel_id": "k1", "user": "ada", "preallocated": True, "mode": "on"}],
        "warnings": [{"kind": "self-preallocation", "gpu": 2, "pid": 11, "message": "…"}],
    }  # fmt: skip


def test_a_mig_instance_is_labelled_as_dcgm_exporter_labels_it():
    found = families(Snapshot(mig_report(), NOW - 1, 0.02))
    used = {(s["UUID"], s["gpu"], s["GPU_I_ID"], s["GPU_I_PROFILE"]): v
            for s, v in samples(found, "jax_nbmem_gpu_memory_used_bytes")}  # fmt: skip
    assert used == {
        ("GPU-a", "0", "", ""): 31 * GIB,  # the whole GPU: no instance labels
        ("GPU-b", "1", "", ""): GIB,
        ("GPU-a", "0", "3", "3g.71gb"): 30 * GIB,  # the instance: its parent's UUID and gpu
    }
    [(kernel, value)] = samples(found, "jax_nbmem_kernel_gpu_memory_bytes")
    assert (kernel["UUID"], kernel["gpu_uuid"], kernel["gpu"]) == ("GPU-a", "GPU-a", "0")
    assert (kernel["GPU_I_ID"], kernel["GPU_I_PROFILE"], value) == ("3", "3g.71gb", 30 * GIB)
    [(flag, _)] = samples(found, "jax_nbmem_kernel_preallocated")
    assert (flag["GPU_I_ID"], flag["mode"]) == ("3", "on")
    [warning] = [s for s, v in samples(found, "jax_nbmem_warnings") if v]
    assert (warning["kind"], warning["GPU_I_ID"], warning["GPU_I_PROFILE"]) == (
        "self-preallocation",
        "3",
        "3g.71gb",
    )


def test_health_says_fresh_and_build():
    found = families()
    assert samples(found, "jax_nbmem_up") == [({}, 1.0)]
    assert samples(found, "jax_nbmem_nvml_up") == [({"reason": "ok"}, 1.0)]
    assert samples(found, "jax_nbmem_snapshot_timestamp_seconds") == [({}, NOW - 1)]
    assert samples(found, "jax_nbmem_snapshot_duration_seconds") == [({}, 0.02)]
    ((build, one),) = samples(found, "jax_nbmem_build_info")
    assert one == 1.0 and build["version"] and set(build) == {"version", "jax", "jaxlib"}


def test_a_stale_snapshot_is_not_served_as_fresh_and_its_gpu_series_leave():
    found = families(Snapshot(report(), NOW - 60, 0.02))
    assert samples(found, "jax_nbmem_up") == [({}, 0.0)]
    assert samples(found, "jax_nbmem_nvml_up") == [({"reason": "stale"}, 0.0)]
    assert samples(found, "jax_nbmem_snapshot_timestamp_seconds") == [({}, NOW - 60)]
    assert "jax_nbmem_warnings" not in found and "jax_nbmem_gpu_memory_used_bytes" not in found
    before_any = families(None)
    assert samples(before_any, "jax_nbmem_up") == [({}, 0.0)]
    assert not samples(before_any, "jax_nbmem_snapshot_timestamp_seconds")


def test_staleness_counts_from_the_look_under_way():
    snapshot = Snapshot(report(), NOW - 20, 0.02)  # older than the 15 s horizon
    assert not is_fresh(snapshot, NOW, 15)
    # A refresh began 5 s ago and is still running (a loaded machine): not stale yet.
    found = families(snapshot, looking_since=NOW - 5)
    assert samples(found, "jax_nbmem_up") == [({}, 1.0)] and "jax_nbmem_warnings" in found
    # One that began 16 s ago has not ended (NVML hung): stale.
    assert samples(families(snapshot, looking_since=NOW - 16), "jax_nbmem_up") == [({}, 0.0)]
    # A look under way older than the snapshot itself changes nothing; nor does one before any.
    assert not is_fresh(snapshot, NOW, 15, looking_since=NOW - 30)
    assert not is_fresh(None, NOW, 15, looking_since=NOW)


@pytest.mark.parametrize(
    ("reason", "code"),
    [("the NVIDIA driver is not loaded, so NVML cannot read the GPUs", "driver_not_loaded"),
     ("NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine",
      "library_missing"),
     ("nvidia-ml-py (pynvml) is not installed, so GPU memory cannot be read", "library_missing"),
     ("no permission to read the GPUs through NVML", "no_permission"),
     ("GPU 0 is lost (fell off the bus or needs a reset); its memory cannot be read", "gpu_lost"),
     ("something new", "error")],
)  # fmt: skip
def test_without_nvml_no_gpu_series_and_no_warning_reads_zero(reason, code):
    broken = {**report(), "nvml": {"available": False, "reason": reason}, "gpus": [],
              "processes": [], "warnings": []}  # fmt: skip
    found = families(Snapshot(broken, NOW - 1))
    assert nvml_reason(broken["nvml"]) == code and code in NVML_REASONS
    assert samples(found, "jax_nbmem_up") == [({}, 1.0)]  # the look itself succeeded
    assert samples(found, "jax_nbmem_nvml_up") == [({"reason": code}, 0.0)]
    assert "jax_nbmem_warnings" not in found


def test_slow_nvml_is_up_but_says_so():
    state = {"available": True, "reason": "NVML is slow: processes took 2.0 s (…)"}
    assert nvml_reason(state) == "slow"


def test_a_server_s_scope_is_its_own_kernels_and_no_gpu_wide_gauge():
    found = families(Snapshot(report(), NOW - 1, own_pids=frozenset({12})))
    assert not samples(found, "jax_nbmem_gpu_memory_used_bytes")
    assert not samples(found, "jax_nbmem_gpu_memory_total_bytes")
    assert not samples(found, "jax_nbmem_kernel_gpu_memory_bytes")  # 12's bytes are unknown
    assert [(p["pid"], v) for p, v in samples(found, "jax_nbmem_kernel_preallocated")] == []
    warnings = samples(found, "jax_nbmem_warnings")
    assert all(value == 0 for _, value in warnings)  # pid 11's and the node-wide: not ours
    ours = families(Snapshot(report(), NOW - 1, own_pids=frozenset({11})))
    assert len(ours["jax_nbmem_kernel_gpu_memory_bytes"].samples) == 2
    assert sum(v for _, v in ours["jax_nbmem_warnings"].samples) == 1


def test_the_node_leaves_deferred_processes_to_their_server():
    node = families(Snapshot(report(), NOW - 1, deferred_pids=frozenset({11})))
    assert node["jax_nbmem_gpu_memory_used_bytes"].samples  # the GPUs are the node's
    assert not node["jax_nbmem_kernel_gpu_memory_bytes"].samples
    warnings = {labels["kind"]: v for labels, v in samples(node, "jax_nbmem_warnings") if v}
    assert warnings == {"pid-namespace": 1.0}  # 11's warning: its server says it


def test_the_notebook_label_is_short_relative_and_masks_secrets():
    def label(notebook, shown=None):
        process = {**report()["processes"][0], "notebook": notebook, "notebook_shown": shown}
        snapshot = Snapshot({**report(), "processes": [process]}, NOW - 1)
        return samples(families(snapshot), "jax_nbmem_kernel_gpu_memory_bytes")[0][0]["notebook"]

    assert label("/srv/data/team/x/run.ipynb") == "…/x/run.ipynb"
    assert label("/home/ada/a.ipynb", "~/a.ipynb") == "~/a.ipynb"
    assert label("https://hub/user/ada/lab?token=s3cret&x=1") == (
        "https://hub/user/ada/lab?token=***&x=1"
    )
    long = label("deep/" * 60 + "end.ipynb")
    assert len(long) == 120 and long.endswith("/end.ipynb") and long.startswith("…")
    assert label("bad\x1b[31mname.ipynb") == "bad\\x1b[31mname.ipynb"


def test_what_a_kernel_holds_besides_jax_is_one_series_per_holder():
    snapshot = report()
    snapshot["processes"][0]["jax"].update(
        {"torch_bytes": 4 * GIB, "other_bytes": GIB // 2, "cupy_bytes": None}
    )
    found = families(Snapshot(snapshot, NOW - 1, 0.02))
    held = {
        s["holder"]: value
        for s, value in samples(found, "jax_nbmem_kernel_gpu_memory_holder_bytes")
    }
    assert held == {"torch": 4 * GIB, "other": GIB // 2}  # unknown is absent, never 0
    assert all(
        s["pid"] == "11" for s, _ in samples(found, "jax_nbmem_kernel_gpu_memory_holder_bytes")
    )
