#!/usr/bin/env bash
# Installs what the browser tests (pytest -m browser) need from Debian: chromium and fonts.
# Idempotent: does nothing when /usr/bin/chromium is already there. It never runs
# `playwright install`: Playwright drives Debian's chromium through executable_path, and
# no browser build is downloaded from anywhere but Debian's package archive.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
    echo "browser-deps: $CHROMIUM is already installed"
    exit 0
fi

# Root installs directly (CI runs as root); anyone else goes through sudo.
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    as_root=(sudo)
fi

export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -q
# Fonts come along so that screenshots show text rather than empty boxes.
"${as_root[@]}" apt-get install -y -q --no-install-recommends \
    chromium fonts-liberation fonts-dejavu-core

if [ ! -x "$CHROMIUM" ]; then
    echo "browser-deps: apt-get finished but $CHROMIUM is still missing" >&2
    exit 1
fi
echo "browser-deps: installed $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
