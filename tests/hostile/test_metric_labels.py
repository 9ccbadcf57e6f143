"""Every metric label a process claims is printable and bounded, ``mode`` included (issue 45).

A kernel's beacon says its mode; before, the ``mode`` label of
``jax_nbmem_kernel_preallocated`` passed it through as sent: control characters and up to
4,096 characters. A rootless container's name is its user's claim too.
"""

from jax_nbmem.metrics.metric_labels import NAME_MAX_CHARS
from jax_nbmem.metrics.metrics import Snapshot
from tests.metrics.test_metrics import NOW, families, report, samples

HOSTILE = "\x1b[2J\x07on\nfake_metric 1\r" + "y" * 4090


def _labels(found) -> list[dict]:
    return [labels for labels, _ in samples(found, "jax_nbmem_kernel_preallocated")]


def test_a_claimed_mode_and_container_name_are_printable_and_bounded():
    hostile = report()
    for process in hostile["processes"]:
        process["mode"] = HOSTILE
        process["container"] = {"name": HOSTILE, "id": "e" * 64, "rootless_uid": 1000}
    labels = _labels(families(Snapshot(hostile, NOW - 1, 0.02)))
    assert labels
    for found in labels:
        for name in ("mode", "container"):
            value = found[name]
            assert value.isprintable() and len(value) <= NAME_MAX_CHARS, (name, value[:80])
