#!/usr/bin/env bash
# Installs what the Podman tests (tests/podman/) need from Debian: podman and runc. runc by
# name, since podman takes "crun | runc" and apt would pick crun, which fails on hybrid
# cgroups (cgroup v1 with a v2 mount) as CI machines have. As root the tests use neither
# uidmap (no user namespace), fuse-overlayfs (vfs storage; `--rootfs /:O` is the kernel's
# overlay), slirp4netns nor the network plugins (`--network none`): no recommends. No
# registry is reached: the containers' root is the host's own filesystem. Idempotent.
set -euo pipefail
# shellcheck source=apt.sh
source "$(dirname "$0")/apt.sh"

if have podman && have runc; then
    echo "podman-deps: $(podman --version) and $(runc --version | head -n 1) are already installed"
    exit 0
fi

# With the helpers Debian recommends beside it (the suite was proven with them there): the
# overlay for `--rootfs /:O` and rootless runs, the init for pods, the id maps.
packages=(podman runc fuse-overlayfs slirp4netns catatonit uidmap)
apt_install "${packages[@]}" || not_installed podman-deps "podman or runc" "${packages[@]}"

for tool in podman runc conmon; do
    if ! have "$tool"; then
        echo "podman-deps: apt-get finished but $tool is still missing" >&2
        exit 1
    fi
done
echo "podman-deps: installed $(podman --version), $(runc --version | head -n 1)"
