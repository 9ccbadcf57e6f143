"""One state format, two readers: the C stand-in and SimState read every text alike.

Each text is fed to both: the stand-in's own parser (``jaxNbmemSimCheck``, the one its NVML calls
use) renders what it understood, or names the line of the first problem; ``SimState.parse``
must say exactly the same.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from jax_nbmem import simgpu
from jax_nbmem.simgpu import GIB, SimState, StateError

UUID = "GPU-00000000-0000-0000-0000-000000000000"
HEAD = f"gpu 0 {UUID} total=1000\n"


@pytest.fixture
def c_reader(simgpu_lib):
    lib = simgpu.preload(simgpu_lib)
    check = lib.jaxNbmemSimCheck
    check.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint]

    def read(text: str) -> tuple[bool, str]:
        out = ctypes.create_string_buffer(1 << 20)
        code = check(text.encode("utf-8", "surrogateescape"), out, len(out))
        assert code in (0, 1)
        return code == 0, out.value.decode("utf-8", "surrogateescape")

    return read


def python_reader(text: str) -> tuple[bool, str]:
    try:
        return True, SimState.parse(text).render()
    except StateError as error:
        return False, str(error)


# Each text: what both readers must agree on (a state, or the same problem at the same line).
GOOD = [
    HEAD + "end\n",
    HEAD + "end",  # the last newline may be missing
    f"# a note\ndriver 535.1\n{HEAD}proc 0 7 used=5 kind=graphics ends=exit\nend\n",
    # keys in any order, the documented ones only, unknown keys and lines ignored
    f"gpu 0 {UUID} reserved=3 used=9 colour=red total=1000 raw name=A  B (simulated)  \nend\n",
    f"{HEAD}proc 0 7 ends=exit used=na kind=compute\nend\n",
    f"{HEAD}proc 0 7 kind=graphics used=5\nproc 0 7 used=5\nend\n",  # both lists, one figure
    f"{HEAD}proc 0 12 used=1 ends=exit\nend\n",  # no kind= (the C parser once dropped ends=)
    f"{HEAD}vgpu 0 later-format\nvideo on\nend\n",
    f"{HEAD}gpu 1 GPU-1 total=5 namehex=ff41\nlost 1\nend\n",
    f"{HEAD}slow any 5\nslow memory 7\nfail memory GPU_IS_LOST\nfail uuid 999 0\nend\n",
    f"{HEAD}fail processes NVML_ERROR_INSUFFICIENT_SIZE\nend\n",
    f"{HEAD}proc 0 1 used=2 # the rest is a comment: used=3\nend  # done\n",
    f"{HEAD}nodriver\nend\n",
    "end\n",  # complete, without GPUs
    f"gpu 0 {UUID} util=40 total=5\nend\n",
    # MIG: a GPU in MIG mode, its instances, their processes
    f"gpu 0 {UUID} total=9000 mig=on\nmig 0 1 MIG-a total=1000 name=NVIDIA H200 MIG 1g.18gb\n"
    "mig 0 2 MIG-b total=2000\nproc 0 7 mig=2 used=5 ends=exit\nunprivileged\nend\n",
    f"gpu 0 {UUID} total=9000 mig=off\nend\n",
    f"gpu 0 {UUID} total=18446744073709551615 raw\nend\n",
    # a registrar's lines: host PIDs, of the namespace they belong to
    f"{HEAD}proc 0 7 pidns=4026531836 used=5 ends=exit\nproc 0 8 used=1 pidns=12\nend\n",
    # a key given twice: the last one counts; processes out of order, one GPU's between another's
    f"{HEAD}proc 0 7 used=5 kind=graphics used=6 kind=compute\nend\n",
    f"gpu 0 {UUID} total=9\ngpu 1 U1 total=9\nproc 1 9 used=1\nproc 0 7 used=2\nproc 1 3 used=3\n"
    "proc 0 7 used=2 kind=graphics\nend\n",
]
BAD = [
    ("", "no end line: the file is incomplete"),
    (HEAD, "no end line: the file is incomplete"),
    (HEAD + "en", "no end line: the file is incomplete"),
    (f"{HEAD}end\nproc 0 1 used=1\n", "line 3: after the end line"),
    (f"{HEAD}proc 1 abc used=5\nend\n", "line 2: proc: bad PID 'abc'"),
    (f"{HEAD}proc 0\nend\n", "line 2: proc: missing PID"),
    (f"{HEAD}proc x 1 used=1\nend\n", "line 2: proc: bad GPU 'x'"),
    (f"{HEAD}proc 0 1 kind=compute\nend\n", "line 2: proc: missing used="),
    (f"{HEAD}proc 0 1 used=-1\nend\n", "line 2: proc: bad used= '-1'"),
    (
        f"{HEAD}proc 0 1 used=18446744073709551615\nend\n",
        "line 2: proc: bad used= '18446744073709551615'",
    ),
    (f"{HEAD}proc 0 1 used=1 kind=video\nend\n", "line 2: proc: bad kind= 'video'"),
    (f"{HEAD}proc 0 1 used=1 ends=never\nend\n", "line 2: proc: bad ends= 'never'"),
    (
        f"{HEAD}proc 0 7 used=5\nproc 0 7 used=6 kind=graphics\nend\n",
        "line 3: proc: PID 7 has two figures on GPU 0",
    ),
    (f"{HEAD}proc 0 7 used=5\nproc 0 7 used=5\nend\n", "line 3: proc: PID 7 listed twice on GPU 0"),
    (  # twins apart, in a list out of order
        f"{HEAD}proc 0 9 used=1\nproc 0 7 used=5\nproc 0 9 used=1\nend\n",
        "line 4: proc: PID 9 listed twice on GPU 0",
    ),
    (f"{HEAD}proc 1 7 used=5\nend\n", "line 2: proc: no GPU 1"),
    (f"gpu 0 {UUID} used=5\nend\n", "line 1: gpu: missing total="),
    (f"gpu 0 {UUID} total=5GB\nend\n", "line 1: gpu: bad total= '5GB'"),
    (f"gpu 0 {UUID} total=5 reserved=-1\nend\n", "line 1: gpu: bad reserved= '-1'"),
    (f"gpu 0 {UUID} total=5 util=101\nend\n", "line 1: gpu: bad util= '101'"),
    ("gpu 0\nend\n", "line 1: gpu: missing UUID"),
    ("gpu 0 name=X total=5\nend\n", "line 1: gpu: missing UUID"),
    ("gpu\nend\n", "line 1: gpu: missing INDEX"),
    ("gpu 64 U total=5\nend\n", "line 1: gpu: bad INDEX '64'"),
    (f"gpu 0 {UUID} total=5 name=\nend\n", "line 1: gpu: bad name= ''"),
    (f"gpu 0 {UUID} total=5 name={'x' * 96}\nend\n", "line 1: gpu: name= longer than 95 bytes"),
    (f"gpu 0 {'U' * 96} total=5\nend\n", "line 1: gpu: UUID longer than 95 bytes"),
    (f"gpu 0 {UUID} total=5 namehex=4\nend\n", "line 1: gpu: bad namehex= '4'"),
    (f"gpu 0 {UUID} total=5 namehex=0041\nend\n", "line 1: gpu: bad namehex= '0041'"),
    (f"{HEAD}gpu 0 U total=5\nend\n", "line 2: gpu: GPU 0 given twice"),
    (f"{HEAD}gpu 2 U total=5\nend\n", "line 2: gpu: GPU 2 without GPU 1 (indices run 0, 1, 2 ...)"),
    ("gpu 1 U total=5\nend\n", "line 1: gpu: GPU 1 without GPU 0 (indices run 0, 1, 2 ...)"),
    (f"{HEAD}lost 3\nend\n", "line 2: lost: no GPU 3"),
    (f"{HEAD}lost\nend\n", "line 2: lost: missing GPU"),
    (f"{HEAD}slow memory\nend\n", "line 2: slow: missing MS"),
    (f"{HEAD}slow memroy 5\nend\n", "line 2: slow: bad CALL 'memroy'"),
    (f"{HEAD}slow memory 1.5\nend\n", "line 2: slow: bad MS '1.5'"),
    (f"{HEAD}fail memory\nend\n", "line 2: fail: missing ERROR"),
    (f"{HEAD}fail memory GPU_IS_GONE\nend\n", "line 2: fail: bad ERROR 'GPU_IS_GONE'"),
    (f"{HEAD}fail memory 15 4\nend\n", "line 2: fail: no GPU 4"),
    (f"{HEAD}fail memory 15 x\nend\n", "line 2: fail: bad GPU 'x'"),
    ("driver\nend\n", "line 1: driver: missing VERSION"),
    (f"gpu 0 {UUID} total=9 mig=yes\nend\n", "line 1: gpu: bad mig= 'yes'"),
    (f"{HEAD}mig 0 1 MIG-a total=5\nend\n", "line 2: mig: GPU 0 is not in MIG mode (mig=on)"),
    (f"{HEAD}mig 1 1 MIG-a total=5\nend\n", "line 2: mig: no GPU 1"),
    (f"{HEAD}mig 0 32 MIG-a total=5\nend\n", "line 2: mig: bad GI '32'"),
    (f"{HEAD}mig 0 1 GPU-a total=5\nend\n", "line 2: mig: bad UUID 'GPU-a' (MIG-...)"),
    (f"{HEAD}mig 0 1\nend\n", "line 2: mig: missing UUID"),
    (f"{HEAD}mig 0 1 MIG-a\nend\n", "line 2: mig: missing total="),
    (
        f"gpu 0 {UUID} total=9 mig=on\nmig 0 1 MIG-a total=5\nmig 0 1 MIG-b total=5\nend\n",
        "line 3: mig: instance 1 of GPU 0 given twice",
    ),
    (
        f"gpu 0 {UUID} total=9 mig=on\n"
        + "".join(f"mig 0 {gi} MIG-{gi} total=1\n" for gi in range(8))
        + "end\n",
        "line 9: mig: GPU 0 has more than 7 instances",
    ),
    (
        f"gpu 0 {UUID} total=9 mig=on\nproc 0 5 used=1\nend\n",
        "line 2: proc: GPU 0 is in MIG mode: which instance (mig=GI)?",
    ),
    (
        f"gpu 0 {UUID} total=9 mig=on\nmig 0 1 MIG-a total=5\nproc 0 5 used=1 mig=3\nend\n",
        "line 3: proc: no MIG instance 3 on GPU 0",
    ),
    (f"{HEAD}proc 0 5 used=1 mig=x\nend\n", "line 2: proc: bad mig= 'x'"),
    (f"{HEAD}proc 0 5 used=1 pidns=0\nend\n", "line 2: proc: bad pidns= '0'"),
    (f"{HEAD}proc 0 5 used=1 pidns=ns\nend\n", "line 2: proc: bad pidns= 'ns'"),
    (
        f"{HEAD}proc 0 5 used=1 pidns=18446744073709551615\nend\n",
        "line 2: proc: bad pidns= '18446744073709551615'",
    ),
    (f"driver {'9' * 80}\nend\n", "line 1: driver: VERSION longer than 79 bytes"),
    # the first problem wins: a line's own before the checks of the whole, else the lowest line
    (
        f"{HEAD}proc 3 1 used=1\ngpu 5 U total=1\nproc 0 x used=1\nend\n",
        "line 4: proc: bad PID 'x'",
    ),
    (f"{HEAD}proc 3 1 used=1\ngpu 5 U total=1\nend\n", "line 2: proc: no GPU 3"),
    (HEAD + "fail any 3\n" * 33 + "end\n", "line 34: fail: more than 32 faults"),
]


@pytest.mark.parametrize("text", GOOD, ids=[f"good-{i}" for i in range(len(GOOD))])
def test_both_readers_read_a_good_state_alike(c_reader, text):
    ok, rendered = c_reader(text)
    assert (ok, rendered) == python_reader(text)
    assert ok, rendered
    # what is rendered reads back as itself, in both
    assert c_reader(rendered) == (True, rendered) == python_reader(rendered)


@pytest.mark.parametrize(("text", "problem"), BAD, ids=[p for _, p in BAD])
def test_both_readers_name_the_same_problem(c_reader, text, problem):
    assert c_reader(text) == (False, problem)
    assert python_reader(text) == (False, problem)


def test_what_the_writer_writes_both_read_back_unchanged(c_reader, tmp_path):
    state = SimState(tmp_path / "s").gpu(0, 80 * GIB).gpu(1, 8 * GIB, name=b"\xffx", used=3)
    state.gpu(2, 2**64 - 1, free=0, raw=True, util=7).process(0, 11, 5 * GIB).process(
        1, 12, None, True
    )
    state.process(0, 13, GIB, ends_with_process=True).process(0, 11, 5 * GIB, graphics=True)
    state.lose(1).slow("processes", 0.25).slow("any", 0.001).fail("memory", "UNKNOWN", 1)
    state.fail("init", 9).no_driver().unprivileged()
    state.gpu(3, 80 * GIB, mig=True).mig(3, 2, 40 * GIB, name="NVIDIA H200 MIG 3g.71gb")
    state.mig(3, 1, 20 * GIB).process(3, 14, GIB, mig=2, ends_with_process=True)
    state.process(0, 15, GIB, ends_with_process=True, pidns=4026531836)
    text = state.render()
    assert c_reader(text) == (True, text) == python_reader(text)


def test_the_writer_refuses_what_the_readers_would_refuse(tmp_path):
    path = tmp_path / "s"
    with pytest.raises(StateError, match="GPU 2 without GPU 1"):
        SimState(path).gpu(0, GIB).gpu(2, GIB).write()
    with pytest.raises(StateError, match="has two figures"):
        SimState(path).gpu(0, GIB).process(0, 5, 1).process(0, 5, 2, graphics=True).write()
    with pytest.raises(StateError, match="no GPU 1"):
        SimState(path).gpu(0, GIB).process(1, 5, 1).write()
    assert not path.exists()


def test_a_bad_file_is_named_with_its_line_by_the_reader_and_the_check_command(tmp_path):
    path = tmp_path / "gpu.state"
    path.write_text(f"{HEAD}proc 0 abc used=5\nend\n")
    with pytest.raises(StateError, match=rf"^{path}: line 2: proc: bad PID 'abc'$"):
        SimState.read(path)
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.simgpu", "check", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"{path}: line 2: proc: bad PID 'abc'; the last good state stays in use" in done.stderr
    SimState(path).gpu(0, GIB).process(0, 5, 1).write()
    done = subprocess.run(
        [sys.executable, "-m", "jax_nbmem.simgpu", "check", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and "good: 1 GPU(s), 1 process(es)" in done.stdout


def test_a_half_written_file_is_incomplete_not_bad(c_reader):
    text = f"{HEAD}proc 0 7 used=5\nproc 0 8 us"
    assert c_reader(text) == python_reader(text) == (False, "no end line: the file is incomplete")
