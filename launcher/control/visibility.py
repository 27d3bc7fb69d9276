"""What the compute nodes and the containers will not see, said at dry-run.

Two mistakes that cost a first real job its first minutes: a runs directory on the login
node's own disk (the trays write their environment, the batch output and every result
there), and input files outside every container mount. Both are warnings: the facts are
this host's, and the preflight checks the nodes themselves.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.planning.plan import Plan

# Filesystems that live on one host; anything else (nfs, lustre, gpfs, beegfs, cephfs,
# weka, fuse.*, ...) may be shared.
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "f2fs",
                      "ramfs", "vfat", "squashfs"})


def filesystem(path: Path, mounts: str | None = None) -> tuple[str, str] | None:
    """(mount point, filesystem type) holding `path`, from /proc/mounts; None if unknown."""
    try:
        text = mounts if mounts is not None else Path("/proc/mounts").read_text()
    except OSError:
        return None
    path = Path(os.path.abspath(path))
    best: tuple[str, str] | None = None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        if (path == Path(point) or Path(point) in path.parents) and (
                best is None or len(point) >= len(best[0])):
            best = (point, parts[2])
    return best


def runs_dir_warning(plan: Plan, runs_root: Path, mounts: str | None = None) -> str | None:
    """A Slurm profile whose nodes are other hosts, and a runs directory on a local disk."""
    c = plan.cluster
    from launcher.planning import schedulers

    if not schedulers.of(c).remote_nodes(c):
        return None
    fs = filesystem(runs_root, mounts)
    if fs is None or fs[1] not in LOCAL_FS:
        return None
    return (f"--runs-dir {runs_root} is on this host's local {fs[1]} ({fs[0]}): the compute "
            f"nodes of {c.name} cannot see it, so the batch output, the nodes' environment "
            "and every result would stay on their own disks; use a folder on the shared "
            f"filesystem (or set {RUNS_ENV} to one)")


RUNS_ENV = "PD_RUNS_DIR"


def default_runs_dir() -> Path:
    """--runs-dir when none is given: $PD_RUNS_DIR, else ./runs."""
    return Path(os.environ.get(RUNS_ENV) or "runs")


def input_warnings(plan: Plan) -> list[str]:
    """Accuracy inputs that are neither copied into the run directory (readable here) nor
    under a container mount: the gate's client would not find them."""
    r = plan.recipe
    from launcher.planning import containers

    if r.container is None or not r.accuracy.enabled or not containers.of(plan.cluster).isolated:
        return []

    dests = [Path(dst) for _, dst, _ in containers.mounts(plan)]
    out = []
    for key in ("data", "train"):
        path = getattr(r.accuracy, key)
        if not path or str(path).startswith(plan.run_dir):
            continue  # copied into the run directory, which every container mounts
        p = Path(path)
        if any(p == d or d in p.parents for d in dests):
            continue
        out.append(f"accuracy.{key} {path} is not readable here and is under none of the "
                   f"container mounts ({', '.join(map(str, dests))}): add its folder to the "
                   "profile's containers.mounts or the recipe's container.mounts, or put the "
                   "file where this host can read it (it is then copied into the run)")
    return out
