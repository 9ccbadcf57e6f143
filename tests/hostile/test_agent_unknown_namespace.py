"""A pod whose Kubernetes namespace is not known is named to no namespace's reader (issue 45).

While the Kubernetes API has not listed a pod (unreachable, or the pod is new), the agent
cannot tell whose namespace it is: its entry is hidden from every reader, the file's and every
namespace's over TCP, ``--pod-names-visible all`` included, and shown whole only in root's
file (fail closed). Once the pod is listed it is named as any other. Synthetic /proc and the
stand-in Kubernetes API (tests/agent/test_podnames.py's).
"""

import json

import pytest

from jax_nbmem.agent.hostview import HostViewer
from jax_nbmem.agent.publish import PodVisibility, ResolutionWriter
from jax_nbmem.agent.registry import Registration
from jax_nbmem.agent.visibility import UNKNOWN_REASON
from tests.agent.test_hostview import fake_process
from tests.agent.test_podnames import REPORT, directory, proc, viewer_for

__all__ = ["directory", "proc"]  # fixtures

UNLISTED_UID = "99999999-8888-7777-6666-555555555555"
UNLISTED_CID = "b2" * 32
SECRETS = {"hub_user": "bob", "notebook": "bob/thesis.ipynb", "kernel_id": "k-bob-1"}


def _bob(proc) -> None:
    slice_ = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    cgroup = f"{slice_}{UNLISTED_UID.replace('-', '_')}.slice/cri-containerd-{UNLISTED_CID}.scope\n"
    fake_process(proc, 800, nspids=(800, 1), ticks=14, cgroup=cgroup)


def _registered(viewer: HostViewer) -> dict:
    view = viewer.view(800)
    content = {"schema": 1, "pid": 1, "started_at": 1.0, **SECRETS,
               "identity": {"hostname": "jupyter-bob"}}  # fmt: skip
    return {800: Registration(800, 1000, view, content, None, 1.0, 1)}


def _entry(text: str) -> dict:
    (entry,) = [p for p in json.loads(text)["processes"] if p["pid"] == 800]
    return entry


@pytest.mark.parametrize("setting", ["own", "all"])
def test_an_unlisted_pod_s_kernel_is_hidden_from_every_namespace(proc, directory, setting):
    _bob(proc)
    viewer = viewer_for(proc, directory)
    assert viewer.view(800).container.name_reason.startswith("pod names unknown")
    writer = ResolutionWriter(PodVisibility(setting))
    texts = {"file": writer.text(REPORT, _registered(viewer), viewer.view, interval_s=5)}
    texts |= {reader: writer.for_namespace(reader) for reader in ("jhub", "ml", "default")}
    for reader, text in texts.items():
        entry = _entry(text)
        assert entry["container"]["name_reason"] == UNKNOWN_REASON, reader
        assert entry["kernel"]["names_reason"] == UNKNOWN_REASON, reader
        assert not any(value in text for value in SECRETS.values()), reader
        assert "jupyter-bob" not in text, reader
    full = _entry(writer.full_text())  # root's file: every name
    assert full["kernel"]["hub_user"] == "bob" and full["container"]["pod_uid"] == UNLISTED_UID
