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

DIR=${PD_MOONCAKE_DIR:-/var/tmp/pd-mooncake}
PY=${PYTHON:-python3}
case "$(uname -m)" in
    x86_64) WHEEL=mooncake-transfer-engine-non-cuda==0.3.13.post1 ;;
    *) WHEEL=mooncake-transfer-engine==0.3.13.post1 ;;
esac
WANT="$($PY -c 'import sys; print(sys.version.split()[0])') $WHEEL"
STAMP=$DIR/.installed
VENV=$DIR/venv

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/mooncake_master" ] \
    && "$VENV/bin/python" -c 'import mooncake.store' 2>/dev/null; then
    echo "mooncake_master already installed: $VENV/bin/mooncake_master"
    exit 0
fi

step="checking"
trap 'echo "tests/mooncake/setup.sh: installing $WHEEL into $DIR failed while $step; see the output above (it needs PyPI and apt)." >&2' ERR

t0=$(date +%s)
missing=""
for lib in libibverbs.so.1 librdmacm.so.1; do
    ldconfig -p | grep -q "$lib" || missing="$missing $lib"
done
if [ -n "$missing" ] || ! $PY -m venv --help >/dev/null 2>&1; then
    step="installing libibverbs1 librdmacm1 python3-venv with apt-get (needs root)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q libibverbs1 librdmacm1 python3-venv
fi
mkdir -p "$DIR"
rm -rf "$VENV" "$STAMP"  # the stamp is written last: a half-done install is redone
step="creating the venv"
$PY -m venv "$VENV"
step="pip-installing $WHEEL"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL" 2>&1 \
    | { grep -v "is ignored: it is neither" || true; }
t1=$(date +%s)
step="checking that mooncake_master and the store client load"
"$VENV/bin/python" -c 'import mooncake.store; mooncake.store.MooncakeDistributedStore()'
"$VENV/bin/mooncake_master" --version
echo "$WANT" > "$STAMP"
t2=$(date +%s)
echo "mooncake_master installed: $VENV/bin/mooncake_master ($(du -sh "$VENV" | cut -f1)); install $((t1 - t0)) s, check $((t2 - t1)) s"
