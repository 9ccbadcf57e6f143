"""The node's shared language: what kernels, servers, the CLI and the agent leave for one another.

Every process on a GPU node, of every user, meets the others in one share directory
(:mod:`.sharedir` and the one rule that finds it). `beacons` (with `beacon_files`, `alive`,
`identity`) is what each kernel says of itself there and how a reader checks it; `claims` and
`neighbours` the memory kernels claim before they start; `resolution` the format of what the
node agent publishes of each process (proven by the host, kept apart from what a process
claims); `notices` the culler's notices and counts; `servers` (with `exchange`) the Jupyter
servers' own runtime files and API; `agent_client` and `agent_client_tcp` what a kernel runs to
reach the node agent; `fields` the one strict reader of a field someone else wrote. May import
`gpu`, and the shared modules (`units`, `text`, `rootfiles`); never `tenants`, `agent`,
`metrics` or a face: those all speak it.
"""
