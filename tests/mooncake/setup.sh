#!/bin/bash
# Installs the real Mooncake master (`mooncake_master`, from the mooncake-transfer-engine
# wheels on PyPI) for the KV-store tests, in its own venv outside the project's (default
# /var/tmp/pd-mooncake/venv; PD_MOONCAKE_DIR moves it, and the tests then need
# PD_MOONCAKE_MASTER=$PD_MOONCAKE_DIR/venv/bin/mooncake_master).
#
# On x86_64 without CUDA the wheel is mooncake-transfer-engine-non-cuda (the same package and
# binaries; docs/kv-store.md). Its transfer engine links Debian's libibverbs1 and librdmacm1
# even for TCP, so they are installed with apt-get when missing (run as root, like
# `make test`). Idempotent: a stamp holds what was installed.
set -euo pipefail

SCRIPT=tests/mooncake/setup.sh
WHAT=mooncake_master
DIR=${PD_MOONCAKE_DIR:-/var/tmp/pd-mooncake}
PY=${PYTHON:-python3}
APT="libibverbs1 librdmacm1"
case "$(uname -m)" in
    x86_64) WHEEL=mooncake-transfer-engine-non-cuda==0.3.13.post1 ;;
    *) WHEEL=mooncake-transfer-engine==0.3.13.post1 ;;
esac
WANT="$($PY -c 'import sys; print(sys.version.split()[0])') $WHEEL"
# shellcheck source=../tool_venv.sh
. "$(dirname "$0")/../tool_venv.sh"

already_installed "$VENV/bin/mooncake_master" \
    "$VENV/bin/python" -c 'import mooncake.store, os, sys; sys.exit(not os.access(sys.argv[1], os.X_OK))' \
    "$VENV/bin/mooncake_master"
fresh_venv
pip_install "$WHEEL"
step="checking that mooncake_master and the store client load"
"$VENV/bin/python" -c 'import mooncake.store; mooncake.store.MooncakeDistributedStore()'
"$VENV/bin/mooncake_master" --version
installed "$VENV/bin/mooncake_master"
