"""What the board and the JupyterLab sidebar are given of processes in pods: their container,
pod and namespace, and the words the status line uses for them; nothing of the kind on a host."""

from jax_nbmem.agent.cgroups import container_text
from tests.server.pods import ALICE_CID, KERNEL_ID, pod_snapshot


def test_each_process_in_a_pod_comes_with_its_container_pod_and_namespace(
    simgpu_in_process, tmp_path
):
    snapshot, pids = pod_snapshot(simgpu_in_process, tmp_path)
    by_pid = {p["pid"]: p for p in snapshot["processes"]}
    alice, train, plain = by_pid[pids.alice], by_pid[pids.train], by_pid[pids.plain]
    assert alice["kind"] == "kernel" and alice["notebook"] == "alice/train.ipynb"
    assert alice["container"] == {
        "name": "notebook", "id": ALICE_CID, "pod": "jupyter-alice", "namespace": "jhub",
        "name_reason": None, "rootless_uid": None,
    }  # fmt: skip
    assert alice["pid_in_container"] == 7 and alice["hub_user"] == "alice"
    assert alice["container_shown"] == "container notebook in pod jhub/jupyter-alice"
    assert train["container_shown"] == "container main in pod ml/train-7"
    assert train["pid_in_container"] == 1
    # On the host itself: the keys are there, and say nothing.
    assert (plain["container"], plain["pid_in_container"], plain["container_shown"]) == (
        None, None, None,
    )  # fmt: skip
    for process in snapshot["processes"]:  # one rule for the words: the status line's
        assert process["container_shown"] == container_text(process["container"])


def test_the_server_s_kernel_in_a_pod_names_its_container(simgpu_in_process, tmp_path):
    snapshot, pids = pod_snapshot(simgpu_in_process, tmp_path)
    (kernel,) = snapshot["kernels"]
    assert kernel["kernel_id"] == KERNEL_ID and kernel["pid"] == pids.alice
    assert kernel["container"]["pod"] == "jupyter-alice"
    assert kernel["container"]["namespace"] == "jhub"
    assert kernel["notebook"] == "alice/train.ipynb"
