#!/usr/bin/env bash
# Installs what the JupyterHub tests (tests/hub/) need beyond Python: node and npm from
# Debian's packages, and configurable-http-proxy (the hub's proxy) from the npm registry,
# into build/hub-deps/ of this checkout (gitignored). Idempotent: does nothing when
# configurable-http-proxy is already there or on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=apt.sh
source .ci/apt.sh
PREFIX=build/hub-deps
CHP="$PREFIX/node_modules/.bin/configurable-http-proxy"

if have configurable-http-proxy; then
    echo "hub-deps: $(command -v configurable-http-proxy) is already installed"
    exit 0
fi
if [ -x "$CHP" ]; then
    echo "hub-deps: $CHP is already installed"
    exit 0
fi

if ! have node || ! have npm; then
    apt_install nodejs npm || not_installed hub-deps "node or npm (for configurable-http-proxy)" nodejs npm
fi

mkdir -p "$PREFIX"
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error configurable-http-proxy
if [ ! -x "$CHP" ]; then
    echo "hub-deps: npm finished but $CHP is missing" >&2
    exit 1
fi
echo "hub-deps: installed configurable-http-proxy $("$CHP" --version 2>/dev/null || echo '?') in $PREFIX"
