#!/usr/bin/env bash
# Installs what the browser tests (pytest -m browser) need from Debian: chromium and fonts.
# Idempotent: does nothing when /usr/bin/chromium is already there. It never runs
# `playwright install`: Playwright drives Debian's chromium through executable_path, and
# no browser build is downloaded from anywhere but Debian's package archive.
set -euo pipefail

CHROMIUM=/usr/bin/chromium
# shellcheck source=apt.sh
source "$(dirname "$0")/apt.sh"

if [ -x "$CHROMIUM" ]; then
    echo "browser-deps: $CHROMIUM is already installed"
    exit 0
fi

# Fonts come along so that screenshots show text rather than empty boxes.
apt_install chromium fonts-liberation fonts-dejavu-core ||
    not_installed browser-deps "$CHROMIUM" chromium fonts-liberation fonts-dejavu-core

if [ ! -x "$CHROMIUM" ]; then
    echo "browser-deps: apt-get finished but $CHROMIUM is still missing" >&2
    exit 1
fi
echo "browser-deps: installed $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
