"""Containers for the tests, as a container runtime makes them, and what runs in them.

A *container* here is what DockerSpawner or KubeSpawner gives a user's notebook server, made
with real kernel namespaces (root, as CI runs): ``unshare --pid --fork --mount-proc --uts
--mount`` starts its PID 1 (a small init, below), which names the container's host (UTS
namespace) and bind-mounts a home of the container's own over the shared user's home (mount
namespace), so that runtime files do not collide. Every container of a :class:`Node` runs as
one Unix user (a throwaway user standing for ``jovyan``) and mounts one share directory at the
same path; the simulated GPU's state, library and registrar are the node's, so NVML lists host
PIDs, as a real driver does inside a container.

Processes enter a running container as ``docker exec`` does (``nsenter`` into its namespaces,
then ``setpriv`` to the user): the first one entered is PID 2 in every container, so the
kernels of identical containers have the same in-container PID. :meth:`Container.start_kernel`
starts a real IPython kernel there and connects a client from the host (the network is the
host's, as with Docker's host networking or a pod's loopback), and :meth:`Container.run_cells`
runs cells in a fresh IPython shell there.

The harness lives in :mod:`.container` and :mod:`.node` (re-exported here, so that
``tests.containers`` names it); the end-to-end tests of issue 31 in this package's
``test_*.py`` files.
"""

from tests.containers.container import Container, ContainerKernel, HostSide, missing
from tests.containers.node import Jovyan, Node, jovyan, node

__all__ = [
    "Container",
    "ContainerKernel",
    "HostSide",
    "Jovyan",
    "Node",
    "jovyan",
    "missing",
    "node",
]
