#!/usr/bin/env bash
# The site's container runtime for the dev cluster, for real: enroot 4.1.2 and pyxis 0.24.0
# built from their release sources, pyxis loaded into the dev cluster's Slurm, a registry on
# this host and the dev cluster's engine image pushed to it (a Debian root filesystem with
# Python; engine environments are mounted into it). Idempotent, cached, no network but
# Debian's mirror (packages and the image's root filesystem). Needs root; run after up.sh.
#
#   PD_VENDOR_DIR      where the two release archives are   default <repo>/../shared/vendor
#   DEVCLUSTER_DIR     the dev cluster's state folder        default /var/tmp/pd-devcluster
#   DEVCLUSTER_REGISTRY host:port of the local registry      default 127.0.0.1:5000
#   DEVCLUSTER_ENROOT_TMPFS enroot's containers and runtime   default /dev/shm/pd-devcluster-enroot
#
# What it leaves: /usr/local/bin/enroot, /usr/local/lib/slurm/spank_pyxis.so, the line in
# $DEVCLUSTER_DIR/etc/plugstack.conf, enroot's site config (per-node folders: the nodes share
# one host; containers and runtime on tmpfs, the layer cache under $DEVCLUSTER_DIR), the registry
# (log/registry.log) and $DEVCLUSTER_DIR/images/engine.ref (the image by tag and by digest).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${DEVCLUSTER_DIR:-/var/tmp/pd-devcluster}
VENDOR=${PD_VENDOR_DIR:-$(cd "$HERE/../.." && pwd)/../shared/vendor}
REGISTRY=${DEVCLUSTER_REGISTRY:-127.0.0.1:5000}
SHM=${DEVCLUSTER_ENROOT_TMPFS:-/dev/shm/pd-devcluster-enroot}
ENROOT_VERSION=4.1.2
PYXIS_VERSION=0.24.0
IMAGE_REPO=pd/devcluster-engine
IMAGE_TAG=bookworm
# What the engine steps need from the image's OS: Python 3.11 (the engine environments are
# venvs made from Debian's python3.11), lscpu and ps, and what vLLM's CPU build links.
IMAGE_PACKAGES=python3-minimal,libpython3.11-stdlib,procps,util-linux,libstdc++6,libgomp1,libnuma1
IMAGE_STAMP="bookworm essential+$IMAGE_PACKAGES merged-usr-hook v2"

die() { echo "containers: error: $*" >&2; exit 1; }
log() { echo "containers: $*" >&2; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages, enroot and pyxis): sudo bash $0"
[ -f "$DIR/etc/slurm.conf" ] || die "no dev cluster in $DIR: run slurm/devcluster/up.sh first"
mkdir -p "$DIR"/{build,log,run,images/cache,enroot}  # images/cache: the profile's containers.image_cache

# ---------------------------------------------------------------- packages
need=()
for p in makeself squashfs-tools libbsd-dev libcap2-bin parallel jq zstd curl libslurm-dev \
         docker-registry skopeo mmdebstrap; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt_log="$DIR/log/apt-containers.log"
    apt-get update -qq >"$apt_log" 2>&1 || { tail -n 20 "$apt_log" >&2; die "apt-get update failed"; }
    apt-get install -y -qq --no-install-recommends "${need[@]}" >>"$apt_log" 2>&1 \
        || { tail -n 20 "$apt_log" >&2; die "apt-get install ${need[*]} failed (log: $apt_log)"; }
fi

# ---------------------------------------------------------------- enroot and pyxis
archive() {  # name version -> path, or die naming both archives
    local f="$VENDOR/$1-$2.tar.gz"
    [ -f "$f" ] || die "$f is missing: the test setup builds enroot $ENROOT_VERSION and pyxis \
$PYXIS_VERSION from their release archives (enroot-$ENROOT_VERSION.tar.gz, \
pyxis-$PYXIS_VERSION.tar.gz); put them in $VENDOR or set PD_VENDOR_DIR to their folder"
    echo "$f"
}

if [ "$(enroot version 2>/dev/null || true)" != "$ENROOT_VERSION" ]; then
    src=$(archive enroot "$ENROOT_VERSION")
    log "building enroot $ENROOT_VERSION (glibc, Debian's makeself and libbsd)"
    b="$DIR/build/enroot-$ENROOT_VERSION"
    rm -rf "$b" && tar -C "$DIR/build" -xzf "$src"
    # The archive has no git submodules: makeself from Debian, the system's kernel headers.
    mkdir -p "$b/deps/makeself"
    cp /usr/bin/makeself "$b/deps/makeself/makeself.sh"
    cp /usr/share/makeself/makeself-header.sh "$b/deps/makeself/"
    printf 'install:\n\tmkdir -p $(prefix)/include\n' >"$b/deps/linux-headers/Makefile"
    # glibc 2.36 has no strlcpy/strlcat: libbsd's.
    (cd "$b" && CPPFLAGS="-D_GNU_SOURCE -include /usr/include/bsd/string.h" \
        make FORCE_GLIBC=1 prefix=/usr/local \
        LDLIBS="-l:libbsd.a /usr/lib/x86_64-linux-gnu/libbsd.so" install) \
        >"$DIR/log/build-enroot.log" 2>&1 \
        || { tail -n 20 "$DIR/log/build-enroot.log" >&2; die "enroot build failed (log: $DIR/log/build-enroot.log)"; }
fi

PYXIS_SO=/usr/local/lib/slurm/spank_pyxis.so
slurm_release=$(dpkg-query -W -f='${Version}' libslurm-dev)
pyxis_stamp="pyxis $PYXIS_VERSION against libslurm-dev $slurm_release"
if [ ! -f "$PYXIS_SO" ] || [ "$(cat "$DIR/build/.pyxis-stamp" 2>/dev/null)" != "$pyxis_stamp" ]; then
    src=$(archive pyxis "$PYXIS_VERSION")
    log "building pyxis $PYXIS_VERSION against Debian's libslurm-dev $slurm_release"
    b="$DIR/build/pyxis-$PYXIS_VERSION"
    rm -rf "$b" && tar -C "$DIR/build" -xzf "$src"
    # pyxis must be built against the Slurm release that loads it (spank.h's version).
    (cd "$b" && make && make install) >"$DIR/log/build-pyxis.log" 2>&1 \
        || { tail -n 20 "$DIR/log/build-pyxis.log" >&2; die "pyxis build failed (log: $DIR/log/build-pyxis.log)"; }
    echo "$pyxis_stamp" >"$DIR/build/.pyxis-stamp"
fi

# enroot's site configuration. Every dev-cluster node is this host, so each node's
# containers, layer cache and runtime state go to its own folder (enroot expands the value
# with the environment pyxis gives it). The key is SLURM_TOPOLOGY_ADDR (the node's name
# under topology/none), which slurmstepd puts in every step's environment on each node:
# pyxis lists the containers (`enroot list`) with the environment srun sent, where
# SLURMD_NODENAME is the batch node's under sbatch and unset under salloc, and creates them
# with the task's, where it is the node's; keyed on it, a salloc's second step on a node
# looked in host/ and created again what existed ("File already exists"). SLURMD_NODENAME
# stays the fallback for the prolog and epilog (docs/containers.md). The registry
# is plain HTTP on loopback. Containers (unpacked per node per job) and runtime state go to
# tmpfs, as on many sites (node-local, gone at reboot): four nodes unpacking the image at once
# take 0.6 s there and 7-9 s on this host's disk. The layer cache stays on disk.
node_key='${SLURM_TOPOLOGY_ADDR:-${SLURMD_NODENAME:-host}}'
enroot_conf=$(cat <<EOF
# Generated by slurm/devcluster/containers.sh; edits are overwritten.
ENROOT_RUNTIME_PATH $SHM/$node_key/run
ENROOT_CACHE_PATH $DIR/enroot/$node_key/cache
ENROOT_DATA_PATH $SHM/$node_key/data
ENROOT_ALLOW_HTTP yes
EOF
)
conf_file=/usr/local/etc/enroot/enroot.conf.d/pd-devcluster.conf
mkdir -p "$(dirname "$conf_file")"
[ "$(cat "$conf_file" 2>/dev/null)" = "$enroot_conf" ] || printf '%s\n' "$enroot_conf" >"$conf_file"

# Named containers live as long as their job (the pyxis default, global, keeps them on the
# node across jobs; sites choose). The dev cluster takes the strict case: every job imports.
plug="required $PYXIS_SO container_scope=job"
loaded=1
[ "$(cat "$DIR/etc/plugstack.conf" 2>/dev/null)" = "$plug" ] || { printf '%s\n' "$plug" >"$DIR/etc/plugstack.conf"; loaded=0; }
export SLURM_CONF="$DIR/etc/slurm.conf"
# pyxis makes its runtime folder (/run/pyxis, a tmpfs) when slurmd starts: a slurmd started
# before pyxis was loaded, or a host rebooted since, fails every container step with
# "Plugin initialization failed". Restarting the slurmds (up.sh starts any that are down)
# is how a site loads a SPANK plugin.
if [ "$loaded" = 0 ] || [ ! -d /run/pyxis ]; then
    log "restarting the slurmds so that pyxis initialises on each"
    for f in "$DIR"/run/slurmd.*.pid; do
        [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
    done
    for _ in $(seq 100); do pgrep -x slurmd >/dev/null || break; sleep 0.1; done
    bash "$HERE/up.sh" >&2
    [ -d /run/pyxis ] || die "pyxis did not create /run/pyxis when slurmd started (see $DIR/log/slurmd.*.log)"
fi
srun --help 2>&1 | grep -q -- '--container-image' \
    || die "srun does not list --container-image after loading pyxis ($DIR/etc/plugstack.conf)"

# ---------------------------------------------------------------- the registry
if ! curl -fsS -m 2 "http://$REGISTRY/v2/" >/dev/null 2>&1; then
    mkdir -p "$DIR/registry/data"
    cat >"$DIR/registry/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $DIR/registry/data
  delete:
    enabled: true
http:
  addr: $REGISTRY
EOF
    log "starting the registry on $REGISTRY"
    setsid docker-registry serve "$DIR/registry/config.yml" >>"$DIR/log/registry.log" 2>&1 </dev/null &
    echo $! >"$DIR/run/registry.pid"
    for _ in $(seq 50); do
        curl -fsS -m 1 "http://$REGISTRY/v2/" >/dev/null 2>&1 && break
        sleep 0.2
    done
    curl -fsS -m 2 "http://$REGISTRY/v2/" >/dev/null 2>&1 \
        || { tail -n 20 "$DIR/log/registry.log" >&2; die "the registry did not start on $REGISTRY"; }
fi

# ---------------------------------------------------------------- the engine image
ref="$REGISTRY/$IMAGE_REPO:$IMAGE_TAG"
rootfs="$DIR/images/engine-rootfs.tar"
if [ ! -f "$rootfs" ] || [ "$(cat "$rootfs.stamp" 2>/dev/null)" != "$IMAGE_STAMP" ]; then
    log "making the engine image's root filesystem (mmdebstrap, Debian bookworm)"
    # Every job unpacks the image on every node: merged /usr by mmdebstrap's hook, not by
    # the usrmerge package, which brings perl (50 MB of 147).
    mmdebstrap --variant=essential --include="$IMAGE_PACKAGES" \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='echo pd-devcluster-engine > "$1/etc/pd-image"' \
        bookworm "$rootfs.new.tar" >"$DIR/log/mmdebstrap.log" 2>&1 \
        || { tail -n 20 "$DIR/log/mmdebstrap.log" >&2; die "mmdebstrap failed (log: $DIR/log/mmdebstrap.log)"; }
    rm -rf "$rootfs" && mv -f "$rootfs.new.tar" "$rootfs"  # the format follows the name
    echo "$IMAGE_STAMP" >"$rootfs.stamp"
    rm -f "$DIR/images/engine.ref"
fi
digest() { skopeo inspect --tls-verify=false "docker://$ref" 2>/dev/null | jq -r .Digest; }
dg=$(digest || true)
if [ -z "$dg" ] || [ ! -f "$DIR/images/engine.ref" ] || ! grep -qx "digest $REGISTRY/$IMAGE_REPO@$dg" "$DIR/images/engine.ref"; then
    log "pushing $ref"
    # Docker's v2 manifest: the registry answers enroot's Accept header with it.
    skopeo copy -q --format v2s2 --dest-tls-verify=false "tarball:$rootfs" "docker://$ref" \
        >"$DIR/log/skopeo.log" 2>&1 \
        || { tail -n 20 "$DIR/log/skopeo.log" >&2; die "skopeo could not push $ref"; }
    # the profile's image cache holds the image by its tag: new bytes under it make it stale
    rm -f "$DIR"/images/cache/pd-devcluster-engine-*.sqsh "$DIR"/images/cache/pd-devcluster-engine-*.sqsh.digest
    dg=$(digest)
    printf 'tag %s\ndigest %s\n' "$ref" "$REGISTRY/$IMAGE_REPO@$dg" >"$DIR/images/engine.ref"
fi
log "enroot $(enroot version), pyxis $PYXIS_VERSION in $DIR/etc/plugstack.conf, image $ref ($dg)"
