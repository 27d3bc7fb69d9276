#!/usr/bin/env bash
# Bring up a local multi-node Slurm (Debian's 22.05 packages) on this one host:
# munge, slurmctld and DEVCLUSTER_NODES `slurmd -N` fake nodes with 4 fake GPUs each.
# Idempotent: running it again only starts what is missing. Needs root.
#
#   DEVCLUSTER_DIR     state folder (config, logs, spool, pids)   default /var/tmp/pd-devcluster
#   DEVCLUSTER_NODES   number of nodes gb200-01..                 default 12
#   DEVCLUSTER_PARTITIONS  partitions dev, dev2, ... splitting the nodes in order
#                      (dev, the default one, gets any remainder)  default 2
#   DEVCLUSTER_GPUS    fake GPUs per node                         default 4
#   DEVCLUSTER_CPUS    CPUs declared per node                     default 16
#   DEVCLUSTER_MEM_MB  RealMemory declared per node               default 16384
#   DEVCLUSTER_CTLD_PORT  slurmctld port                          default 6817
#   DEVCLUSTER_SLURMD_PORT first slurmd port (one per node)       default 17001
#   DEVCLUSTER_TIMEOUT seconds to wait for the nodes              default 60
#   DEVCLUSTER_NO_ETC=1  do not link /etc/slurm/slurm.conf (clients then need SLURM_CONF)
set -euo pipefail

DIR=${DEVCLUSTER_DIR:-/var/tmp/pd-devcluster}
NODES=${DEVCLUSTER_NODES:-12}
PARTS=${DEVCLUSTER_PARTITIONS:-2}
GPUS=${DEVCLUSTER_GPUS:-4}
CPUS=${DEVCLUSTER_CPUS:-16}
MEM_MB=${DEVCLUSTER_MEM_MB:-16384}
CTLD_PORT=${DEVCLUSTER_CTLD_PORT:-6817}
SLURMD_PORT=${DEVCLUSTER_SLURMD_PORT:-17001}
TIMEOUT=${DEVCLUSTER_TIMEOUT:-60}
PARTITION=dev
PREFIX=gb200-
HOSTS_TAG="# pd-devcluster $DIR"

die() { echo "devcluster: error: $*" >&2; exit 1; }
log() { echo "devcluster: $*" >&2; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts daemons): sudo bash $0"
case "$NODES" in ''|*[!0-9]*) die "DEVCLUSTER_NODES must be a number, got '$NODES'";; esac
[ "$NODES" -ge 1 ] && [ "$NODES" -le 99 ] || die "DEVCLUSTER_NODES must be 1..99, got $NODES"
case "$PARTS" in ''|*[!0-9]*) die "DEVCLUSTER_PARTITIONS must be a number, got '$PARTS'";; esac
[ "$PARTS" -ge 1 ] && [ "$PARTS" -le "$NODES" ] \
    || die "DEVCLUSTER_PARTITIONS must be 1..$NODES (a node or more each), got $PARTS"

# ---------------------------------------------------------------- packages
need_pkgs=()
for p in munge slurmctld slurmd slurm-client; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
    log "installing ${need_pkgs[*]} (apt-get)"
    mkdir -p "$DIR/log"
    apt_log="$DIR/log/apt.log"
    export DEBIAN_FRONTEND=noninteractive
    # A machine where `apt-get update` never ran has no package lists: update first, always
    # (cheap, and stale lists give 404s on security updates).
    apt-get update -qq >"$apt_log" 2>&1 || { tail -n 20 "$apt_log" >&2; die "apt-get update failed"; }
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >>"$apt_log" 2>&1 \
        || { tail -n 20 "$apt_log" >&2; die "apt-get install ${need_pkgs[*]} failed (log: $apt_log)"; }
fi

# ---------------------------------------------------------------- layout and config
NODE_LAST=$(printf '%02d' "$NODES")
NODE_EXPR="${PREFIX}[01-${NODE_LAST}]"
[ "$NODES" = 1 ] && NODE_EXPR="${PREFIX}01"
NODE_NAMES=()
for i in $(seq 1 "$NODES"); do NODE_NAMES+=("$(printf '%s%02d' "$PREFIX" "$i")"); done
# Partitions: dev (the default), dev2, ...: consecutive nodes, the same limits, so that
# jobs of one never wait for, or share a node with, another's (the tests give each of their
# two dev-cluster lanes one).
range_expr() {  # first last (1-based)
    if [ "$1" = "$2" ]; then printf '%s%02d' "$PREFIX" "$1"
    else printf '%s[%02d-%02d]' "$PREFIX" "$1" "$2"; fi
}
# Each partition's srun ports: a range of its own above the kernel's ephemeral ports
# (32768-60999), so that Slurm's messages for a killed srun's step (they go to that srun's
# ports, and srun does not check which step a message is for) can only reach an srun of the
# same partition, never another lane's: on a real cluster they are other hosts' ports.
# The partition's slurmds read a config that differs in that line alone (jobs then get it as
# SLURM_CONF); clients on this host read the first partition's, or name theirs.
SRUN_PORTS_FIRST=61000
SRUN_PORTS_SPAN=$(( (65000 - SRUN_PORTS_FIRST) / PARTS )); [ "$SRUN_PORTS_SPAN" -le 2000 ] || SRUN_PORTS_SPAN=2000
PART_LINES=""
PART_SUMMARY=""
PART_NAMES=()
declare -A NODE_PART=()  # node -> its partition's index (1-based)
per=$((NODES / PARTS))
first=1
for k in $(seq 1 "$PARTS"); do
    name=$PARTITION; [ "$k" = 1 ] || name="$PARTITION$k"
    PART_NAMES+=("$name")
    count=$per; [ "$k" = 1 ] && count=$((per + NODES % PARTS))
    last=$((first + count - 1))
    default=NO; [ "$k" = 1 ] && default=YES
    PART_LINES+="PartitionName=$name Nodes=$(range_expr "$first" "$last") Default=$default MaxTime=INFINITE State=UP"$'\n'
    PART_SUMMARY+="${PART_SUMMARY:+, }$name $(range_expr "$first" "$last")"
    for i in $(seq "$first" "$last"); do NODE_PART[${NODE_NAMES[$((i - 1))]}]=$k; done
    first=$((last + 1))
done
srun_ports() {  # partition index (1-based)
    local lo=$((SRUN_PORTS_FIRST + ($1 - 1) * SRUN_PORTS_SPAN))
    echo "$lo-$((lo + SRUN_PORTS_SPAN - 1))"
}
part_conf() {  # partition index: the config its slurmds and clients read
    if [ "$1" = 1 ]; then echo "$CONF"; else echo "$DIR/etc/slurm.${PART_NAMES[$(($1 - 1))]}.conf"; fi
}
PART_LINES=${PART_LINES%$'\n'}
PORT_LAST=$((SLURMD_PORT + NODES - 1))
PORT_EXPR="[${SLURMD_PORT}-${PORT_LAST}]"
[ "$NODES" = 1 ] && PORT_EXPR=$SLURMD_PORT

mkdir -p "$DIR"/{etc,state,spool,log,run,dev}
# A stand-in for the IMEX channel device (slurm/devcluster/site-profile.yaml checks for it)
mkdir -p "$DIR/imex" && touch "$DIR/imex/channel0"
for n in "${NODE_NAMES[@]}"; do mkdir -p "$DIR/spool/$n"; done
chmod 755 "$DIR"

# Fake GPUs: GRES needs real character devices, otherwise Slurm drops them and
# CUDA_VISIBLE_DEVICES stays empty. Same numbers as /dev/null: harmless to open.
for g in $(seq 0 $((GPUS - 1))); do
    f="$DIR/dev/gpu$g"
    [ -c "$f" ] || { rm -f "$f"; mknod -m 666 "$f" c 1 3; }
done

CONF="$DIR/etc/slurm.conf"
new_conf=$(cat <<EOF
# Generated by slurm/devcluster/up.sh; edits are overwritten.
ClusterName=pddev
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups/systemd in containers and VMs: track processes by parent pid.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# No slurmdbd: final job states go to a text file instead (sacct does not work).
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# First in, first out, no backfill: backfill's plan kept nodes it had planned for a job that
# then started elsewhere PLANNED, closed to other jobs, until a later pass (even every 2 s),
# so two jobs submitted together ran one after the other now and then. A job that finds its
# nodes not yet free is tried again within a second (sched_interval, default 60 s: it waited
# for the next job's end), and batch jobs start at once (batch_sched_delay, default 3 s).
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_interval=1
MpiDefault=none
# SPANK plugins (pyxis, written by slurm/devcluster/containers.sh). Named, because clients
# that read /etc/slurm/slurm.conf through the link would look beside the link instead.
PlugStackConfig=$DIR/etc/plugstack.conf
MailProg=/bin/true
ReturnToService=2
# Declared CPUs/memory/GPUs win over what slurmd detects on this small host.
SlurmdParameters=config_overrides
GresTypes=gpu
# KillWait as on real clusters (the launcher's teardown must fit inside it); keep finished jobs visible to
# squeue/scontrol for 30 min since there is no accounting.
KillWait=30
UnkillableStepTimeout=30
MinJobAge=1800
MessageTimeout=10
# A lost node is NODE_FAIL after 20 s (sites: 300); the node-loss tests wait for it. Above
# MessageTimeout, and far above what a slurmd on a loaded 2-core host takes to answer a ping.
SlurmdTimeout=20
InactiveLimit=0
MaxStepCount=100000
# The partitions' configs differ in SrunPortRange alone (above): not worth an error per node.
DebugFlags=NO_CONF_HASH
NodeName=$NODE_EXPR NodeAddr=127.0.0.1 Port=$PORT_EXPR CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$GPUS State=UNKNOWN
$PART_LINES
EOF
)
GPU_FILES="$DIR/dev/gpu[0-$((GPUS - 1))]"
[ "$GPUS" = 1 ] && GPU_FILES="$DIR/dev/gpu0"
new_gres=$(printf 'AutoDetect=off\nNodeName=%s Name=gpu File=%s\n' "$NODE_EXPR" "$GPU_FILES")
# slurmd 22.05 always loads a cgroup plugin; v1 does nothing unless cgroup
# plugins are configured, so it works on v1, hybrid and pure v2 hosts alike.
new_cgroup=$(printf 'CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n')

changed=0
write_if_changed() {  # file content
    if [ ! -f "$1" ] || [ "$(cat "$1")" != "$2" ]; then
        printf '%s\n' "$2" >"$1.tmp" && mv -f "$1.tmp" "$1"
        changed=1
    fi
}
for k in $(seq 1 "$PARTS"); do
    write_if_changed "$(part_conf "$k")" "$new_conf"$'\n'"SrunPortRange=$(srun_ports "$k")"
done
write_if_changed "$DIR/etc/gres.conf" "$new_gres"
write_if_changed "$DIR/etc/cgroup.conf" "$new_cgroup"
# An empty plugstack until containers.sh loads pyxis into it.
[ -f "$DIR/etc/plugstack.conf" ] || : >"$DIR/etc/plugstack.conf"

export SLURM_CONF="$CONF"

# Clients read /etc/slurm/slurm.conf unless SLURM_CONF is set: link it there when
# that does not clobber a real cluster's config.
ETC_LINKED=0
if [ "${DEVCLUSTER_NO_ETC:-0}" != 1 ]; then
    mkdir -p /etc/slurm
    cur=/etc/slurm/slurm.conf
    # Ours = missing, dangling, or a link to a file this script generated.
    if [ ! -e "$cur" ] || { [ -L "$cur" ] && grep -q "Generated by slurm/devcluster/up.sh" "$cur"; }; then
        ln -sfn "$CONF" "$cur"
        ETC_LINKED=1
    else
        log "/etc/slurm/slurm.conf exists and is not ours: left alone; clients need SLURM_CONF"
    fi
fi

# Node names resolve to this host (one line, replaced when the node list changes).
hosts_line="127.0.0.1 ${NODE_NAMES[*]} $HOSTS_TAG"
if ! grep -qxF "$hosts_line" /etc/hosts; then
    # Rewrite in place (not mv): /etc/hosts is often a bind mount in containers.
    others=$(awk -v t=" $HOSTS_TAG" 'substr($0, length($0) - length(t) + 1) != t' /etc/hosts)
    printf '%s\n%s\n' "$others" "$hosts_line" >/etc/hosts
fi

# ---------------------------------------------------------------- munge
munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
if ! munge_ok; then
    if [ ! -s /etc/munge/munge.key ]; then
        mkdir -p /etc/munge && chown munge:munge /etc/munge && chmod 700 /etc/munge
        runuser -u munge -- mungekey -c -k /etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    # --force: a socket left over from before a reboot must not block the start.
    runuser -u munge -- /usr/sbin/munged --force >/dev/null 2>&1 || true
    for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
    munge_ok || die "munged does not answer (see /var/log/munge/munged.log)"
fi

# ---------------------------------------------------------------- daemons
# A pid file counts only if that process is alive and is the expected daemon
# (pid files survive reboots and pids get reused).
pid_alive() {  # pidfile name-in-cmdline [arg-in-cmdline]
    local pid
    [ -f "$1" ] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$2" || return 1
    [ -z "${3:-}" ] || tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- " $3\( \|$\)"
}
ctld_pidfile="$DIR/run/slurmctld.pid"
slurmd_pidfile() { echo "$DIR/run/slurmd.$1.pid"; }

tail_logs() {
    for f in "$DIR"/log/slurmctld.log "$DIR"/log/slurmd.*.log; do
        [ -f "$f" ] || continue
        echo "----- tail $f" >&2
        tail -n 15 "$f" >&2
    done
}

any_daemon_alive() {
    local f n
    pid_alive "$ctld_pidfile" slurmctld && return 0
    for f in "$DIR"/run/slurmd.*.pid; do
        [ -f "$f" ] || continue
        n=${f##*/slurmd.}; n=${n%.pid}
        pid_alive "$f" slurmd "$n" && return 0
    done
    return 1
}
if [ "$changed" = 1 ] && any_daemon_alive; then
    # New node list or limits: slurmd and slurmctld must re-read it together.
    log "configuration changed: restarting the daemons"
    scontrol shutdown >/dev/null 2>&1 || true
    for _ in $(seq 100); do any_daemon_alive || break; sleep 0.1; done
    if any_daemon_alive; then
        for f in "$ctld_pidfile" "$DIR"/run/slurmd.*.pid; do
            [ -f "$f" ] && pid_alive "$f" slurm && kill -9 "$(cat "$f")" 2>/dev/null || true
        done
        sleep 0.2
    fi
fi
# slurmds of nodes no longer configured (DEVCLUSTER_NODES lowered).
for f in "$DIR"/run/slurmd.*.pid; do
    [ -f "$f" ] || continue
    n=${f##*/slurmd.}; n=${n%.pid}
    if ! printf '%s\n' "${NODE_NAMES[@]}" | grep -qx "$n"; then
        pid_alive "$f" slurmd "$n" && kill "$(cat "$f")" 2>/dev/null || true
        rm -f "$f"
    fi
done

started=()
ctld_started_at=0
if ! pid_alive "$ctld_pidfile" slurmctld; then
    rm -f "$ctld_pidfile"
    ctld_started_at=$(date +%s)
    # -i: ignore unreadable state left by a crash or an older config.
    slurmctld -i || { tail_logs; die "slurmctld did not start"; }
    started+=(slurmctld)
fi
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
scontrol ping 2>/dev/null | grep -q UP || { tail_logs; die "slurmctld does not answer scontrol ping"; }

for n in "${NODE_NAMES[@]}"; do
    pf=$(slurmd_pidfile "$n")
    if ! pid_alive "$pf" slurmd "$n"; then
        rm -f "$pf"
        SLURM_CONF=$(part_conf "${NODE_PART[$n]}") slurmd -N "$n" \
            || { tail_logs; die "slurmd -N $n did not start"; }
        started+=("$n")
    fi
done

# ---------------------------------------------------------------- wait for the nodes
# Usable = responding and not down/drained. Nodes that a crash or reboot left
# DOWN/DRAIN are resumed once.
resumed=0
deadline=$((SECONDS + TIMEOUT))
while :; do
    bad=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u \
        | awk '$2 !~ /^(idle|alloc|mix|comp)$/ {print}' || true)
    total=$(sinfo -h -N -o '%N' 2>/dev/null | sort -u | wc -l)
    if [ -z "$bad" ] && [ "$total" = "$NODES" ]; then break; fi
    if [ "$resumed" = 0 ] && [ $((SECONDS + TIMEOUT - deadline)) -ge 5 ]; then
        down=$(printf '%s\n' "$bad" | awk '$2 ~ /^(down|drain|drng|fail|inval)/ && $2 !~ /\*$/ {print $1}' | sort -u | paste -sd, -)
        if [ -n "$down" ]; then
            log "resuming $down"
            scontrol update nodename="$down" state=resume 2>/dev/null || true
            resumed=1
        fi
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "devcluster: error: nodes not ready after ${TIMEOUT}s:" >&2
        sinfo -N -o '%N %P %t %E' >&2 || true
        tail_logs
        exit 1
    fi
    sleep 0.5
done

# ---------------------------------------------------------------- ghost jobs
# After a reboot (or kill -9 of everything) the saved state still lists jobs as
# RUNNING whose processes are gone; Slurm keeps them for a long time. A batch job
# that started before this slurmctld and has no batch slurmstepd of ours is one.
if [ "$ctld_started_at" != 0 ]; then
    ghosts=()
    while read -r line; do
        id=$(sed -n 's/^JobId=\([0-9]*\) .*/\1/p' <<<"$line")
        start=$(sed -n 's/.* StartTime=\([^ ]*\) .*/\1/p' <<<"$line")
        [ -n "$id" ] && [ -n "$start" ] || continue
        grep -q ' BatchFlag=1 ' <<<"$line" || continue
        start_s=$(date -d "$start" +%s 2>/dev/null || echo 0)
        [ "$start_s" -lt "$ctld_started_at" ] || continue
        alive=0
        for p in $(pgrep -f "^slurmstepd: \[$id\.batch\]" 2>/dev/null || true); do
            [ "$(readlink "/proc/$p/cwd" 2>/dev/null)" = "$DIR/log" ] && alive=1
        done
        [ "$alive" = 1 ] || ghosts+=("$id")
    done < <(scontrol -o show job 2>/dev/null | grep -E 'JobState=(RUNNING|COMPLETING|SUSPENDED) ' || true)
    if [ ${#ghosts[@]} -gt 0 ]; then
        log "cancelling jobs whose processes did not survive a restart: ${ghosts[*]}"
        scancel "${ghosts[@]}" 2>/dev/null || true
    fi
fi

# ---------------------------------------------------------------- summary
states=$(sinfo -h -N -o '%N %t' | sort -u | awk '{print $2}' | sort | uniq -c | awk '{printf "%s%s:%s", sep, $2, $1; sep=" "}')
echo "devcluster: up: partitions $PART_SUMMARY ($NODES x ${GPUS} GPUs, ${CPUS} CPUs), $states, started: ${started[*]:-nothing (already running)}, state $DIR"
ports=""
for k in $(seq 1 "$PARTS"); do ports+="${ports:+, }${PART_NAMES[$((k - 1))]} $(srun_ports "$k") ($(part_conf "$k"))"; done
echo "devcluster: srun ports: $ports"
if [ "$ETC_LINKED" = 1 ]; then
    echo "devcluster: /etc/slurm/slurm.conf -> $CONF (clients need no env; or: export SLURM_CONF=$CONF)"
else
    echo "export SLURM_CONF=$CONF"
fi
