"""plan.json: what a run starts where. Written by the planner (launcher.control.prepare), read
through `read_plan` by the orchestrator, the telemetry agents, the summary and the dashboard.

`Process` is both what the renderer produces and what readers get back, so the file and
the code cannot drift apart. A plan of another schema version is refused with a sentence.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from launcher.run import engines
from launcher.run.vocab import Kind, Role

SCHEMA_VERSION = 2
CPU_LABEL = engines.CPU_LABEL


def engine_label(engine: str | None, platform: str | None = None) -> str:
    """How a run's engine is named wherever runs are shown."""
    return engines.of(engine, platform).label


class PlanError(Exception):
    """plan.json is missing, torn, of another version or malformed: one sentence."""


def option_value(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in an argv, written either way the planner writes it
    (["--flag", "value"] or ["--flag=value"]); None when absent."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


@dataclass(frozen=True)
class Process:
    """One process of a run: where it runs, its exact argv and env, where it logs."""

    name: str
    kind: Kind
    node: str
    argv: list[str]
    env: dict[str, str]
    log: str  # relative to the run directory
    endpoint: str | None = None
    role: Role | None = None
    gpus: list[int] = field(default_factory=list)
    dp_ranks: list[int] = field(default_factory=list)
    headless: bool = False
    url: str | None = None
    metrics_url: str | None = None
    env_from_host: list[str] = field(default_factory=list)
    container: bool = False  # runs inside the recipe's container image
    result: str | None = None  # the file a client writes, relative to the run directory
    # An engine whose pool sets args_from_concurrency: [{"from_concurrency": c, "argv": [...]}],
    # ascending; before the first sweep point at or above c it is restarted with that argv.
    restarts: list[dict] = field(default_factory=list)

    def argv_at(self, concurrency: int) -> list[str]:
        """The argv this process runs with at a sweep point of this concurrency."""
        argv = self.argv
        for r in self.restarts:
            if int(r["from_concurrency"]) <= concurrency:
                argv = list(r["argv"])
        return argv

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Process:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["kind"] = Kind(d["kind"])
        kw["role"] = Role(d["role"]) if d.get("role") else None
        return cls(**kw)


@dataclass(frozen=True)
class EndpointDoc:
    name: str
    role: Role
    dp_size: int
    tp_size: int
    expert_parallel: bool
    gpus: int
    nodes: list[str]
    url: str
    http_port: int
    dp_rpc_port: int
    nixl_port_base: int
    # every API server of the endpoint (url first): more than one with per_node fronts
    fronts: list[str] = field(default_factory=list)

    @property
    def front_urls(self) -> list[str]:
        return self.fronts or [self.url]

    @property
    def shape(self) -> str:
        """'DEP8', 'DP2xTP2', 'TP4': the shape people talk about."""
        if self.dp_size > 1:
            s = f"{'DEP' if self.expert_parallel else 'DP'}{self.dp_size}"
            return s + (f"xTP{self.tp_size}" if self.tp_size > 1 else "")
        return f"TP{self.tp_size}"


@dataclass(frozen=True)
class NodeDoc:
    name: str
    address: str
    gpus: int


@dataclass(frozen=True)
class PlanDoc:
    run_id: str
    recipe: str
    cluster: str
    engine: str
    mode: str
    model_path: str
    served_name: str
    telemetry_interval_s: float
    nodes: list[NodeDoc]
    endpoints: list[EndpointDoc]
    processes: list[Process]
    router_url: str
    router_metrics_url: str
    gpu_count: dict[str, int]
    placeholder_nodes: bool = False
    capacity: list[dict] = field(default_factory=list)
    runtime: dict[str, Any] = field(default_factory=dict)  # where the launcher runs (plan.Runtime)
    engine_platform: str | None = None  # vllm: "gpu" | "cpu" (recipe's, checked by preflight)
    # the sweep's workload (render.workload_doc): rule, ISL/OSL, range, bounds, chat template
    workload: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # sections added by later stages

    @property
    def engine_kind(self) -> engines.EngineKind:
        return engines.of(self.engine, self.engine_platform)

    @property
    def engine_label(self) -> str:
        return self.engine_kind.label

    def gpus(self, role: str = "total") -> int:
        return int(self.gpu_count.get(role, 0))

    def processes_on(self, node: str) -> list[Process]:
        return [p for p in self.processes if p.node == node]

    def processes_of_kind(self, kind: Kind) -> list[Process]:
        return [p for p in self.processes if p.kind == kind]

    def process(self, name: str) -> Process | None:
        return next((p for p in self.processes if p.name == name), None)

    def topology(self) -> str:
        """'1 decode DEP8 + 4 prefill DEP2 (16 GPUs)'."""
        groups: dict[tuple[Role, str], int] = {}
        for ep in self.endpoints:
            groups[(ep.role, ep.shape)] = groups.get((ep.role, ep.shape), 0) + 1
        order = {Role.DECODE: 0, Role.PREFILL: 1, Role.AGG: 2}
        parts = [
            f"{n} {role} {shape}"
            for (role, shape), n in sorted(groups.items(), key=lambda kv: order[kv[0][0]])
        ]
        total = self.gpus()
        return " + ".join(parts) + (f" ({total} GPUs)" if total else "") if parts else "—"

    def to_json(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "recipe": self.recipe,
            "cluster": self.cluster,
            "engine": self.engine,
            "engine_platform": self.engine_platform,
            "mode": self.mode,
            "model": {"path": self.model_path, "served_name": self.served_name},
            "telemetry": {"interval_s": self.telemetry_interval_s},
            "nodes": [asdict(n) for n in self.nodes],
            "endpoints": [asdict(e) for e in self.endpoints],
            "processes": [p.to_json() for p in self.processes],
            "router": {"url": self.router_url, "metrics_url": self.router_metrics_url},
            "gpu_count": dict(self.gpu_count),
            "placeholder_nodes": self.placeholder_nodes,
            "capacity": list(self.capacity),
            "runtime": dict(self.runtime),
            "workload": dict(self.workload),
            **self.extra,
        }

    @classmethod
    def from_json(cls, d: dict) -> PlanDoc:
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise PlanError(
                f"plan.json has schema_version {version!r}; this launcher reads version "
                f"{SCHEMA_VERSION}: open it with the launcher version that wrote it"
            )
        core = {
            "schema_version", "run_id", "recipe", "cluster", "engine", "mode", "model",
            "telemetry", "nodes", "endpoints", "processes", "router", "gpu_count",
            "placeholder_nodes", "capacity", "runtime", "engine_platform", "workload",
        }  # fmt: skip
        try:
            doc = cls(
                run_id=d["run_id"],
                recipe=d["recipe"],
                cluster=d["cluster"],
                engine=d["engine"],
                mode=d["mode"],
                model_path=d["model"]["path"],
                served_name=d["model"]["served_name"],
                telemetry_interval_s=float(d["telemetry"]["interval_s"]),
                nodes=[NodeDoc(**n) for n in d["nodes"]],
                endpoints=[EndpointDoc(**{**e, "role": Role(e["role"])}) for e in d["endpoints"]],
                processes=[Process.from_json(p) for p in d["processes"]],
                router_url=d["router"]["url"],
                router_metrics_url=d["router"]["metrics_url"],
                gpu_count={k: int(v) for k, v in d["gpu_count"].items()},
                placeholder_nodes=bool(d.get("placeholder_nodes", False)),
                capacity=list(d.get("capacity") or []),
                runtime=dict(d.get("runtime") or {}),
                engine_platform=d.get("engine_platform"),
                workload=dict(d.get("workload") or {}),
                extra={k: v for k, v in d.items() if k not in core},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanError(f"plan.json is malformed ({type(e).__name__}: {e})") from None
        _check_types(doc, "")  # run_id, engine, ...: readers format them as text
        if not all(isinstance(c, dict) for c in doc.capacity):
            raise PlanError("plan.json is malformed (capacity is not a list of objects)")
        for what, items in (("nodes", doc.nodes), ("endpoints", doc.endpoints),
                            ("processes", doc.processes)):
            for i, item in enumerate(items):
                _check_types(item, f"{what}[{i}]")
        for i, p in enumerate(doc.processes):
            if not isinstance(p.restarts, list) or not all(_restart_ok(r) for r in p.restarts):
                raise PlanError(f"plan.json is malformed (processes[{i}].restarts is "
                                f"{p.restarts!r}, not a list of {{from_concurrency: int, "
                                f"argv: [str]}})")
        return doc


def _restart_ok(r: Any) -> bool:
    c, argv = (r.get("from_concurrency"), r.get("argv")) if isinstance(r, dict) else (None, None)
    return (isinstance(c, int) and not isinstance(c, bool) and isinstance(argv, list)
            and all(isinstance(x, str) for x in argv))


# The field types readers rely on: a plan.json with a wrong one is refused with the field's
# name, instead of failing later somewhere far from the file.
_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
    "str | None": (str, type(None)), "int | None": (int, type(None)),
    "list[str]": (list,), "list[int]": (list,), "dict[str, str]": (dict,),
}


def _check_types(obj: Any, where: str) -> None:
    for f in fields(obj):
        want = _TYPES.get(str(f.type))
        if want is None:
            continue
        v = getattr(obj, f.name)
        ok = isinstance(v, want) and not (isinstance(v, bool) and bool not in want)
        if ok and str(f.type) in ("list[int]", "list[str]"):
            inner = int if str(f.type) == "list[int]" else str
            ok = all(isinstance(x, inner) and not isinstance(x, bool) for x in v)
        if not ok:
            raise PlanError(
                f"plan.json is malformed ({where + '.' if where else ''}{f.name} is {v!r}, "
                f"not {f.type})"
            )


def read_plan(path: Path) -> PlanDoc:
    """The plan at `path` (a plan.json or a run directory); PlanError with one sentence."""
    path = Path(path)
    if path.is_dir():
        path = path / "plan.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path} does not exist") from None
    except (OSError, ValueError) as e:
        raise PlanError(f"{path} is unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path} is not a JSON object")
    try:
        return PlanDoc.from_json(data)
    except PlanError as e:
        raise PlanError(f"{path}: {e}") from None
