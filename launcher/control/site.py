"""The site's limits, asked of the Slurm this host reaches (`scontrol show partition`), for
what the launcher decides before anything is submitted: a study's one allocation is taken
only where the partition admits its time limit and node count.

No Slurm here (no scontrol, a controller that does not answer, a partition it does not know):
None, and the caller says the limits were not asked; `submit --check` asks the scheduler.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

ASK_TIMEOUT_S = 5.0  # a controller that does not answer must not hold up a dry-run
UNLIMITED = ("UNLIMITED", "INFINITE", "NONE")


@dataclass(frozen=True)
class Partition:
    name: str
    max_minutes: int | None  # None: no limit
    max_nodes: int | None
    max_time: str  # as Slurm writes it

    def to_json(self) -> dict:
        return {"partition": self.name, "max_minutes": self.max_minutes,
                "max_nodes": self.max_nodes, "max_time": self.max_time,
                "source": "scontrol show partition"}


def slurm_minutes(text: str | None) -> int | None:
    """Slurm's time (minutes, minutes:seconds, hours:minutes:seconds, days-hours,
    days-hours:minutes, days-hours:minutes:seconds) in whole minutes; None for no limit or
    a value it does not write."""
    if not text or text.upper() in UNLIMITED:
        return None
    days, _, rest = text.rpartition("-")
    try:
        d = int(days) if days else 0
        parts = [int(p) for p in rest.split(":")]
    except ValueError:
        return None
    if len(parts) > 3:
        return None
    if days:  # days-hours[:minutes[:seconds]]
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, s = parts
    else:  # minutes[:seconds]
        h, (m, s) = 0, (parts + [0])[:2]
    return d * 1440 + h * 60 + m + (1 if s else 0)


def _count(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def partition(name: str | None) -> Partition | None:
    """The partition a job goes to (`name`, else the default one) as this host's Slurm
    has it, or None when it cannot be asked."""
    if shutil.which("scontrol") is None:
        return None
    argv = ["scontrol", "-o", "show", "partition", *([name] if name else [])]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=ASK_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    for line in proc.stdout.splitlines():
        f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if (f.get("PartitionName") == name) if name else (f.get("Default") == "YES"):
            return Partition(f["PartitionName"], slurm_minutes(f.get("MaxTime")),
                             _count(f.get("MaxNodes")), f.get("MaxTime") or "?")
    return None
