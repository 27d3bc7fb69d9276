"""A study's answer under its SLO: each configuration's frontier (every point it measured,
passing or failing, and why) and the best configuration by tokens/s per GPU at its largest
passing load, in one sentence (docs/slo.md).

Read from the run directories alone (each point's result file, the accuracy gate's result,
run.json), so a study in one allocation, one of a job each, and one still running are read
the same way; the study writes what it found to slo.json at its end (launcher.control.study),
and the report, the Study page and `recommend` read it from here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.run import slo
from launcher.run.rundir import RunDir

SLO_FILE = "slo.json"  # in the study's folder: the answer as the study found it


@dataclass(frozen=True)
class Point:
    concurrency: int
    passed: bool
    why: str  # "meets every limit", the limits over, or the failure
    values_ms: dict[str, float | None]
    failure: str | None  # other than latency
    per_gpu: float | None  # total tok/s per working GPU
    per_allocated_gpu: float | None


@dataclass
class Frontier:
    """One configuration against the limits."""

    label: str
    run: str
    points: list[Point] = field(default_factory=list)
    passing: int | None = None  # the largest passing concurrency below the first failing
    failing: int | None = None
    excluded: str | None = None  # why it cannot be named (its run failed, its gate failed)
    outcome: str = ""
    live: bool = False  # its run has not ended: its frontier may still move

    @property
    def best(self) -> Point | None:
        return next((p for p in self.points if p.concurrency == self.passing and p.passed),
                    None) if self.excluded is None else None


@dataclass
class Answer:
    limits: str
    precision: float
    frontiers: list[Frontier]
    best: str | None  # the label of the best configuration
    sentence: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Answer:
        fronts = [Frontier(**{**f, "points": [Point(**p) for p in f.get("points", [])]})
                  for f in d.get("frontiers", [])]
        return cls(limits=d["limits"], precision=d["precision"], frontiers=fronts,
                   best=d.get("best"), sentence=d["sentence"])


def run_slo(path: Path) -> dict | None:
    """The run's benchmark.slo as its recipe.yaml writes it ({limits, precision,
    max_concurrency}), or None."""
    import yaml

    try:
        doc = yaml.safe_load((Path(path) / "recipe.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    b = doc.get("benchmark") if isinstance(doc, dict) else None
    s = b.get("slo") if isinstance(b, dict) else None
    if isinstance(s, str):
        s = {"limits": s}
    return s if isinstance(s, dict) and isinstance(s.get("limits"), str) else None


def _gate_failure(path: Path) -> str | None:
    from launcher.run.figures import load_accuracy

    acc = load_accuracy(path)
    if not isinstance(acc, dict) or acc.get("passed") is not False:
        return None
    score = acc.get("accuracy")
    return ("the accuracy gate failed"
            + (f" ({score:.3f} below {acc.get('threshold')})"
               if isinstance(score, (int, float)) and acc.get("threshold") is not None else ""))


def frontier(label: str, path: Path, limits: list[slo.Limit], precision: float,
             top: int | None = None) -> Frontier:
    """Every point of one configuration judged against `limits`; its bracket, and why it
    cannot be named (its run failed or was cancelled, its accuracy gate failed)."""
    from launcher.run.figures import allocated_gpus, gpu_denominators, point_figures
    from launcher.run.plandoc import PlanError, read_plan
    from launcher.run.results import load_results

    rd = RunDir(Path(path))
    f = Frontier(label=label, run=rd.run_id)
    try:
        plan = read_plan(rd.plan)
    except PlanError:
        plan = None
    den, alloc = gpu_denominators(plan), allocated_gpus(plan) if plan else None
    gate = _gate_failure(rd.path)
    for res in load_results(rd.path):
        v = slo.judge(res, limits, gate)
        fig = point_figures(res, den, plan.mode if plan else "disagg", alloc)
        f.points.append(Point(v.concurrency, v.passed, v.why, v.values, v.failure,
                              fig.get("total_tokens_per_s_per_gpu"),
                              fig.get("total_tokens_per_s_per_allocated_gpu")))
    f.points.sort(key=lambda p: p.concurrency)
    tried = {p.concurrency: p.passed for p in f.points}
    b = slo.bracket(tried)
    f.passing, f.failing = b.passing, b.failing
    status = rd.status()
    state = str(status.state) if status.state is not None else None
    f.live = status.state is not None and not status.state.final
    if gate:
        f.excluded = gate
    elif state in ("failed", "cancelled"):
        f.excluded = f"its run {state}: {(status.error or 'no reason recorded').splitlines()[0]}"
    f.outcome = (slo.outcome(tried, top or max(tried, default=0), precision) if tried
                 else "not measured")
    return f


def _tok(x: float | None) -> str:
    return "?" if x is None or not math.isfinite(x) else f"{x:,.0f}"


def _excess(p: Point, limits: list[slo.Limit]) -> float:
    """How far a point is from meeting the limits: its worst measured / limit (inf where a
    value is missing or it failed otherwise)."""
    if p.failure:
        return math.inf
    ratios = [p.values_ms.get(lim.name) for lim in limits]
    if any(r is None for r in ratios):
        return math.inf
    return max(r / lim.value_ms for r, lim in zip(ratios, limits, strict=True))


def answer(configs: list[tuple[str, Path]]) -> Answer | None:
    """The study's answer (None when no configuration has an SLO): the configuration with
    the most total tok/s per working GPU at its largest passing concurrency, its figure per
    allocated GPU beside it; a limit nothing meets names the closest point."""
    spec = next((s for _, p in configs if (s := run_slo(p)) is not None), None)
    if spec is None:
        return None
    try:
        limits = slo.parse(spec["limits"])
    except ValueError:
        return None
    precision = spec.get("precision")
    precision = float(precision) if isinstance(precision, (int, float)) else slo.DEFAULT_PRECISION
    top = spec.get("max_concurrency") if isinstance(spec.get("max_concurrency"), int) else None
    fronts = [frontier(label, p, limits, precision, top) for label, p in configs]
    ans = _answer(fronts, limits, precision)
    live = sum(f.live for f in fronts)
    if live:
        ans.sentence = ans.sentence[:-1] + (f" (so far: {live} configuration(s) still "
                                            "running).")
    return ans


def _answer(fronts: list[Frontier], limits: list[slo.Limit], precision: float) -> Answer:
    said = slo.text_of(limits)
    ranked = sorted((f for f in fronts if f.best is not None and f.best.per_gpu is not None),
                    key=lambda f: -f.best.per_gpu)
    if ranked:
        b = ranked[0]
        sentence = (f"Best under {said}: {b.label} at concurrency {b.passing}"
                    + (f" ({b.failing} fails)" if b.failing is not None else "")
                    + f", {_tok(b.best.per_gpu)} tok/s per working GPU "
                    f"({_tok(b.best.per_allocated_gpu)} per allocated GPU)")
        if len(ranked) > 1:
            n = ranked[1]
            sentence += (f"; next {n.label} at {n.passing}, {_tok(n.best.per_gpu)} "
                         f"({_tok(n.best.per_allocated_gpu)})")
        by_alloc = max(ranked, key=lambda f: f.best.per_allocated_gpu or 0)
        if by_alloc is not b and (by_alloc.best.per_allocated_gpu or 0) > (
                b.best.per_allocated_gpu or 0):
            sentence += (f"; per allocated GPU {by_alloc.label} leads "
                         f"({_tok(by_alloc.best.per_allocated_gpu)})")
        return Answer(said, precision, fronts, b.label, sentence + ".")
    points = [(f, p) for f in fronts for p in f.points]
    if not points:
        return Answer(said, precision, fronts, None,
                      f"No configuration has a measured point under {said} yet.")
    f, p = min(points, key=lambda fp: (_excess(fp[1], limits), fp[1].concurrency))
    if p.passed:  # it passed, but its configuration cannot be named
        why = f"{f.label}'s {f.excluded}" if f.excluded else "no throughput was measured"
        return Answer(said, precision, fronts, None,
                      f"No configuration can be named under {said}: the closest point, "
                      f"{f.label} at concurrency {p.concurrency}, meets them but {why}.")
    return Answer(said, precision, fronts, None,
                  f"No configuration meets {said}: the closest point is {f.label} at "
                  f"concurrency {p.concurrency} ({p.why}).")


def write(study_dir: Path, ans: Answer) -> None:
    from launcher.run.rundir import write_json

    write_json(Path(study_dir) / SLO_FILE, ans.to_json())


def read(study_dir: Path) -> dict[str, Any] | None:
    from launcher.run.rundir import read_json

    doc = read_json(Path(study_dir) / SLO_FILE)
    return doc if isinstance(doc, dict) else None
