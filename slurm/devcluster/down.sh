#!/usr/bin/env bash
# Stop the local dev cluster started by up.sh: cancel jobs, stop slurmctld and
# every slurmd, kill leftovers. Idempotent. The state folder stays for
# inspection (logs!) unless --purge.
#
#   down.sh [--purge] [--munge]
#     --purge   also delete DEVCLUSTER_DIR, the /etc/hosts line and the
#               /etc/slurm/slurm.conf link that up.sh made
#     --munge   also stop munged (left running by default: harmless, shared)
set -euo pipefail

DIR=${DEVCLUSTER_DIR:-/var/tmp/pd-devcluster}
HOSTS_TAG="# pd-devcluster $DIR"
PURGE=0
STOP_MUNGE=0
for a in "$@"; do
    case "$a" in
        --purge) PURGE=1 ;;
        --munge) STOP_MUNGE=1 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "devcluster: error: unknown option $a (use --purge, --munge)" >&2; exit 2 ;;
    esac
done
log() { echo "devcluster: $*" >&2; }

[ "$(id -u)" = 0 ] || { echo "devcluster: error: run as root" >&2; exit 1; }

CONF="$DIR/etc/slurm.conf"
export SLURM_CONF="$CONF"
have_ctl=0
command -v scontrol >/dev/null && [ -f "$CONF" ] && have_ctl=1

# Cancel jobs first so slurmstepd kills its tasks the normal way (slurmstepd
# outlives slurmd by design; killing it directly would orphan the tasks).
if [ "$have_ctl" = 1 ] && scontrol ping 2>/dev/null | grep -q UP; then
    if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
        log "cancelling jobs"
        squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
        for _ in $(seq 150); do
            [ -z "$(squeue -h -t running,completing -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    scontrol shutdown >/dev/null 2>&1 || true
fi

# Our daemons: by pid file, checked against /proc (stale files after reboot).
daemon_pids() {
    local f pid
    for f in "$DIR"/run/slurmctld.pid "$DIR"/run/slurmd.*.pid; do
        [ -f "$f" ] || continue
        pid=$(cat "$f" 2>/dev/null || true)
        [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || continue
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'slurm' && echo "$pid"
    done
}
# Our slurmstepds: they run with cwd in our log folder.
stepd_pids() {
    local p
    for p in $(pgrep -f '^slurmstepd' 2>/dev/null || true); do
        [ "$(readlink "/proc/$p/cwd" 2>/dev/null)" = "$DIR/log" ] && echo "$p"
    done
}
descendants() {  # pid...: every process below them
    local p c
    for p in "$@"; do
        for c in $(pgrep -P "$p" 2>/dev/null || true); do echo "$c"; descendants "$c"; done
    done
}

for _ in $(seq 50); do [ -z "$(daemon_pids)" ] && break; sleep 0.1; done
pids=$(daemon_pids)
if [ -n "$pids" ]; then
    log "terminating daemons $(echo $pids)"
    kill $pids 2>/dev/null || true
    for _ in $(seq 30); do [ -z "$(daemon_pids)" ] && break; sleep 0.1; done
    pids=$(daemon_pids)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
fi
steps=$(stepd_pids)
if [ -n "$steps" ]; then
    leftovers="$(descendants $steps) $steps"
    log "killing leftover steps and their processes: $(echo $leftovers)"
    kill -9 $leftovers 2>/dev/null || true
fi
rm -f "$DIR"/run/*.pid

if [ "$STOP_MUNGE" = 1 ] && [ -f /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
    log "munged stopped"
fi

if [ "$PURGE" = 1 ]; then
    if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$CONF" ]; then
        rm -f /etc/slurm/slurm.conf
    fi
    # In place, not mv: /etc/hosts may be a bind mount.
    others=$(awk -v t=" $HOSTS_TAG" 'substr($0, length($0) - length(t) + 1) != t' /etc/hosts)
    [ "$others" = "$(cat /etc/hosts)" ] || printf '%s\n' "$others" >/etc/hosts
    case "$DIR" in /|"") ;; *) rm -rf "$DIR" ;; esac
    echo "devcluster: down, purged $DIR"
else
    echo "devcluster: down (state and logs kept in $DIR; --purge deletes them)"
fi
