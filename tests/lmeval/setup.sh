#!/bin/bash
# Installs the real lm-evaluation-harness 0.4.13 for tests/test_gsm8k_lmeval.py, in its own
# venv outside the project's (default /var/tmp/pd-lmeval/venv; PD_LMEVAL_DIR moves it, and the
# tests then need PD_LMEVAL_PYTHON=$PD_LMEVAL_DIR/venv/bin/python).
#
# Lightest install that runs lm_eval's gsm8k task code, filters, metric, API models and CLI:
# lm_eval itself with --no-deps (its full list pulls scikit-learn, evaluate, rouge-score...),
# then what those modules import. No torch, no transformers: nothing here tokenizes.
# Idempotent (a stamp holds the requirement list); run as root, like `make test`.
set -euo pipefail

DIR=${PD_LMEVAL_DIR:-/var/tmp/pd-lmeval}
PY=${PYTHON:-python3}
LMEVAL=lm_eval==0.4.13
# datasets: lm_eval.api.task imports it and loads the local jsonl; numpy: exact_match;
# sacrebleu, jinja2, pyyaml, requests: imported at module level; aiohttp, tenacity, tqdm:
# the API models (local-completions); pytablewriter: the CLI's result table.
DEPS="datasets==5.2.0 numpy==2.4.6 jinja2==3.1.6 pyyaml==6.0.4 requests==2.34.2
sacrebleu==2.6.0 aiohttp==3.14.5 tenacity==9.2.1 tqdm==4.70.1 pytablewriter==1.2.1"
WANT="$($PY -c 'import sys; print(sys.version.split()[0])') $LMEVAL $(echo $DEPS)"
STAMP=$DIR/.installed
VENV=$DIR/venv

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
    && "$VENV/bin/python" -c 'import lm_eval.api.task, lm_eval.models.api_models' 2>/dev/null; then
    echo "lm_eval 0.4.13 already installed: $VENV/bin/python"
    exit 0
fi

step="checking"
trap 'echo "tests/lmeval/setup.sh: installing lm_eval 0.4.13 into $DIR failed while $step; see the output above (it needs PyPI)." >&2' ERR

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
step="pip-installing $LMEVAL"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$LMEVAL" 2>&1 \
    | { grep -v "is ignored: it is neither" || true; }
step="pip-installing its modules' imports"
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install -q --disable-pip-version-check $DEPS 2>&1 \
    | { grep -v "is ignored: it is neither\|dependency conflicts\|lm-eval 0.4.13 requires\|dependency resolver" || true; }
t2=$(date +%s)
step="checking that lm_eval imports"
"$VENV/bin/python" -c 'import lm_eval, lm_eval.api.task, lm_eval.filters, lm_eval.models.api_models
assert lm_eval.__version__ == "0.4.13", lm_eval.__version__'
echo "$WANT" > "$STAMP"
t3=$(date +%s)
echo "lm_eval 0.4.13 installed: $VENV/bin/python ($(du -sh "$VENV" | cut -f1)); venv $((t1 - t0)) s, pip $((t2 - t1)) s, check $((t3 - t2)) s"
