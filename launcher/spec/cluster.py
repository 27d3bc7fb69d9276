"""Cluster profiles: the facts about a site that a recipe should not have to repeat."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from launcher.errors import UserError
from launcher.spec.recipe import Strict, format_error, yaml_module

CLUSTERS_DIR = Path(__file__).parents[1] / "clusters"


class Cluster(Strict):
    name: str
    scheduler: Literal["slurm", "local"]
    arch: str = "any"
    gpus_per_node: int = Field(ge=1)
    gpu_memory_gib: float = Field(gt=0)
    nodes_per_rack: int = Field(default=18, ge=1)
    gpu_directive: Literal["gpus-per-node", "gres"] = "gpus-per-node"
    gres_type: str | None = Field(default=None, description="e.g. gb200 for --gres=gpu:gb200:4")
    exclusive: bool = True
    mem_zero: bool = False
    segment: bool = False
    container: Literal["pyxis", "none"] = "none"
    bind_host: str = "0.0.0.0"
    port_base: int = Field(ge=1024, le=60000)
    dry_run_nodes: str = Field(description="Slurm-style node list used by --dry-run")
    env: dict[str, str] = Field(default_factory=dict, description="env for every engine process")


def available() -> dict[str, Path]:
    return {p.stem: p for p in sorted(CLUSTERS_DIR.glob("*.yaml"))}


def load(ref: str) -> Cluster:
    path = Path(ref)
    if not path.is_file():
        found = available()
        if ref not in found:
            raise UserError(
                f"no cluster profile {ref!r}: give a YAML path or one of: {', '.join(found)}"
            )
        path = found[ref]
    data = yaml_module().safe_load(path.read_text(encoding="utf-8"))
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        raise UserError(format_error(e, str(path))) from None


def profile_nodes(cluster: Cluster, count: int) -> list[str]:
    """Node names for a plan made outside an allocation: the profile's list, extended."""
    names = expand_nodelist(cluster.dry_run_nodes)
    return names + [f"node-{i:03d}" for i in range(len(names) + 1, count + 1)]


_GROUP = re.compile(r"^(?P<prefix>[^\[\],]*)\[(?P<ranges>[^\]]+)\](?P<suffix>[^\[\],]*)$")


def expand_nodelist(text: str) -> list[str]:
    """`gb200-[01-03,07],login1` -> names, keeping zero padding (one bracket group per name)."""
    if text.count("[") != text.count("]"):
        raise UserError(f"cannot read node list {text!r}: unbalanced brackets")
    names: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)?", text.strip()):
        item = item.strip()
        if not item:
            continue
        m = _GROUP.match(item)
        if not m:
            if "[" in item or "]" in item:
                raise UserError(f"cannot read node list {text!r} near {item!r}")
            names.append(item)
            continue
        for part in m["ranges"].split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise UserError(f"cannot read node list {text!r} near {part!r}")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{m['prefix']}{i:0{width}d}{m['suffix']}")
    return names
