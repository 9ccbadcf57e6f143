"""Metrics: the Prometheus families a node serves, their labels, and the exposition.

`metrics` builds the families (``jax_nbmem_*``) from a status report, `metric_labels` makes
their label values (every text a user wrote passes :mod:`jax_nbmem.text`'s formatter), and
`exposition` serves them, cached, to the exporter's and the server extension's scrapes;
`culled` is the culler's counter (``jax_nbmem_culled_kernels_total``). May
import `gpu` (the NVML error names), `node` (the culler's counts) and the shared modules;
never `tenants`, `agent` or a face: a face hands it the report.
"""
