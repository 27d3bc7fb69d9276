#!/bin/sh
# Installs Debian's prometheus package (2.42 on bookworm: `prometheus` and `promtool`) for
# tests/test_prometheus.py. Idempotent: does nothing when both binaries are there. Needs root
# (apt-get). The Debian service is neither started nor left enabled: the tests start their own
# Prometheus on 127.0.0.1 with a temporary config and storage directory, and stop it.
set -eu
PROM=/usr/bin/prometheus
PROMTOOL=/usr/bin/promtool
if [ -x "$PROM" ] && [ -x "$PROMTOOL" ]; then
    echo "prometheus already installed: $("$PROM" --version 2>&1 | head -n 1)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "run as root: apt-get must install prometheus (sudo bash $0)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# No service may start during the install: without a policy-rc.d, put one in place that
# refuses every start (exit 101, see invoke-rc.d(8)) and take it away afterwards.
POLICY=/usr/sbin/policy-rc.d
OURS=""
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# tests/prometheus/setup.sh: no service starts during this install\nexit 101\n' >"$POLICY"
    chmod 755 "$POLICY"
    OURS=1
fi
cleanup() { if [ -n "$OURS" ]; then rm -f "$POLICY"; fi; }
trap cleanup EXIT INT TERM
apt-get update -qq
# --no-install-recommends: the recommended prometheus-node-exporter would be a second service
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package enables its unit on install; the tests run their own instance, never this one.
if command -v deb-systemd-helper >/dev/null 2>&1; then
    deb-systemd-helper disable prometheus.service >/dev/null 2>&1 || true
fi
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
if command -v update-rc.d >/dev/null 2>&1 && [ -e /etc/init.d/prometheus ]; then
    update-rc.d prometheus disable >/dev/null 2>&1 || true
fi
"$PROM" --version 2>&1 | head -n 1
