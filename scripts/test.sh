#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: install the package with its test extras,
# the system tools the tests use (iproute2, systemd's analyzers, openssl: .ci/system-deps.sh),
# Debian's chromium for the browser tests, prometheus (with promtool) for the metrics tests,
# node and configurable-http-proxy for the hub tests, the Prometheus Operator's CRD models
# for the Kubernetes manifests' tests, podman, runc and docker.io for the real containers'
# tests, then pytest (its "no tests ran" exit 5 fails too).
set -euo pipefail
cd "$(dirname "$0")/.."
# A stock Debian has python3 and no `python` until a virtual environment is active.
if ! command -v python >/dev/null 2>&1; then
    echo "test.sh: no \`python\` here: make and activate a virtual environment first:" >&2
    echo "  python3 -m venv .venv && source .venv/bin/activate" >&2
    exit 1
fi
python -m pip install --quiet --disable-pip-version-check -e ".[test]"
bash .ci/system-deps.sh
bash .ci/browser-deps.sh
bash .ci/prometheus-deps.sh
bash .ci/hub-deps.sh
bash .ci/k8s-deps.sh
bash .ci/podman-deps.sh
bash .ci/docker-deps.sh
exec python -m pytest "$@"
