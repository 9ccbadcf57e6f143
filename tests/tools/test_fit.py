"""Will it fit? `%jaxmem fit` / `jax_nbmem.fit` in real IPython shells with real JAX, and the
verdict against a simulated GPU (the stand-in NVML and a simulated JAX pool).

Shell scenarios run in processes of their own (tests/ipython_session.py): whether JAX's backend
has started is process-wide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from jax_nbmem.allocator.jaxlib import effective
from jax_nbmem.gpu.jaxstats import DeviceStats
from jax_nbmem.tools.fit import ProgramNeeds, read_rooms, room_of
from jax_nbmem.tools.fit_report import Freeable, format_fit, judge
from tests.ipython_session import run_cells

GiB = 1024**3
MiB = 1024**2

DEFINE = (
    "%load_ext jax_nbmem\n"
    "import json, jax, jax.numpy as jnp, jax_nbmem\n"
    "x = jnp.ones((1024, 1024))\n"
    "w = jnp.ones((4096, 1024))\n"
    "@jax.jit\n"
    "def step(a, b):\n"
    "    h = jnp.tanh(a @ b.T)\n"
    "    return h.T @ h, h.sum()\n"
)
# XLA's own figures for the same call, read straight from the compiled program.
COMPILED = (
    "m = step.lower({args}).compile().memory_analysis()\n"
    "print(json.dumps({{k: getattr(m, k, None) for k in ('argument_size_in_bytes', "
    "'output_size_in_bytes', 'alias_size_in_bytes', 'temp_size_in_bytes', "
    "'generated_code_size_in_bytes', 'peak_memory_in_bytes')}}))"
)


@pytest.fixture(scope="module")
def cpu_sizes() -> bool:
    """Whether this jaxlib's CPU client reports buffer sizes (0.4.26's reports only code)."""
    probe = (
        "import jax, jax.numpy as jnp\n"
        "m = jax.jit(lambda a: a * 2).lower(jax.ShapeDtypeStruct((256,), jnp.float32))"
        ".compile().memory_analysis()\n"
        "print(m.argument_size_in_bytes)"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    return int(out.stdout.strip()) > 0


# What fit says where jaxlib reports no buffer sizes: it cannot tell (never "fits" on code alone).
NO_SIZES = "this jaxlib reports no buffer sizes for it on cpu (only its generated code)"


def fits_or_said(text: str, cpu_sizes: bool) -> bool:
    """The verdict where sizes are known ("fits with ..."), else the honest "cannot tell"."""
    return text.startswith("fits with ") if cpu_sizes else NO_SIZES in text


def last_json(output) -> dict:
    assert output.error is None, output.text
    return json.loads(output.stdout.strip().splitlines()[-1])


def test_fit_reads_the_compiled_program_and_allocates_nothing_for_shapes(cpu_sizes):
    outputs = run_cells(
        [
            DEFINE,
            "%jaxmem fit step(x, w)",
            "%jaxmem fit --json step(x, w)",
            COMPILED.format(args="x, w"),
            "%jaxmem fit --shapes step(x, jnp.ones((8192, 1024)))",
            "big = jax.ShapeDtypeStruct((8192, 1024), jnp.float32)\n"
            "print(json.dumps(jax_nbmem.fit(step, x, big).to_dict()))",
            COMPILED.format(args="x, big"),
            "print(json.dumps(sorted({a.shape for a in jax.live_arrays()})))",
        ]
    )
    table, compiled = outputs[1], last_json(outputs[3])
    assert outputs[2].error is None, outputs[2].text
    report = json.loads(outputs[2].stdout)
    program = report["program"]
    if not cpu_sizes:  # its zeros are unknowns: no figure is made up from them
        assert compiled["argument_size_in_bytes"] == 0 and program["argument_bytes"] is None
        assert program["total_bytes"] is None and program["resident_bytes"] == {"cpu:0": 20 * MiB}
        return
    assert program["argument_bytes"] == compiled["argument_size_in_bytes"] == 20 * MiB
    assert program["output_bytes"] == compiled["output_size_in_bytes"]
    assert program["alias_bytes"] == compiled["alias_size_in_bytes"]
    assert program["temp_bytes"] == compiled["temp_size_in_bytes"]
    assert program["code_bytes"] == compiled["generated_code_size_in_bytes"]
    if compiled["peak_memory_in_bytes"]:  # jaxlib 0.4.31 and later
        assert program["peak_bytes"] == compiled["peak_memory_in_bytes"]
        assert program["total_bytes"] == program["peak_bytes"] + program["code_bytes"]
    else:  # older: the sum of the parts stands for it, and says so
        assert program["peak_bytes"] is None
        assert program["total_bytes"] == (
            program["argument_bytes"] + program["output_bytes"] - program["alias_bytes"]
            + program["temp_bytes"] + program["code_bytes"]
        )  # fmt: skip
    # Both arguments are live arrays on the CPU device: only the rest is new.
    assert program["resident_bytes"] == {"cpu:0": 20 * MiB}
    resident_counted = min(20 * MiB, program["argument_bytes"])
    assert program["new_bytes"]["cpu:0"] == program["total_bytes"] - resident_counted
    # JAX runs on the CPU here: the room is the host's available memory, said as such.
    assert report["fits"] is (True if cpu_sizes else None)
    assert report["devices"][0]["kind"] == "host"
    assert fits_or_said(report["verdict"], cpu_sizes)
    assert table.error is None and fits_or_said(table.stdout, cpu_sizes)
    assert "step(x, w): compiled for cpu:0" in table.stdout
    assert "(20.0 MiB already there)" in table.stdout

    shaped, shaped_report, shaped_compiled = (
        outputs[4],
        last_json(outputs[5]),
        last_json(outputs[6]),
    )
    assert shaped.error is None, shaped.text
    # The stand-in counts as new memory; x (4 MiB) is still known to be there.
    assert "arguments        36.0 MiB  (4.00 MiB already there)" in shaped.stdout
    assert shaped_report["program"]["argument_bytes"] == shaped_compiled["argument_size_in_bytes"]
    assert shaped_report["program"]["resident_bytes"] == {"cpu:0": 4 * MiB}
    # Nothing of shape (8192, 1024) was ever made.
    assert [8192, 1024] not in last_json(outputs[7])


def test_a_sharded_call_is_measured_per_device_and_cpu_devices_share_the_host(cpu_sizes):
    outputs = run_cells(
        [
            DEFINE.replace("x = jnp.ones((1024, 1024))\nw = jnp.ones((4096, 1024))\n", ""),
            "import numpy as np\nfrom jax.sharding import Mesh, NamedSharding, PartitionSpec\n"
            "mesh = Mesh(np.array(jax.devices()), ('d',))\n"
            "x = jax.device_put(jnp.ones((4096, 1024)), NamedSharding(mesh, PartitionSpec('d')))\n"
            "@jax.jit\ndef scale(a):\n    return jnp.tanh(a) * 2",
            "report = jax_nbmem.fit(scale, x)\nprint(report)\nprint(json.dumps(report.to_dict()))",
            # pmap: one program per device; the unsharded argument lives on cpu:0 only.
            "whole = jnp.ones((4, 1024, 1024))\n"
            "print(json.dumps(jax_nbmem.fit(jax.pmap(scale), whole).to_dict()['program']))",
        ],
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
    )
    mapped = last_json(outputs[3])
    assert mapped["devices"] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    assert mapped["resident_bytes"] == {"cpu:0": 16 * MiB}
    report = last_json(outputs[2])
    program = report["program"]
    devices = ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    assert program["devices"] == devices
    # Each device holds a quarter of x: 4 MiB there already, per device.
    assert program["resident_bytes"] == dict.fromkeys(devices, 4 * MiB)
    assert list(report["spare"]) == devices
    if not cpu_sizes:
        assert report["fits"] is None and NO_SIZES in report["verdict"]
        return
    room = report["devices"][0]["room_bytes"]
    in_all = sum(program["new_bytes"].values())
    assert report["spare"] == dict.fromkeys(devices, room - in_all)
    assert "The 4 CPU devices share the host's memory" in outputs[2].stdout


def test_fit_never_starts_the_backend_unless_told(cpu_sizes):
    outputs = run_cells(
        [
            DEFINE.replace("x = jnp.ones((1024, 1024))\nw = jnp.ones((4096, 1024))\n", ""),
            "%jaxmem fit step(jnp.ones(4), jnp.ones(4))",
            "from jax_nbmem.gpu import jaxstats\nprint(jaxstats.backend_initialized())",
            "try:\n    jax_nbmem.fit(step, jax.ShapeDtypeStruct((4, 4), jnp.float32), "
            "jax.ShapeDtypeStruct((4, 4), jnp.float32))\n"
            "except ValueError as exc:\n    print(type(exc).__name__, exc)",
            "print(jaxstats.backend_initialized())",
            "%jaxalloc off",
            "%jaxmem fit --start --shapes step(jnp.ones((64, 64)), jnp.ones((64, 64)))",
            "print(jaxstats.backend_initialized())",
        ]
    )
    refused = outputs[1]
    assert refused.error == "UsageError"
    assert "compiling starts JAX's backend, which has not started yet" in refused.error_text
    assert "allocator mode on" in refused.error_text and "--start" in refused.error_text
    assert outputs[2].stdout.strip() == "False"
    assert outputs[3].stdout.startswith("FitError jax_nbmem.fit: JAX's backend has not started")
    assert outputs[4].stdout.strip() == "False"
    started = outputs[6]
    assert started.error is None, started.text
    # Said before it is done, with the mode it starts in.
    assert started.stdout.startswith(
        "Starting JAX's backend to compile the call, with allocator mode off"
    )
    assert fits_or_said(started.stdout.split("\n", 1)[1], cpu_sizes)
    assert outputs[7].stdout.strip() == "True"


def test_a_call_too_big_for_the_host_and_the_names_worth_freeing(cpu_sizes):
    outputs = run_cells(
        [
            DEFINE,
            "total = jax.jit(lambda a: (a * 2).sum())",
            "%jaxmem fit total(jax.ShapeDtypeStruct((2**38,), jnp.float32))",  # 1 TiB
            "from jax_nbmem.tools.fit_report import _argument_ids, _freeable\n"
            "cache = [jnp.ones(100), jnp.ones(200)]\n_private = jnp.ones(50)\n"
            "found = _freeable(get_ipython().user_ns, _argument_ids((x,)))\n"
            "print(json.dumps([(f.name, f.bytes, f.devices) for f in found]))",
        ]
    )
    too_big = outputs[2]
    assert too_big.error is None, too_big.text
    # Names the call does not use, largest first; not x (an argument), not private names.
    assert last_json(outputs[3]) == [["w", 16 * MiB, ["cpu:0"]], ["cache", 1200, ["cpu:0"]]]
    if not cpu_sizes:
        assert NO_SIZES in too_big.stdout
        return
    assert too_big.stdout.startswith("does not fit by ") and " on cpu:0 " in too_big.stdout
    assert (
        "Cheapest change: it does not fit this machine's memory at all (1.00 TiB of "
        in too_big.stdout
    )


def test_calls_that_cannot_be_measured_get_a_reason_not_a_traceback(cpu_sizes):
    outputs = run_cells(
        [
            DEFINE,
            "def branchy(a, n):\n    if n > 1:\n        return a\n    return a * 2",
            "%jaxmem fit branchy(x, 2)",
            "%jaxmem fit step(x, nowhere)",
            "%jaxmem fit x + 1",
            "%jaxmem fit step(x,",
            "%jaxmem fit --fast step(x, w)",
            "%jaxmem fit",
            "%jaxmem fit --shapes step(x, jnp.ones(3).tolist())",
            "%jaxmem fit step(x, w)",
        ]
    )
    errors = {i: (o.error, o.error_text) for i, o in enumerate(outputs)}
    assert (
        errors[2][0] == "UsageError"
        and "cannot trace branchy(x, 2): TracerBoolConversionError" in errors[2][1]
    )
    assert "static_argnums" in errors[2][1]
    assert errors[3] == (
        "UsageError",
        "%jaxmem fit: cannot evaluate nowhere: NameError: name 'nowhere' is not defined",
    )
    assert errors[4] == (
        "UsageError",
        "%jaxmem fit: x + 1 is not a call; e.g. %jaxmem fit train_step(state, batch)",
    )
    assert errors[5][0] == "UsageError" and "cannot read step(x," in errors[5][1]
    assert errors[6][0] == "UsageError" and "unknown option --fast" in errors[6][1]
    assert errors[7][0] == "UsageError" and "give the call" in errors[7][1]
    assert errors[8][0] == "UsageError" and "--shapes: cannot evaluate" in errors[8][1]
    for index in range(2, 9):
        assert "Traceback" not in outputs[index].text
    # A refused call leaves nothing behind: the next one works.
    assert outputs[9].error is None and fits_or_said(outputs[9].stdout, cpu_sizes)


# --- The verdict against a simulated GPU -----------------------------------------------------


def needs(total: int, resident: int = 0, temp: int = 0) -> ProgramNeeds:
    """A one-GPU program whose peak is *total* (arguments 1 GiB, of which *resident* is there)."""
    return ProgramNeeds(
        call="step(state, batch)",
        platform="gpu",
        devices=("gpu:0",),
        argument_bytes=1 * GiB,
        output_bytes=GiB // 2,
        alias_bytes=0,
        temp_bytes=temp,
        code_bytes=0,
        peak_bytes=total,
        host_bytes=0,
        resident_bytes={"gpu:0": resident},
    )


def pool(limit: int, in_use: int, held: int | None = None, largest_free: int | None = None):
    """JAX's counters for GPU device 0, as its BFC allocator would report them."""
    return {
        "gpu:0": DeviceStats(
            id=0,
            platform="gpu",
            kind="NVIDIA H200",
            bytes_in_use=in_use,
            peak_bytes_in_use=in_use,
            bytes_reserved=0,
            bytes_limit=limit,
            largest_free_block_bytes=largest_free,
            pool_bytes=held,
        )
    }


def mode(**variables: str):
    return effective(variables)


@pytest.fixture
def gpu16(simgpu_in_process):
    """A simulated 16 GiB GPU: this process holds a 12 GiB pool, the driver 500 MiB."""
    simgpu_in_process.gpu(0, 16 * GiB).process(0, os.getpid(), 12 * GiB).write()
    return simgpu_in_process


def test_preallocated_pool_fits_and_then_does_not_with_the_cheapest_change(gpu16):
    started = mode()  # JAX's default: preallocate 75%
    stats = pool(limit=12 * GiB, in_use=10 * GiB, held=12 * GiB, largest_free=2 * GiB)
    fits = judge(needs(1 * GiB), read_rooms(needs(1 * GiB), started=started, stats=stats))
    assert fits.fits is True and fits.spare == {"gpu:0": 1 * GiB}
    assert fits.verdict.startswith("fits with 1.00 GiB to spare on gpu:0")
    assert "2.00 GiB free in JAX's pool" in fits.verdict
    room = fits.rooms[0]
    # The stand-in NVML's figures, not ours: 16 GiB less 12 GiB and the driver's 500 MiB.
    assert room.free_bytes == 16 * GiB - 12 * GiB - 500 * MiB and room.self_bytes == 12 * GiB
    assert room.limit == "pool" and room.preallocated is True

    # Resident arguments need no new memory: 2.5 GiB with 1 GiB of it already there fits too.
    assert judge(needs(2 * GiB + GiB // 2, resident=GiB), (room,)).fits is True

    short = needs(3 * GiB)
    rooms = read_rooms(short, started=started, stats=stats)
    nothing_to_free = judge(short, rooms)
    assert nothing_to_free.fits is False and nothing_to_free.spare == {"gpu:0": -1 * GiB}
    assert nothing_to_free.verdict.startswith("does not fit by 1.00 GiB on gpu:0")
    # 10 GiB of arrays and 3 GiB more fit a 0.85 pool of this GPU, once this kernel lets go.
    assert nothing_to_free.advice.startswith("`%jaxalloc fraction 0.85` at the next start")
    # Cheaper, when it is enough: free named arrays, then what the last error keeps.
    names = [Freeable("cache", 600 * MiB, ("gpu:0",)), Freeable("old", 700 * MiB, ("gpu:0",))]
    by_names = judge(short, rooms, freeable=names)
    assert by_names.advice == "free old cache (1.27 GiB) first: `%jaxmem free old cache`"
    elsewhere = [Freeable("cpu_copy", 8 * GiB, ("cpu:0",))]
    assert judge(short, rooms, freeable=elsewhere).advice == nothing_to_free.advice
    by_error = judge(short, rooms, last_error_bytes=2 * GiB)
    assert by_error.advice.startswith("`%jaxmem free --last-error`")
    text = format_fit(by_names)
    assert text.splitlines()[0] == by_names.verdict
    assert "Cheapest change: free old cache" in text
    assert "gpu:0: needs 3.00 GiB more; room 2.00 GiB (JAX pool is the limit)" in text


def test_a_growing_pool_is_limited_by_the_gpu_and_names_the_others(simgpu_in_process):
    # `off`: JAX holds 2 GiB, another process 11 GiB of the 16 GiB GPU; its driver keeps 512 MiB.
    simgpu_in_process.gpu(0, 16 * GiB, reserved=512 * MiB).process(0, os.getpid(), 2 * GiB)
    simgpu_in_process.process(0, 4242, 11 * GiB).write()
    started = mode(XLA_PYTHON_CLIENT_PREALLOCATE="false")
    stats = pool(limit=12 * GiB, in_use=GiB + GiB // 2, held=2 * GiB)
    program = needs(4 * GiB)
    report = judge(program, read_rooms(program, started=started, stats=stats))
    free = 16 * GiB - 13 * GiB - 512 * MiB  # R510+: used is the processes', reserved apart
    room = report.rooms[0]
    assert room.limit == "device" and room.room_bytes == free + GiB // 2
    assert report.fits is False
    assert report.advice.startswith("other processes hold 11.0 GiB of GPU 0")  # not reserved
    assert room.reserved_bytes == 512 * MiB

    # platform: no pool at all, the GPU's free memory is the room.
    report = judge(
        program,
        read_rooms(program, started=mode(XLA_PYTHON_CLIENT_ALLOCATOR="platform"), stats=stats),
    )
    assert report.rooms[0].room_bytes == free and report.rooms[0].mode == "platform"


def test_too_big_for_the_gpu_at_all_and_unknown_room(simgpu_in_process):
    simgpu_in_process.gpu(0, 16 * GiB).process(0, os.getpid(), 12 * GiB).write()
    huge = needs(20 * GiB)
    stats = pool(limit=12 * GiB, in_use=GiB, held=12 * GiB)
    report = judge(huge, read_rooms(huge, started=mode(), stats=stats))
    assert report.fits is False
    assert report.advice.startswith("it does not fit this GPU at all (20.0 GiB of 16.0 GiB)")
    # A GPU NVML cannot read, under a mode that grows from it: said, not guessed.
    simgpu_in_process.fail("memory", "GPU_IS_LOST").write()
    unknown = judge(
        huge, read_rooms(huge, started=mode(XLA_PYTHON_CLIENT_PREALLOCATE="false"), stats={})
    )
    assert unknown.fits is None
    assert unknown.verdict.startswith("cannot tell whether step(state, batch) fits on gpu:0:")


def test_fragmentation_and_a_tight_fit_are_said(gpu16):
    stats = pool(limit=12 * GiB, in_use=10 * GiB, held=12 * GiB, largest_free=512 * MiB)
    program = needs(2 * GiB - 100 * MiB, temp=GiB)
    report = judge(program, read_rooms(program, started=mode(), stats=stats))
    assert report.fits is True and report.verdict.startswith(
        "fits, only just, with 100 MiB to spare on gpu:0"
    )
    assert any("largest free block in JAX's pool is 512 MiB" in note for note in report.notes)
    assert any("may still fail" in note for note in report.notes)


def test_on_a_mig_instance_the_room_and_the_advice_are_the_instance_s(
    simgpu_in_process, monkeypatch
):
    # The GPU is split; this kernel runs on the 3g.71gb instance, where another process holds
    # 30 GiB. GPU 1, whole and nearly empty, is not this kernel's and must not count.
    sim = simgpu_in_process
    sim.gpu(0, total=141 * GiB, mig=True).gpu(1, total=141 * GiB)
    sim.mig(0, 1, 18 * GiB, name="NVIDIA H200 MIG 1g.18gb")
    sim.mig(0, 2, 71 * GiB, uuid="MIG-66666666-7777-5888-8999-000000000000",
            name="NVIDIA H200 MIG 3g.71gb")  # fmt: skip
    sim.process(0, os.getpid(), 2 * GiB, mig=2).process(0, 4242, 30 * GiB, mig=2).write()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-66666666")
    stats = pool(limit=60 * GiB, in_use=GiB, held=2 * GiB)
    program = needs(45 * GiB)
    report = judge(program, read_rooms(program, started=mode(XLA_PYTHON_CLIENT_PREALLOCATE="false"),
                                       stats=stats))  # fmt: skip
    room = report.rooms[0]
    assert room.total_bytes == 71 * GiB and room.free_bytes == 71 * GiB - 32 * GiB
    assert room.gpu_label == "MIG 3g.71gb instance 2 of GPU 0"
    assert report.fits is False
    assert report.advice.startswith(
        "other processes hold 30.0 GiB of MIG 3g.71gb instance 2 of GPU 0"
    )


def test_a_backed_off_pool_counts_its_room_from_what_it_holds():
    """After BFC's 0.9x back-off the pool is under its limit and grows only by the rest at once."""
    started = mode()  # preallocate 75%
    backed_off = pool(limit=12 * GiB, in_use=9 * GiB, held=10 * GiB)["gpu:0"]
    tight = types.SimpleNamespace(index=0, free_bytes=1 * GiB, total_bytes=16 * GiB)
    room = room_of("gpu:0", backed_off, tight, started)
    assert room.room_bytes == 1 * GiB and room.growth_bytes == 2 * GiB  # pool − in use
    roomy = types.SimpleNamespace(index=0, free_bytes=3 * GiB, total_bytes=16 * GiB)
    assert room_of("gpu:0", backed_off, roomy, started).room_bytes == 3 * GiB  # limit − in use
    whole = pool(limit=12 * GiB, in_use=9 * GiB, held=12 * GiB)["gpu:0"]
    assert room_of("gpu:0", whole, tight, started).growth_bytes is None
