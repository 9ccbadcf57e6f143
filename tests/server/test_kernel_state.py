"""What the JupyterLab item is told of each of the server's kernels: its state and why."""

from jax_nbmem.server.kernel_state import with_states

GIB = 1 << 30


def row(pid, gpu=0, used=GIB, preallocated=False, **more):
    return {"pid": pid, "gpu": gpu, "used_bytes": used, "preallocated": preallocated, **more}


def blocking(pid, gpu=0):
    return {"kind": "blocking-preallocation", "gpu": gpu, "pid": pid, "message": "..."}


def kernel(pid):
    return {"kernel_id": f"k{pid}", "pid": pid, "notebook": f"n{pid}.ipynb"}


def states(kernels, processes, warnings=()):
    report = {"processes": processes, "warnings": list(warnings)}
    return {k["kernel_id"]: k for k in with_states(kernels, report)}


def test_a_kernel_alone_or_off_the_gpu_is_normal():
    found = states([kernel(1), kernel(2)], [row(1, preallocated=True, mode="on")])
    assert found["k1"]["state"] == "normal"  # preallocated, but nobody else is on GPU 0
    assert found["k1"]["mode_shown"] == "on"
    assert found["k2"]["state"] == "normal" and found["k2"]["mode_shown"] is None
    assert found["k1"]["state_reason"] is None and found["k1"]["warnings"] == []


def test_a_pool_on_a_shared_gpu_is_amber_but_only_on_that_gpu():
    processes = [
        row(1, gpu=0, preallocated=True, mode="fraction 0.2"),
        row(7, gpu=0),
        row(2, gpu=1, preallocated=False, mode="off"),
        row(8, gpu=1),
    ]
    found = states([kernel(1), kernel(2)], processes)
    assert found["k1"]["state"] == "shared-preallocation"
    assert "GPU 0" in found["k1"]["state_reason"]
    assert found["k2"]["state"] == "normal"  # shares GPU 1, but took no pool


def test_a_warning_that_names_the_kernel_turns_it_red_and_comes_with_it():
    processes = [row(1, preallocated=True, mode_at_start="on"), row(7)]
    found = states([kernel(1), kernel(7)], processes, [blocking(1), blocking(99)])
    assert found["k1"]["state"] == "blocking"
    assert found["k1"]["state_reason"].startswith("blocking-preallocation")
    assert found["k1"]["warnings"] == [blocking(1)]  # not the warning about PID 99
    assert found["k1"]["mode_shown"] == "on"  # the mode it started with, as the board says
    assert found["k7"]["state"] == "normal"


def test_a_kernel_without_a_pid_is_named_by_no_warning():
    found = states([{"kernel_id": "x", "pid": None}], [row(1)], [blocking(None)])
    assert found["x"]["state"] == "normal" and found["x"]["warnings"] == []


def test_the_report_is_not_changed():
    kernels = [kernel(1)]
    with_states(kernels, {"processes": [row(1)], "warnings": []})
    assert "state" not in kernels[0]


def gpu(index=0, total=80 * GIB, free=20 * GIB, ours=True):
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "total_bytes": total,
        "free_bytes": free,
        "ours": ours,
    }


def test_a_kernel_whose_mode_will_not_fit_is_red_before_its_jax_starts():
    report = {"processes": [row(9, used=60 * GIB)], "warnings": [], "gpus": [gpu(free=20 * GIB)]}
    pending = {1: ("on", 0.75), 2: ("fraction 0.2", 0.2), 3: ("off", 0.0)}
    found = {
        k["kernel_id"]: k for k in with_states([kernel(1), kernel(2), kernel(3)], report, pending)
    }
    assert found["k1"]["state"] == "will-not-fit"
    assert (
        "75% of GPU 0" in found["k1"]["state_reason"] and "20.0 GiB" in found["k1"]["state_reason"]
    )
    assert found["k1"]["mode_shown"] == "on (JAX not started)"
    assert found["k2"]["state"] == "normal"  # 16 GiB fits in 20
    assert found["k3"]["state"] == "normal" and found["k3"]["mode_shown"] == "off (JAX not started)"


def test_a_gpu_the_kernel_does_not_see_or_an_unknown_free_says_nothing():
    report = {
        "processes": [],
        "warnings": [],
        "gpus": [gpu(0, free=None), gpu(1, free=1 * GIB, ours=False)],
    }
    found = with_states([kernel(1)], report, {1: ("on", 0.75)})
    assert found[0]["state"] == "normal"


def test_only_the_gpus_its_beacon_says_its_pool_will_take_can_be_too_full():
    # GPU 0 is full, GPU 1 has room: a kernel whose CUDA_VISIBLE_DEVICES (or
    # jax_cuda_visible_devices) puts its pool on GPU 1 is not red for GPU 0
    report = {"processes": [], "warnings": [], "gpus": [gpu(0, free=GIB), gpu(1, free=79 * GIB)]}
    (found,) = with_states([kernel(1)], report, {1: ("on", 0.75, ("GPU-1",))})
    assert found["state"] == "normal" and found["mode_shown"] == "on (JAX not started)"
    (found,) = with_states([kernel(1)], report, {1: ("on", 0.75, ("GPU-0",))})
    assert found["state"] == "will-not-fit" and "GPU 0" in found["state_reason"]
    # a beacon that does not say (an older kernel's): every GPU of the server, as before
    for unsaid in ({1: ("on", 0.75)}, {1: ("on", 0.75, None)}):
        (found,) = with_states([kernel(1)], report, unsaid)
        assert found["state"] == "will-not-fit", unsaid


def test_a_kernel_already_on_the_gpu_is_judged_by_what_it_holds_not_its_beacon():
    report = {"processes": [row(1, used=GIB)], "warnings": [], "gpus": [gpu(free=GIB)]}
    found = with_states([kernel(1)], report, {1: ("on", 0.75)})
    assert found[0]["state"] == "normal"


def test_a_mig_instance_is_named_by_its_label_and_its_split_gpu_is_not_a_room():
    label = "MIG 3g.71gb instance 2 of GPU 0"
    gpus = [
        {
            "index": 0,
            "label": "GPU 0",
            "mig_mode": True,
            "ours": True,
            "free_bytes": 0,
            "total_bytes": 141 * GIB,
        },  # fmt: skip
        {"index": 1, "label": label, "ours": True, "free_bytes": 41 * GIB, "total_bytes": 71 * GIB},
    ]
    processes = [row(1, gpu=1, preallocated=True, mode="on"), row(7, gpu=1)]
    report = {"processes": processes, "warnings": [blocking(1, gpu=1)], "gpus": gpus}
    (found,) = with_states([kernel(1)], report)
    assert found["state_reason"] == f"blocking-preallocation: this kernel keeps others off {label}"
    report["warnings"] = []
    (found,) = with_states([kernel(1)], report)
    assert found["state"] == "shared-preallocation" and label in found["state_reason"]
    # JAX not started, 50% of the instance's 71 GiB fits its 41 GiB free; the split GPU's
    # own 0 bytes free says nothing about where the pool will go
    (found,) = with_states([kernel(5)], {**report, "processes": []}, {5: ("fraction 0.5", 0.5)})
    assert found["state"] == "normal", found
    (found,) = with_states([kernel(5)], {**report, "processes": []}, {5: ("on", 0.75)})
    assert found["state"] == "will-not-fit"
    assert found["state_reason"].startswith(f"its mode will take 75% of {label} when JAX starts")
