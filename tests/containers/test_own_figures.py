"""Issue 46 item 1: every figure about a kernel's own GPU memory, the same in a container.

One node (tests/containers: the simulated GPU, its registrar listing host PIDs, one share
directory) and the node agent (the real ``jax-nbmem exporter --share-dir S`` as root). The same
user runs the same notebook twice at once: in a kernel on the host and in a kernel in a
container (real PID, UTS and mount namespaces), each mirroring its JAX arrays onto the GPU.
Each runs ``%jaxalloc off``, then the first promise as Run All does (every cell queued at
once): 256 MiB, 512 MiB, ``del a``; then each feature that reads its own bytes. Both kernels
must say the same figures, each its own: the per-cell records, the panel's text and sample,
``track()``, ``%jaxmem free``, ``fit``'s room, ``status``'s own row and its cap, and
``%%jaxalloc compare``'s note that the kernel holds memory while the modes run.
"""

from __future__ import annotations

import json
import queue

import pytest

from tests.containers import ContainerKernel, Node
from tests.containers.test_two_containers import node_agent
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(600)

MiB, GiB = 1 << 20, 1 << 30
# The simulated GPU's CUDA context, which a kernel's first array brings (the mirror's figure).
CONTEXT = 300 * MiB

# A HAMi cap on every device, as a vGPU scheduler puts in a container's environment.
CAP = {"CUDA_DEVICE_MEMORY_LIMIT": "40g"}

_READY = """
%jaxalloc off
import json, time
import jax, jax.numpy as jnp, jax_nbmem
from jax_nbmem.gpu import own_process
from jax_nbmem.notebook.magics import session_of
_session = session_of(get_ipython())
_deadline = time.monotonic() + 60
while (own_process.nvml_pid() is None or _session.sampler.latest_sample is None) and (
    time.monotonic() < _deadline
):
    time.sleep(0.05)
print(json.dumps({"nvml_pid": own_process.nvml_pid()}))
"""

# The first promise, queued at once as Run All queues them.
PROMISE = [
    "a = jnp.ones((64 * 1024 * 1024,), jnp.float32)\n_ = a.block_until_ready()",
    "b = jnp.ones((128 * 1024 * 1024,), jnp.float32)\n_ = b.block_until_ready()",
    "del a",
    "print(json.dumps([c.to_dict() for c in jax_nbmem.cells()]))",
]

_FIGURES = """
from jax_nbmem.notebook.panel_text import summary_text
from jax_nbmem.tools.fit import ProgramNeeds, read_rooms
sample = _session.sampler.sample_now()
gpu = sample.gpus[0]
with jax_nbmem.track() as tracked:
    c = jnp.ones((32 * 1024 * 1024,), jnp.float32)
    _ = c.block_until_ready()
needs = ProgramNeeds(
    call="step()", platform="gpu", devices=("gpu:0",), argument_bytes=0, output_bytes=0,
    alias_bytes=0, temp_bytes=0, code_bytes=0, peak_bytes=GiB, host_bytes=0, resident_bytes={},
)
(room,) = read_rooms(needs, stats={})
report = jax_nbmem.status()
own = [row for row in report["processes"] if row["kind"] == "self"]
print(json.dumps({
    "sample": [gpu.self_bytes, gpu.others_bytes, gpu.used_bytes],
    "panel": summary_text(_session, 0),
    "track_peak": tracked.peak["gpu:0"],
    "fit_self": room.self_bytes,
    "own_rows": [[r["pid"], r["used_bytes"], r["memory_cap_bytes"], r["source"]] for r in own],
    "report_pid": report["pid"],
}))
""".replace("GiB", str(GiB))


def run_all(kernel: ContainerKernel, cells: list[str], timeout: float = 180) -> list[str]:
    """Queue every cell at once, as Run All does; what each showed, in order."""
    client = kernel.client
    ids = [client.execute(cell) for cell in cells]
    shown: dict[str, list[str]] = {msg_id: [] for msg_id in ids}
    idle: set[str] = set()
    while len(idle) < len(ids):
        try:
            msg = client.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"Run All did not finish within {timeout}s") from None
        parent = msg["parent_header"].get("msg_id")
        if parent not in shown:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            shown[parent].append(content["text"])
        elif kind == "error":
            raise AssertionError(f"{content['ename']}: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            idle.add(parent)
    return ["".join(shown[msg_id]) for msg_id in ids]


def last_json(text: str):
    return json.loads(text.strip().splitlines()[-1])


def start(node: Node, side, name: str) -> ContainerKernel:
    kernel = side.start_kernel(f"{name}.ipynb", CAP)
    kernel.run("%load_ext jax_nbmem")
    proven = last_json(kernel.run(_READY))
    assert proven["nvml_pid"] == kernel.pid, (side.name, proven)  # the host PID, both sides
    return kernel


def promise(kernel: ContainerKernel) -> list[list[int | None]]:
    *_, records = run_all(kernel, PROMISE)
    by_cell = {r["first_line"]: r for r in last_json(records)}
    rows = []
    for cell in PROMISE[:3]:
        record = by_cell[cell.splitlines()[0]]
        assert record["span_start"] is None, record  # each cell read on its own
        rows.append([record[key] for key in ("gpu_self_before", "gpu_self_peak",
                                               "gpu_self_after", "gpu_self_retained")])  # fmt: skip
    return rows


def test_a_kernels_own_figures_are_the_same_on_the_host_and_in_a_container(container_node):
    node = container_node
    with node_agent(node):
        on_host = start(node, node.on_host(), "on-host")
        boxed = start(node, node.container("box"), "boxed")
        assert boxed.pid_in_container == 2 and on_host.pid != boxed.pid

        host_rows, box_rows = promise(on_host), promise(boxed)
        a, b = 256 * MiB, 512 * MiB
        assert host_rows == [
            [0, CONTEXT + a, CONTEXT + a, CONTEXT + a],
            [CONTEXT + a, CONTEXT + a + b, CONTEXT + a + b, b],
            [CONTEXT + a + b] * 3 + [0],  # `del a`: JAX's pool keeps it
        ], host_rows
        assert box_rows == host_rows

        held = CONTEXT + a + b
        wait_for("both kernels' bytes on the GPU", lambda: node.listed().get(boxed.pid) == held)
        said = {}
        for name, kernel in (("host", on_host), ("box", boxed)):
            said[name] = last_json(kernel.run(_FIGURES))
            figures = said[name]
            others = node.listed()[(boxed if kernel is on_host else on_host).pid]
            # Its own bytes as its own, the other kernel's as the others'.
            assert figures["sample"] == [held, others, held + others], (name, figures)
            assert f"This kernel holds {held / GiB:.2f} GiB" in figures["panel"], figures
            assert figures["track_peak"] is not None and figures["track_peak"] >= held, figures
            assert figures["fit_self"] is not None and figures["fit_self"] >= held, figures
            ((pid, used, cap, source),) = figures["own_rows"]
            assert (pid, cap) == (kernel.pid, 40 * GiB) and used >= held, (name, figures)
            assert figures["report_pid"] == kernel.pid
        for key in ("track_peak", "fit_self"):
            assert said["host"][key] == said["box"][key], said

        # `%jaxmem free`: what went back to the GPU is measured, not "unknown".
        for kernel in (on_host, boxed):
            freed = kernel.run("%jaxmem free b")
            assert "returned to the GPU: unknown" not in freed, freed
            assert "returned to the GPU: 0 B (JAX's allocator keeps" in freed, freed

        # `%%jaxalloc compare` warns that this kernel holds memory while the modes run.
        # Its subprocess is never proven: in the container its GPU peak is unknown, and said.
        for kernel in (on_host, boxed):
            compared = kernel.run("%%jaxalloc compare off\nx = 1", timeout=300)
            assert f"this kernel holds {held / GiB:.2f} GiB" in compared, compared
            unproven = "the node agent has not proved its host PID" in compared
            assert unproven == (kernel is boxed), compared


def test_without_proof_a_containers_figures_are_unknown_never_zero(container_node):
    """No node agent: the kernel cannot know its host PID, so its bytes are unknown, not 0."""
    node = container_node
    boxed = node.container("box").start_kernel("boxed.ipynb")
    boxed.run("%load_ext jax_nbmem")
    boxed.run(_READY.replace("60", "3"))  # nothing will prove it: a short wait
    *_, records = run_all(boxed, PROMISE)
    made_a, made_b, deleted = last_json(records)[-3:]
    # Before the first array the GPU lists nobody: nobody's bytes, this kernel's included.
    assert made_a["gpu_self_before"] == 0, made_a
    for record in (made_a, made_b, deleted):
        assert record["gpu_self_after"] is None and record["gpu_self_retained"] is None, record
    assert made_b["gpu_self_before"] is None and deleted["gpu_self_before"] is None
    sample = last_json(
        boxed.run(
            "g = _session.sampler.sample_now().gpus[0]\n"
            "print(json.dumps([g.self_bytes, g.others_bytes, g.used_bytes]))"
        )
    )
    assert sample[:2] == [None, None] and sample[2] > 0, sample
    freed = boxed.run("%jaxmem free b")
    assert "returned to the GPU: unknown (this process runs in a container" in freed, freed
    assert "node agent has not proved its host PID" in freed, freed
