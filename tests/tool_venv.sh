# What the test setups share that install a tool into a venv of its own (tests/lmeval,
# tests/aiperf, tests/mooncake): a stamp holding what was installed, written last, so a
# half-done install is redone; an error line naming the step that failed.
# Sourced after the caller sets SCRIPT (its path, for messages), WHAT (what it installs), DIR,
# PY, WANT (what the stamp holds) and APT (Debian packages it needs beside python3-venv).
set -eEuo pipefail  # -E: the error line below also fires inside these functions

STAMP=$DIR/.installed
VENV=$DIR/venv
step="checking"
T0=$(date +%s)
trap 'echo "$SCRIPT: installing $WHAT into $DIR failed while $step; see the output above (it needs PyPI${APT:+ and apt})." >&2' ERR

# already_installed WHERE CHECK...: exit 0, saying so, when the stamp matches and CHECK runs
already_installed() {
    local where=$1
    shift
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$@" >/dev/null 2>&1; then
        echo "$WHAT already installed: $where"
        exit 0
    fi
}

# fresh_venv: the Debian packages and python3-venv where missing, then an empty venv
fresh_venv() {
    local missing="" pkg
    for pkg in $APT; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
    done
    if [ -n "$missing" ] || ! $PY -m venv --help >/dev/null 2>&1; then
        step="installing$missing python3-venv with apt-get (needs root)"
        export DEBIAN_FRONTEND=noninteractive
        # Only what is named: libibverbs1 recommends ibverbs-providers, whose libefa nixl's
        # bundled UCX then loads beside its own libnl, and real vLLM (CPU) crashes at exit
        # (docs/vllm-cpu.md).
        # shellcheck disable=SC2086
        apt-get update -q && apt-get install -y -q --no-install-recommends $missing python3-venv
    fi
    mkdir -p "$DIR"
    rm -rf "$VENV" "$STAMP"
    step="creating the venv"
    $PY -m venv "$VENV"
}

# pip_install ARGS...: quietly, without pip's notes on extras and on what --no-deps left out
pip_install() {
    step="pip-installing $*"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
        | { grep -v "is ignored: it is neither\|dependency conflicts\|dependency resolver\| requires .*, which is not installed" || true; }
}

# installed WHERE: the stamp written; where it is, its size and how long it took
installed() {
    echo "$WANT" > "$STAMP"
    echo "$WHAT installed: $1 ($(du -sh "$VENV" | cut -f1)) in $(($(date +%s) - T0)) s"
}
