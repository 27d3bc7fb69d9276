"""A study's own files, typed as the run's are (launcher.run.rundir): study.json, what the
planner made of `submit --sweep` (and, for a study in one allocation, the plan of its turns),
and allocation.json, the record its one allocation keeps (control/study.py).

Each has a reader that returns its record, or None when the file is not there, or raises
`StudyFileError`: one sentence naming the file and the field that is wrong ("S/study.json is
damaged (allocation.turns[1].start is 5, not a list of text)"). Every reader of these files
reads through here (launcher.run.listing.Study holds them), every writer writes through here.

Three parts are kept as the JSON their owners write, their shape checked here:
`StudyAllocation.turns` and `ConfigurationRecord.turn` (launcher.planning.study.Turn:
`TURN_TYPES`), `StudyAllocation.comparison` (planning.study.Comparison, the dry-run's
estimate: `COMPARISON_TYPES`) and `StudyDoc.choice` (planning.study.Choice: `CHOICE_TYPES`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import UserError
from launcher.run.rundir import (
    ALLOCATION,
    STUDY,
    RecordError,
    _shown,
    _typed,
    shape_problem,
    write_json,
)
from launcher.run.vocab import State

# launcher.planning.study.Turn.to_json(): one configuration's turn in the allocation
TURN_TYPES = {"run": "str", "start": "list[str]", "restart": "list[str]", "keep": "list[str]",
              "idle": "list[str]", "stop": "list[str]", "points": "list[int]", "first": "bool",
              "last": "bool", "gate": "list[str]"}  # fmt: skip
TURN_REQUIRED = ("run",)
# launcher.planning.study.Comparison.to_json(): one allocation against one job each, estimated
COMPARISON_TYPES = {
    "one_nodes": "int", "one_s": "float", "one_gpu_s": "float", "one_loads": "int",
    "each_s": "float", "each_gpu_s": "float", "each_loads": "int", "load_s": "float",
    "load_basis": "str", "load_bound_s": "float", "turn_costs": "list[dict]",
    "job_costs": "list[dict]", "cheaper": "str", "one_work_s": "float", "one_most_s": "float",
    "longest_job_s": "float", "longest_job_most_s": "float", "one_rounds": "int",
    "useful_gpu_time": "dict", "site_load_s": "float | None",
}  # fmt: skip
# launcher.planning.study.Choice.to_json(): how the study runs and why
CHOICE_TYPES = {"way": "str", "asked": "str | None", "reason": "str", "changes": "list[str]",
                "time_minutes": "int | None", "recipe_minutes": "int | None",
                "limits": "dict | None"}  # fmt: skip
MODES = ("one",)  # study.json's allocation.mode: the ways that have a plan of their own


class StudyFileError(UserError):
    """study.json or allocation.json cannot be read as its record: one sentence naming the
    study's file and the field (the CLI prints it and exits 2; the listing and the dashboard
    show it with the study)."""

    def __init__(self, path: Path, why: str) -> None:
        self.path, self.why = Path(path), why
        super().__init__(f"{self.path.absolute().parent.name}/{self.path.name} {why}")


def _check(d: Any, spec: dict[str, str], where: str, required: tuple[str, ...] = ()) -> dict:
    """`d` as it is, when it is an object of `spec` with its `required` keys; RecordError
    naming the field otherwise. For the parts whose shape another module owns."""
    why = shape_problem(d, spec, where)
    if why:
        raise RecordError(why)
    missing = next((k for k in required if k not in d), None)
    if missing:
        raise RecordError(f"{where}{missing} is missing")
    return d


def _run_name(name: str, where: str) -> str:
    """A configuration's run id: the name of a directory in the study's folder."""
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\0" in name:
        raise RecordError(f"{where} is {_shown(name)}, not the name of a run directory")
    return name


def _omit(d: dict, *keys: str) -> dict:
    """`d` without those of `keys` that hold nothing (null, [] or {}): absent, as before."""
    return {k: v for k, v in d.items() if not (k in keys and v in (None, [], {}))}


# --- study.json ----------------------------------------------------------------------------


@dataclass(kw_only=True)
class StudyRun:
    """One configuration of the study: its run directory and its swept values."""

    run: str  # its run id: a directory in the study's folder
    values: dict[str, Any] = field(default_factory=dict)  # swept key -> its value here


@dataclass(kw_only=True)
class StudyAllocation:
    """study.json's `allocation`: a study planned to run in one allocation (prepare)."""

    mode: str  # "one"
    nodes: int  # the allocation's: the largest configuration's
    gpus_per_node: int | None = None
    time_minutes: int | None = None  # its time limit, where there is a scheduler
    port_span: int = 0  # the largest configuration's: every one plans the same ports
    turns: list[dict[str, Any]]  # planning.study.Turn.to_json() each, in the allocation's order
    comparison: dict[str, Any] = field(default_factory=dict)  # planning.study.Comparison's

    @classmethod
    def from_json(cls, d: Any, where: str = "allocation.") -> StudyAllocation:
        turns = d.get("turns") if isinstance(d, dict) else None
        for i, t in enumerate(turns if isinstance(turns, list) else []):  # each by its place
            _check(t, TURN_TYPES, f"{where}turns[{i}].", TURN_REQUIRED)
            _run_name(t["run"], f"{where}turns[{i}].run")
        kw = _typed(cls, d, where)
        if kw["mode"] not in MODES:
            raise RecordError(f"{where}mode is {_shown(kw['mode'])}, not "
                              + " or ".join(json.dumps(m) for m in MODES))
        _check(kw.get("comparison", {}), COMPARISON_TYPES, f"{where}comparison.")
        return cls(**kw)

    def estimated_gpu_hours(self) -> tuple[float, float] | None:
        """(in one allocation, as one job each): the dry-run's estimate, or None."""
        one, each = self.comparison.get("one_gpu_s"), self.comparison.get("each_gpu_s")
        return (one / 3600, each / 3600) if one and each else None

    def estimated_useful(self) -> dict[str, float]:
        """The dry-run's useful GPU time in one allocation: at the health timeout and, where
        the profile gives one, at its load_time_s (empty where it has none)."""
        u = self.comparison.get("useful_gpu_time")
        return {k: float(v) for k, v in u.items() if type(v) in (int, float)} \
            if isinstance(u, dict) else {}

    def estimated_each_loads(self) -> int | None:
        """Engine starts as one job each, as the dry-run counted them, or None."""
        return self.comparison.get("each_loads") or None


@dataclass(kw_only=True)
class StudyDoc:
    """study.json: written once by the planner (control/prepare.py) at submit time."""

    study: str | None = None  # its folder's name
    recipe: str | None = None  # the recipe's name
    axes: dict[str, list[Any]]  # swept key -> its values, in the order given
    runs: list[StudyRun]  # one per configuration, in the order of the values
    choice: dict[str, Any] | None = None  # planning.study.Choice.to_json(): the way, and why
    allocation: StudyAllocation | None = None  # a study planned for one allocation

    @classmethod
    def empty(cls) -> StudyDoc:
        """What a study whose study.json is missing or damaged is read as."""
        return cls(axes={}, runs=[])

    @classmethod
    def from_json(cls, d: Any) -> StudyDoc:
        """study.json's content; RecordError naming the field that is wrong."""
        kw = _typed(cls, d)
        kw["runs"] = [StudyRun(**_typed(StudyRun, r, f"runs[{i}]."))
                      for i, r in enumerate(kw["runs"])]
        for i, r in enumerate(kw["runs"]):
            _run_name(r.run, f"runs[{i}].run")
        if kw.get("choice") is not None:
            _check(kw["choice"], CHOICE_TYPES, "choice.")
        if kw.get("allocation") is not None:
            alloc = kw["allocation"] = StudyAllocation.from_json(kw["allocation"])
            names = {r.run for r in kw["runs"]}
            for i, t in enumerate(alloc.turns):
                if t["run"] not in names:
                    raise RecordError(f"allocation.turns[{i}].run is {_shown(t['run'])}, "
                                      "not one of its runs")
        return cls(**kw)

    def to_json(self) -> dict:
        return _omit(asdict(self), "choice", "allocation")

    def values(self, run_id: str) -> dict[str, Any]:
        """The swept values of one of its runs ({} when it names none such)."""
        return next((dict(r.values) for r in self.runs if r.run == run_id), {})

    def order(self) -> dict[str, int]:
        """run id -> its place among the configurations."""
        return {r.run: i for i, r in enumerate(self.runs)}


# --- allocation.json -------------------------------------------------------------------------


@dataclass(kw_only=True)
class ConfigurationRecord:
    """allocation.json's `configurations`: one visit of a configuration as it went (a
    configuration whose points need other engine settings is visited once per setting)."""

    run: str  # its run id
    turn: dict[str, Any]  # its turn as planned (study.json's allocation.turns)
    state: State | None = None  # its run's state after this visit; None while it runs
    seconds: float | None = None  # its turn's wall time
    error: str | None = None
    phases_s: dict[str, float] = field(default_factory=dict)  # its lifecycle, per phase
    nodes: list[str] = field(default_factory=list)  # the nodes it ran on (its plan.json)


@dataclass(kw_only=True)
class EngineEvent:
    """allocation.json's `engines`: one engine start or stop (the study's engine pool)."""

    event: str  # "started" | "stopped"
    endpoint: str
    run: str  # the configuration it happened in
    ts: float | None = None
    processes: list[str] = field(default_factory=list)  # started: its processes
    why: str | None = None  # stopped: why

    @classmethod
    def of(cls, d: dict) -> EngineEvent:
        """One of the pool's records (control.pool.EnginePool.events), its known keys."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@dataclass(kw_only=True)
class LostNode:
    """allocation.json's `lost_nodes`: a node lost while the study ran."""

    node: str
    why: str
    run: str  # the configuration it was lost in, or "between configurations"
    ts: float
    released: bool  # Slurm took it out of the job, so the study went on without it
    error: str | None = None  # why Slurm would not


@dataclass(kw_only=True)
class AllocationSummary:
    """allocation.json's `summary`, written at its end (control.study.allocation_summary)."""

    wall_s: float
    gpus: int
    gpu_hours: float
    engine_starts: int
    succeeded: int  # configurations that succeeded
    loading_s: float
    measuring_s: float
    # the sweep points' client runs (warm-up and measured requests), added up, and that
    # time x the allocation's GPUs over its GPU-seconds: its useful GPU time, measured
    measured_windows_s: float | None = None
    useful_gpu_time: float | None = None


@dataclass(kw_only=True)
class AllocationRecord:
    """allocation.json: a study's one allocation, written by its orchestrator only
    (control/study.py), replaced whole on every change."""

    state: State  # running until its end
    started: float
    ended: float | None = None
    host: str | None = None  # where the study's process runs
    pid: int | None = None  # its pid there
    slurm_job_id: str | None = None  # None: no scheduler (the local profile)
    nodes: int | None = None
    gpus_per_node: int | None = None
    configurations: list[ConfigurationRecord] = field(default_factory=list)  # begun, in turn
    engines: list[EngineEvent] = field(default_factory=list)  # every start and stop, in order
    lost_nodes: list[LostNode] = field(default_factory=list)
    summary: AllocationSummary | None = None  # at its end

    @classmethod
    def from_json(cls, d: Any) -> AllocationRecord:
        """allocation.json's content; RecordError naming the field that is wrong."""
        kw = _typed(cls, d)
        kw["state"] = State(kw["state"])
        confs = []
        for i, c in enumerate(kw.get("configurations", [])):
            where = f"configurations[{i}]."
            ck = _typed(ConfigurationRecord, c, where)
            _run_name(ck["run"], f"{where}run")
            _check(ck["turn"], TURN_TYPES, f"{where}turn.", TURN_REQUIRED)
            if ck.get("state") is not None:
                ck["state"] = State(ck["state"])
            confs.append(ConfigurationRecord(**ck))
        kw["configurations"] = confs
        kw["engines"] = [EngineEvent(**_typed(EngineEvent, e, f"engines[{i}]."))
                         for i, e in enumerate(kw.get("engines", []))]
        kw["lost_nodes"] = [LostNode(**_typed(LostNode, r, f"lost_nodes[{i}]."))
                            for i, r in enumerate(kw.get("lost_nodes", []))]
        if kw.get("summary") is not None:
            kw["summary"] = AllocationSummary(**_typed(AllocationSummary, kw["summary"],
                                                       "summary."))
        return cls(**kw)

    def to_json(self) -> dict:
        d = asdict(self)
        d["configurations"] = [_omit(c, "state", "seconds", "error", "phases_s", "nodes")
                               for c in d["configurations"]]
        d["engines"] = [_omit(e, "processes", "why") for e in d["engines"]]
        d["lost_nodes"] = [_omit(r, "error") for r in d["lost_nodes"]]
        return _omit(d, "lost_nodes", "summary")

    @property
    def running(self) -> bool:
        return self.state == State.RUNNING


# --- reading and writing ---------------------------------------------------------------------


def _read(path: Path, parse) -> Any:
    """parse(the JSON at `path`); None when the file is not there; StudyFileError when it is
    unreadable, empty, not JSON or not of its record's shape."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StudyFileError(path, f"cannot be read ({getattr(e, 'strerror', None) or e})"
                             ) from None
    if not text.strip():
        raise StudyFileError(path, "is damaged (it is empty)")
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise StudyFileError(path, f"is damaged (not valid JSON: {str(e)[:80]})") from None
    try:
        return parse(d)
    except RecordError as e:
        raise StudyFileError(path, f"is damaged ({e})") from None


def read_study(study_dir: Path) -> StudyDoc | None:
    """The study's study.json; None when it has none; StudyFileError when it is damaged."""
    return _read(Path(study_dir) / STUDY, StudyDoc.from_json)


def write_study(study_dir: Path, doc: StudyDoc) -> None:
    write_json(Path(study_dir) / STUDY, doc.to_json())


def read_allocation(study_dir: Path) -> AllocationRecord | None:
    """The study's allocation.json; None before its allocation started (or for a study of
    one job each); StudyFileError when it is damaged."""
    return _read(Path(study_dir) / ALLOCATION, AllocationRecord.from_json)


def write_allocation(study_dir: Path, rec: AllocationRecord) -> None:
    write_json(Path(study_dir) / ALLOCATION, rec.to_json())
