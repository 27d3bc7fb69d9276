#!/bin/bash
# Installs the real AIPerf 0.13.0 (ai-dynamo/aiperf) for tests/test_agentic.py, in its own
# venv outside the project's (default /var/tmp/pd-aiperf/venv; PD_AIPERF_DIR moves it, and the
# tests then need PD_AIPERF=$PD_AIPERF_DIR/venv/bin/aiperf). About 1.2 GB with its
# dependencies, installed as the package index gives them.
# Idempotent (a stamp holds the Python version and the requirement); run as root, like
# `make test`.
set -euo pipefail

DIR=${PD_AIPERF_DIR:-/var/tmp/pd-aiperf}
PY=${PYTHON:-python3}
AIPERF=aiperf==0.13.0
WANT="$($PY -c 'import sys; print(sys.version.split()[0])') $AIPERF"
STAMP=$DIR/.installed
VENV=$DIR/venv

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
    && "$VENV/bin/aiperf" --version >/dev/null 2>&1; then
    echo "aiperf 0.13.0 already installed: $VENV/bin/aiperf"
    exit 0
fi

step="checking"
trap 'echo "tests/aiperf/setup.sh: installing aiperf 0.13.0 into $DIR failed while $step; see the output above (it needs PyPI)." >&2' ERR

t0=$(date +%s)
if ! $PY -m venv --help >/dev/null 2>&1; then
    step="installing python3-venv with apt-get (needs root)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q python3-venv
fi
mkdir -p "$DIR"
rm -rf "$VENV" "$STAMP"  # the stamp is written last: a half-done install is redone
step="creating the venv"
$PY -m venv "$VENV"
t1=$(date +%s)
step="pip-installing $AIPERF"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$AIPERF" 2>&1 \
    | { grep -v "is ignored: it is neither" || true; }
t2=$(date +%s)
step="checking that aiperf runs"
"$VENV/bin/python" -c 'import importlib.metadata as m
v = m.version("aiperf"); assert v == "0.13.0", v'
"$VENV/bin/aiperf" --version >/dev/null
echo "$WANT" > "$STAMP"
t3=$(date +%s)
echo "aiperf 0.13.0 installed: $VENV/bin/aiperf ($(du -sh "$VENV" | cut -f1)); venv $((t1 - t0)) s, pip $((t2 - t1)) s, check $((t3 - t2)) s"
