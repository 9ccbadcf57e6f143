#!/usr/bin/env bash
# Installs what the Prometheus tests (tests/deploy/) need from Debian: prometheus, which carries
# promtool. Idempotent: does nothing when both are already there. Only Debian's package
# archive is used; the tests start this prometheus on loopback, never as a service.
set -euo pipefail

PROMETHEUS=/usr/bin/prometheus
PROMTOOL=/usr/bin/promtool
# shellcheck source=apt.sh
source "$(dirname "$0")/apt.sh"

if [ -x "$PROMETHEUS" ] && [ -x "$PROMTOOL" ]; then
    echo "prometheus-deps: $PROMETHEUS and $PROMTOOL are already installed"
    exit 0
fi

# --no-install-recommends: no node exporter and no service of its own beyond the package's.
apt_install prometheus || not_installed prometheus-deps "$PROMETHEUS or $PROMTOOL" prometheus

for tool in "$PROMETHEUS" "$PROMTOOL"; do
    if [ ! -x "$tool" ]; then
        echo "prometheus-deps: apt-get finished but $tool is still missing" >&2
        exit 1
    fi
done
# The package's own service, if the machine runs systemd, is not ours to leave running.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    "${as_root[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
echo "prometheus-deps: installed $("$PROMETHEUS" --version 2>/dev/null | head -n 1)"
