#!/bin/bash
# Installs the real AIPerf 0.13.0 (ai-dynamo/aiperf) for tests/test_agentic.py, in its own
# venv outside the project's (default /var/tmp/pd-aiperf/venv; PD_AIPERF_DIR moves it, and the
# tests then need PD_AIPERF=$PD_AIPERF_DIR/venv/bin/aiperf). About 1.2 GB with its
# dependencies, installed as the package index gives them.
# Idempotent (a stamp holds the Python version and the requirement); run as root, like
# `make test`.
set -euo pipefail

SCRIPT=tests/aiperf/setup.sh
WHAT="aiperf 0.13.0"
DIR=${PD_AIPERF_DIR:-/var/tmp/pd-aiperf}
PY=${PYTHON:-python3}
APT=""
AIPERF=aiperf==0.13.0
WANT="$($PY -c 'import sys; print(sys.version.split()[0])') $AIPERF"
# shellcheck source=../tool_venv.sh
. "$(dirname "$0")/../tool_venv.sh"

already_installed "$VENV/bin/aiperf" "$VENV/bin/aiperf" --version
fresh_venv
pip_install "$AIPERF"
step="checking that aiperf runs"
"$VENV/bin/python" -c 'import importlib.metadata as m
v = m.version("aiperf"); assert v == "0.13.0", v'
"$VENV/bin/aiperf" --version >/dev/null
installed "$VENV/bin/aiperf"
