"""What one user's kernels make the agent keep and publish is bounded; a reader that meets an
oversized or broken resolution keeps what it can trust (issue 45 item 1).

Before, a flood of honest registrations with ~63 KiB beacons grew ``resolution.json`` past the
readers' 32 MiB, and every reader called the whole agent untrusted. Now the agent keeps a
beacon's contract keys only, at most 8 KiB of them, and a reader of a file over 32 MiB, or
whose JSON breaks off, uses its head and every whole entry before the fault and says why.
"""

import json

from jax_nbmem.agent.registry import MAX_KERNEL_BYTES
from jax_nbmem.node.resolution import MAX_BYTES, load_resolution
from tests.agent.namespaces import client_args, contained
from tests.hostile.agents import reachable_share, serving
from tests.tenants.test_containers import kernel_beacon, neighbour_entry, write_resolution

__all__ = ["reachable_share"]  # a fixture

NS = [4, 4026531999]


def _entries(count: int, pad: int) -> list[dict]:
    return [neighbour_entry(100000 + n, kernel={**kernel_beacon(1, NS, hub_user=f"u{n}",
            notebook="x.ipynb"), "padding": "x" * pad}) for n in range(count)]  # fmt: skip


def test_an_oversized_resolution_keeps_its_whole_entries_and_says_why(tmp_path):
    path = write_resolution(tmp_path, _entries(560, 63 * 1024))
    assert path.stat().st_size > MAX_BYTES
    found = load_resolution(str(tmp_path))
    assert found.state == "fresh"
    assert "over the readers' 32 MiB" in found.reason and "the rest left out" in found.reason
    assert 400 < len(found.processes) < 560  # those within the first 32 MiB, whole
    assert found.get(100000).kernel.hub_user == "u0"
    assert found.to_dict()["reason"] == found.reason  # what `status --json` shows


def test_a_resolution_broken_in_the_middle_keeps_the_entries_before(tmp_path):
    path = write_resolution(tmp_path, _entries(3, 10))
    text = path.read_text()
    path.write_text(text[: text.rindex('{"pid"')] + '{"pid": 7, "gpus": [' + "\x00" * 20)
    found = load_resolution(str(tmp_path))
    assert found.state == "fresh" and "is malformed JSON" in found.reason
    assert sorted(found.processes) == [100000, 100001]


def test_the_agent_keeps_a_beacon_s_contract_keys_only_and_bounds_them(reachable_share):
    padded = {"beacon": {"padding": "x" * (63 * 1024)}}
    swollen = {"beacon": {"variables": {f"V{n}": "y" * 100 for n in range(100)}}}
    with serving(reachable_share) as agent:
        with contained(client_args(agent.path, json.dumps([padded])), hostname="padded") as box:
            assert json.loads(box.line()) == {"ok": True, "pid": box.host_pid}
            kept = agent.registry.proven()[box.host_pid].content
            assert "padding" not in kept and kept["identity"]["hostname"] == "padded"
            assert len(json.dumps(kept)) < MAX_KERNEL_BYTES
        with contained(client_args(agent.path, json.dumps([swollen])), hostname="swollen") as box:
            said = json.loads(box.line())
            assert not said["ok"] and f"over the {MAX_KERNEL_BYTES}" in said["reason"]
            assert box.host_pid not in agent.registry.proven()


def test_past_its_total_the_resolution_leaves_kernels_out_with_a_reason(tmp_path, monkeypatch):
    from jax_nbmem.agent import publish
    from jax_nbmem.agent.hostview import HostViewer
    from jax_nbmem.agent.registry import Registration
    from tests.agent.test_hostview import fake_process

    for pid in (501, 502, 503):
        fake_process(tmp_path, pid, ticks=pid)
    viewer = HostViewer(str(tmp_path))
    content = {"schema": 1, "pid": 1, "started_at": 1.0, "notebook": "n" * 1000}
    registrations = {pid: Registration(pid, 0, viewer.view(pid), content, None, 1.0, pid)
                     for pid in (501, 502, 503)}  # fmt: skip
    monkeypatch.setattr(publish, "MAX_KERNELS_CHARS", 2500)
    text = publish.ResolutionWriter().text({}, registrations, viewer.view, interval_s=5)
    entries = {entry["pid"]: entry for entry in json.loads(text)["processes"]}
    assert entries[501]["kernel"]["notebook"] == "n" * 1000
    assert entries[503]["kernel"] is None
    assert entries[503]["kernel_reason"] == "the resolution is full"
