#!/usr/bin/env bash
# Installs the system tools the suite needs beyond Python, from Debian, so that CI proves the
# tests that use them instead of skipping them (tests/skips.py fails a CI run on any unexpected
# skip): iproute2's ip (the agent's TCP path between network namespaces), util-linux's unshare
# and nsenter (PID namespaces), systemd-analyze and systemd-tmpfiles (the unit's checks),
# openssl (the test certificates), passwd's useradd (throwaway users) and gcc (the simulated
# GPU's library). Idempotent: installs only what is missing.
set -euo pipefail
# shellcheck source=apt.sh
source "$(dirname "$0")/apt.sh"

declare -A package_of=(
    [ip]=iproute2
    [unshare]=util-linux
    [nsenter]=util-linux
    [setpriv]=util-linux
    [systemd-analyze]=systemd
    [systemd-tmpfiles]=systemd
    [openssl]=openssl
    [useradd]=passwd
    [gcc]=gcc
)

missing=()
missing_tools=()
for command in "${!package_of[@]}"; do
    if ! have "$command"; then
        missing_tools+=("$command")
        missing+=("${package_of[$command]}")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "system-deps: every tool is already installed"
    exit 0
fi
mapfile -t unique < <(printf '%s\n' "${missing[@]}" | sort -u)
apt_install "${unique[@]}" || not_installed system-deps "${missing_tools[*]}" "${unique[@]}"
for command in "${!package_of[@]}"; do
    if ! have "$command"; then
        echo "system-deps: apt-get finished but $command is still missing" >&2
        exit 1
    fi
done
echo "system-deps: installed ${unique[*]}"
