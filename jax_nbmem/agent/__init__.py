"""The node agent (host side), and the kernels' client of it.

`server` listens on the share directory's socket (and over TCP for pods) and `registry` proves
each caller from the host's side: `hostview` reads a PID's namespace, NSpid, start and cgroup,
`cgroups` names its container from the runtime's hierarchy, `kubepods` its pod from the
Kubernetes API, `netpeer` finds the host process behind a TCP connection. `publish` writes the
node's resolution; `hostproof` lets root's own tools use it. `client` and `client_tcp` are what
a kernel runs to register and read. May import `tenants`' data shapes (beacons, culling notices),
`gpu`, `allocator` and the shared modules; never a face.
"""
