"""``jax_nbmem_culled_kernels_total{reason}``: the culler's counts as a Prometheus family.

The culler keeps its counts in the share directory (:mod:`jax_nbmem.node.notices`); the node
exporter reads them at its refresh and serves them here, so that a scrape reads no file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax_nbmem.node.notices import CULL_REASONS, CullCounts

__all__ = ["CULLED_HELP", "culled_collector"]

CULLED_HELP = "Kernels the GPU-aware idle culler shut down, by reason"


def culled_collector(latest: Callable[[], CullCounts | None]) -> Any:
    """A prometheus_client collector of ``jax_nbmem_culled_kernels_total{reason}``.

    ``latest`` returns the counts last read (None: no culler's, and no series), so a scrape
    reads no file. prometheus_client is imported here, on demand, as the exporter has it.
    """
    from prometheus_client.core import CounterMetricFamily

    def family() -> CounterMetricFamily:
        return CounterMetricFamily("jax_nbmem_culled_kernels", CULLED_HELP, labels=["reason"])

    class CulledCollector:
        def collect(self):
            counts = latest()
            if counts is None:
                return
            found = family()
            for reason in CULL_REASONS:
                found.add_metric([reason], counts.counts.get(reason, 0), created=counts.since)
            yield found

        def describe(self):
            return [family()]

    return CulledCollector()
