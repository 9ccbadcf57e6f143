"""A server's claim on its kernels: trusted only while fresh, alive, and for its owner's PIDs."""

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from jax_nbmem.tenants import publishers
from jax_nbmem.tenants.publishers import published_pids, remove_claim, write_claim


def test_a_fresh_claim_names_the_server_s_kernels_until_it_is_removed(tmp_path, sleeper):
    write_claim([str(tmp_path)], url="http://127.0.0.1:8888/", pids=[sleeper], interval_s=2)
    claim = tmp_path / f"jax_nbmem-publisher-{os.getpid()}.json"
    assert oct(claim.stat().st_mode & 0o777) == "0o644"
    assert published_pids([str(tmp_path)]) == {sleeper: "http://127.0.0.1:8888/"}
    remove_claim([str(tmp_path)])
    assert published_pids([str(tmp_path)]) == {}
    remove_claim([str(tmp_path)])  # a second time: nothing to do, no error


def test_a_claim_not_rewritten_lately_is_ignored(tmp_path, sleeper):
    write_claim([str(tmp_path)], url="u", pids=[sleeper], interval_s=2)
    assert published_pids([str(tmp_path)], now=time.time() + 5.5) == {sleeper: "u"}  # 3 × 2 s
    assert published_pids([str(tmp_path)], now=time.time() + 6.5) == {}


def test_a_claim_of_a_dead_server_or_with_a_wrong_start_time_is_ignored(tmp_path, sleeper):
    write_claim([str(tmp_path)], url="u", pids=[sleeper], interval_s=2)
    claim = tmp_path / f"jax_nbmem-publisher-{os.getpid()}.json"
    content = json.loads(claim.read_text())
    (tmp_path / "jax_nbmem-publisher-1.json").write_text(json.dumps({**content, "pid": 1}))
    claim.write_text(json.dumps({**content, "started_at": content["started_at"] - 100}))
    assert published_pids([str(tmp_path)]) == {}
    (tmp_path / "jax_nbmem-publisher-x.json").write_text("{not json")
    assert published_pids([str(tmp_path), str(tmp_path / "absent")]) == {}


def rewritten_while_read(monkeypatch, directory: Path, sleeper: int, times: int) -> list[int]:
    """Make the next reader's look at the lock list come after *times* rewrites of the claim.

    As when the server rewrites its claim (after each of its snapshots) between the exporter's
    open of the file and its read of ``/proc/locks``. Returns the count of lock-list reads.
    """
    real, reads = publishers._lock_holders, []

    def late_holders():
        if not reads:
            for _ in range(times):
                write_claim([str(directory)], url="u", pids=[sleeper], interval_s=2)
        reads.append(1)
        return real()

    monkeypatch.setattr(publishers, "_lock_holders", late_holders)
    return reads


def test_a_claim_rewritten_while_it_is_read_still_defers(tmp_path, sleeper, monkeypatch):
    # Its server keeps the lock of the file it replaced until its next write: a reader that
    # opened that file just before finds the lock, at once.
    write_claim([str(tmp_path)], url="u", pids=[sleeper], interval_s=2)
    reads = rewritten_while_read(monkeypatch, tmp_path, sleeper, times=1)
    assert published_pids([str(tmp_path)]) == {sleeper: "u"}
    assert len(reads) == 1


def test_a_claim_rewritten_twice_while_it_is_read_is_read_again(tmp_path, sleeper, monkeypatch):
    # Two generations on, the file read has lost its lock: the reader sees that the name now
    # holds another file and reads that one, with a fresh lock list.
    write_claim([str(tmp_path)], url="u", pids=[sleeper], interval_s=2)
    reads = rewritten_while_read(monkeypatch, tmp_path, sleeper, times=2)
    assert published_pids([str(tmp_path)]) == {sleeper: "u"}
    assert len(reads) == 2


def test_a_server_holds_the_locks_of_two_claim_files_at_most(tmp_path, sleeper):
    def mine() -> set[int]:
        return {inode for pid, inode in publishers._lock_holders() if pid == os.getpid()}

    before = mine()  # other tests' claims, in folders of their own
    for _ in range(20):
        write_claim([str(tmp_path)], url="u", pids=[sleeper], interval_s=2)
    claim = tmp_path / f"jax_nbmem-publisher-{os.getpid()}.json"
    held = mine() - before
    assert claim.stat().st_ino in held and len(held) == 2
    remove_claim([str(tmp_path)])
    assert mine() == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_nobody_claims_another_user_s_process(tmp_path, sleeper):
    tmp_path = Path(tempfile.mkdtemp())  # under /tmp: nobody reaches it (pytest's is 0700)
    tmp_path.chmod(0o755)
    # A "server" of user nobody (flock(1): it holds a lock on its claim and starts its
    # "kernel") claims its own kernel and one of root's: only its own counts.
    claim = tmp_path / "claim.json"
    claim.touch()
    server = subprocess.Popen(["flock", "--shared", str(claim), "sh", "-c", "sleep 60 & wait"],
                              user=65534, group=65534)  # fmt: skip
    try:
        kernel = wait_for_child(server.pid, "sleep")
        started = psutil.Process(server.pid).create_time()
        claim.write_text(json.dumps({
            "schema": 1, "pid": server.pid, "started_at": started, "url": "u",
            "pids": [kernel, sleeper], "interval_s": 2.0, "written_at": time.time(),
        }))  # fmt: skip
        claim = claim.rename(tmp_path / f"jax_nbmem-publisher-{server.pid}.json")
        assert published_pids([str(tmp_path)]) == {}  # root's file speaks for no one's server
        os.chown(claim, 65534, 65534)
        assert published_pids([str(tmp_path)]) == {kernel: "u"}
        # The same words in a file the server holds no lock on: not its word.
        claim.rename(tmp_path / "old")
        (tmp_path / "old").rename(tmp_path / "x")  # the locked inode gone from the name
        copy = tmp_path / f"jax_nbmem-publisher-{server.pid}.json"
        copy.write_text((tmp_path / "x").read_text())
        os.chown(copy, 65534, 65534)
        assert published_pids([str(tmp_path)]) == {}
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)


def wait_for_child(pid: int, name: str | None = None) -> int:
    """The first child of ``pid`` (with ``name``: its first descendant of that name)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = psutil.Process(pid).children(recursive=name is not None)
        children = [c for c in children if name is None or c.name() == name]
        if children:
            return children[0].pid
        time.sleep(0.02)
    raise AssertionError(f"{pid} started no child")
