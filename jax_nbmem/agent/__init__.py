"""The node agent: the root daemon on the host, and only that.

`server` listens on the share directory's socket (and over TCP for pods) and `registry` proves
each caller from the host's side: `hostview` reads a PID's namespace, NSpid, start and cgroup,
`cgroups` names its container from the runtime's hierarchy, `kubepods` its pod from the
Kubernetes API, `netpeer` finds the host process behind a TCP connection. `publish` writes the
node's resolution; `hostproof` lets root's own tools use it. What a kernel runs to reach it, and
what it reads and writes in the share directory (beacons, the resolution's format, the culler's
notices), is the node's shared language, :mod:`jax_nbmem.node`. May import `node`, `gpu` and
the shared modules; never `tenants` (the report), `metrics` or a face.
"""
