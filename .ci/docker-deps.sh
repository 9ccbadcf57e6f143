#!/usr/bin/env bash
# Installs what the Docker test (tests/podman/test_docker.py) needs from Debian: docker.io
# (dockerd, its containerd and runc). The test starts a dockerd of its own (its own data root
# and socket, vfs storage, no bridge, no iptables) and stops it; the package's service is not
# started here (no systemd in CI) and, where systemd runs, is left as the machine had it. No
# registry is reached: the test's image is empty and binds the host's system folders.
# Idempotent.
set -euo pipefail
# shellcheck source=apt.sh
source "$(dirname "$0")/apt.sh"

if have dockerd && have docker; then
    echo "docker-deps: $(dockerd --version) is already installed"
    exit 0
fi

apt_install docker.io || not_installed docker-deps "dockerd or docker" docker.io

for tool in dockerd docker containerd runc; do
    if ! have "$tool"; then
        echo "docker-deps: apt-get finished but $tool is still missing" >&2
        exit 1
    fi
done
echo "docker-deps: installed $(dockerd --version)"
