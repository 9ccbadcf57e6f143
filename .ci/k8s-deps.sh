#!/usr/bin/env bash
# Installs the Prometheus Operator's CRD models for tests/deploy/test_kubernetes.py:
# cloudcoil-models-prometheus-operator from PyPI (pydantic models generated from the
# operator's published CRDs, one release of the package per operator release), into
# build/k8s-schemas/ of this checkout (gitignored), NOT into the test environment: the package
# brings the cloudcoil client, whose pytest plugin (a pytest11 entry point) would load in every
# pytest run. The test runs its validator in a subprocess with this folder on its path.
# Idempotent: does nothing when the models are already there.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=build/k8s-schemas
MODELS="$TARGET/cloudcoil/models/prometheus_operator/v1.py"

if [ -f "$MODELS" ]; then
    echo "k8s-deps: $MODELS is already installed"
    exit 0
fi
mkdir -p "$TARGET"
python -m pip install --quiet --disable-pip-version-check --target "$TARGET" \
    "cloudcoil-models-prometheus-operator>=0.80.1"
if [ ! -f "$MODELS" ]; then
    echo "k8s-deps: pip finished but $MODELS is missing" >&2
    exit 1
fi
echo "k8s-deps: installed $(ls -d "$TARGET"/cloudcoil_models_prometheus_operator-*.dist-info)"
