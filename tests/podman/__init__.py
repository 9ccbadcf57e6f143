"""Real containers: Debian's Podman as root, each user's kernel in a container of its own.

Where :mod:`tests.containers` makes containers with ``unshare``, these are made by a real
runtime, as an administrator would follow docs/containers.md: ``podman run`` with runc,
cgroupfs, vfs storage and no network, the host's own filesystem as the image (``--rootfs /:O``,
an overlay: no registry is reachable), uid 1000 named ``jovyan`` by a bind-mounted passwd
file. The harness is :mod:`.podman`; ``.ci/podman-deps.sh`` installs what it needs.
"""
