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

SCRIPT=tests/lmeval/setup.sh
WHAT="lm_eval 0.4.13"
DIR=${PD_LMEVAL_DIR:-/var/tmp/pd-lmeval}
PY=${PYTHON:-python3}
APT=""
LMEVAL=lm_eval==0.4.13
# datasets: lm_eval.api.task imports it and loads the local jsonl; numpy: exact_match;
# sacrebleu, jinja2, pyyaml, requests: imported at module level; aiohttp, tenacity, tqdm:
# the API models (local-completions); pytablewriter: the CLI's result table.
DEPS="datasets==5.2.0 numpy==2.4.6 jinja2==3.1.6 pyyaml==6.0.4 requests==2.34.2
sacrebleu==2.6.0 aiohttp==3.14.5 tenacity==9.2.1 tqdm==4.70.1 pytablewriter==1.2.1"
WANT="$($PY -c 'import sys; print(sys.version.split()[0])') $LMEVAL $(echo $DEPS)"
# shellcheck source=../tool_venv.sh
. "$(dirname "$0")/../tool_venv.sh"

already_installed "$VENV/bin/python" \
    "$VENV/bin/python" -c 'import lm_eval.api.task, lm_eval.models.api_models'
fresh_venv
pip_install --no-deps "$LMEVAL"
# shellcheck disable=SC2086
pip_install $DEPS
step="checking that lm_eval imports"
"$VENV/bin/python" -c 'import lm_eval, lm_eval.api.task, lm_eval.filters, lm_eval.models.api_models
assert lm_eval.__version__ == "0.4.13", lm_eval.__version__'
installed "$VENV/bin/python"
