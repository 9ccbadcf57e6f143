"""Each reader of the node agent's resolution sees the names it may, over TCP and on disk."""

import json
import os
import stat
import subprocess
import tempfile
from pathlib import Path

from jax_nbmem.agent.publish import (
    FULL_RESOLUTION_NAME,
    HIDDEN_REASON,
    PodVisibility,
    ResolutionWriter,
    write_resolution,
)
from jax_nbmem.agent.registry import Registration
from jax_nbmem.cli.exporter import Exporter, ExporterSettings
from jax_nbmem.node.beacons import SCHEMA
from jax_nbmem.node.resolution import load_resolution
from tests.agent import test_podnames as podnames
from tests.agent.test_podnames import ML_CID, REPORT, viewer_for

# Alice's pod in jhub and a training job's in ml, on a synthetic /proc (test_podnames').
directory, proc = podnames.directory, podnames.proc

ALICE = {
    "schema": SCHEMA, "pid": 7, "started_at": 1.0, "user": "jovyan", "hub_user": "alice",
    "kernel_id": "0d2c5b1e-77aa-4d7e-a0e2-6f3a1c9e8b21",
    "notebook": "/home/jovyan/merger-plan.ipynb", "mode_in_effect": "on", "gpus": {},
    "identity": {"pid_ns": [4, 4026532999], "pid_in_ns": 7, "start_ticks": 11,
                 "hostname": "jupyter-alice", "boot_id": None},
}  # fmt: skip
NAMES = ("alice", "merger-plan", "0d2c5b1e", "jupyter-alice")


def writer_with_alice(proc, directory, setting="own"):
    viewer = viewer_for(proc, directory)
    registration = Registration(500, 1000, viewer.view(500), ALICE, None, 0.0, 1)
    writer = ResolutionWriter(PodVisibility(setting))
    public = writer.text(REPORT, {500: registration}, viewer.view, interval_s=5)
    return writer, public


def kernels(text: str) -> dict:
    return {p["pid"]: p["kernel"] for p in json.loads(text)["processes"]}


def test_another_namespace_gets_no_name_of_alice_s_kernel(proc, directory):
    writer, public = writer_with_alice(proc, directory)
    for text in (writer.for_namespace("ml"), public):  # over TCP from ml; the 0644 file
        assert not any(name in text for name in NAMES), text
        alice = kernels(text)[500]
        assert {
            k: alice[k] for k in ("hub_user", "user", "notebook", "kernel_id")
        } == dict.fromkeys(("hub_user", "user", "notebook", "kernel_id"))  # the keys stay, null
        assert alice["identity"]["hostname"] is None and alice["names_reason"] == HIDDEN_REASON
        assert alice["mode_in_effect"] == "on" and alice["identity"]["start_ticks"] == 11
    own = kernels(writer.for_namespace("jhub"))[500]
    assert (own["hub_user"], own["notebook"]) == ("alice", ALICE["notebook"])
    assert "names_reason" not in own
    assert all(name in writer.full_text() for name in NAMES)


def test_where_the_admin_allows_every_name_all_see_them(proc, directory):
    writer, public = writer_with_alice(proc, directory, "all")
    assert kernels(public)[500]["hub_user"] == "alice" and public == writer.full_text()


def test_on_disk_only_root_and_the_agent_read_the_names(proc, directory, other_user):
    _, uid, gid = other_user
    writer, public = writer_with_alice(proc, directory)
    with tempfile.TemporaryDirectory(prefix="jnm-share-") as share:  # /tmp: others may enter
        os.chmod(share, 0o755)
        agent = Path(share) / "agent"
        agent.mkdir()
        on_disk(writer, public, agent, uid, gid)


def on_disk(writer, public, agent, uid, gid):
    share = str(agent.parent)
    write_resolution(str(agent), public, writer.full_text())
    full = agent / FULL_RESOLUTION_NAME
    assert stat.S_IMODE(full.stat().st_mode) == 0o600
    assert stat.S_IMODE((agent / "resolution.json").stat().st_mode) == 0o644

    def read_as_user(path):
        return subprocess.run(["cat", str(path)], user=uid, group=gid, capture_output=True,
                              text=True)  # fmt: skip

    assert read_as_user(full).returncode != 0  # another user: not theirs to read
    seen = read_as_user(agent / "resolution.json")
    assert seen.returncode == 0 and not any(name in seen.stdout for name in NAMES)
    # Root's status reads every name; the file is removed once nothing is hidden.
    assert load_resolution(share).get(500).kernel.hub_user == "alice"
    write_resolution(str(agent), public)
    assert not full.exists()
    hidden = load_resolution(share).get(500)
    assert hidden.kernel.hub_user is None and hidden.names_reason == HIDDEN_REASON


def test_the_training_job_in_ml_is_hidden_from_jhub_too(proc, directory):
    writer, _ = writer_with_alice(proc, directory)
    entry = {p["pid"]: p for p in json.loads(writer.for_namespace("jhub"))["processes"]}[600]
    assert entry["container"]["id"] == ML_CID and entry["container"]["pod"] is None
    assert entry["kernel"] is None  # no kernel registered: nothing more to hide


def test_the_agent_answers_a_tcp_caller_as_its_own_namespace_may_see(proc, directory):
    """What the exporter hands the TCP server for a proven caller: by the caller's pod."""
    exporter = Exporter(ExporterSettings(kubernetes="off"), pods=directory)
    exporter.viewer = viewer_for(proc, directory)
    exporter._resolution, _ = writer_with_alice(proc, directory)
    _, for_ml = exporter._resolution_for(600)  # the training job's kernel, in ml
    assert not any(name in for_ml for name in NAMES)
    _, for_alice = exporter._resolution_for(500)
    assert kernels(for_alice)[500]["notebook"] == ALICE["notebook"]
    _, on_host = exporter._resolution_for(700)  # in no pod: as the 0644 file
    assert kernels(on_host)[500]["hub_user"] is None


def test_a_pod_s_user_as_the_agent_read_it_is_hidden_with_its_names(proc, directory):
    """The entry's ``user`` (the container's name for its uid, issue 51) is a name too."""
    writer, public = writer_with_alice(proc, directory)
    for text in (writer.for_namespace("ml"), public):
        entry = {p["pid"]: p for p in json.loads(text)["processes"]}[500]
        assert "user" not in entry and "user_source" not in entry, entry
    entry = {p["pid"]: p for p in json.loads(writer.for_namespace("jhub"))["processes"]}[500]
    assert entry["user_source"] in ("container", "uid", "host_uid") and entry["user"], entry
