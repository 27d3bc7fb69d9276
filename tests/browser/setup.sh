#!/bin/sh
# Installs Debian's chromium for tests/test_dashboard_browser.py (marker `browser`).
# Idempotent: does nothing when /usr/bin/chromium is already there. Needs root (apt-get).
# Never runs `playwright install`: the tests drive the distribution's browser.
set -eu
if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || true)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "run as root: apt-get must install chromium" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends chromium fonts-dejavu-core
/usr/bin/chromium --version
