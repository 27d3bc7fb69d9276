"""The one way to list what a runs directory holds: runs, and studies with their runs.

A run directory has a plan.json, run.json or recipe.yaml; a study directory has a
study.json and its runs one level down. The CLI (`launcher runs`) and the dashboard both
list through `entries`, so they always show the same runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.run.rundir import STUDY, RunDir


@dataclass
class Study:
    path: Path
    doc: dict[str, Any]
    runs: list[RunDir] = field(default_factory=list)
    damaged: str | None = None  # study.json is not what it should be: left out, and why

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def axes(self) -> dict[str, list]:
        axes = self.doc.get("axes")
        return axes if isinstance(axes, dict) else {}

    def values(self, run: RunDir) -> dict[str, Any]:
        """The swept values of one of its runs ({} when study.json does not say)."""
        for r in self.doc.get("runs") or []:
            if isinstance(r, dict) and r.get("run") == run.run_id:
                vals = r.get("values")
                return vals if isinstance(vals, dict) else {}
        return {}


Entry = RunDir | Study


def is_study(path: Path) -> bool:
    return (path / STUDY).is_file()


def _subdirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _study_problem(doc: Any) -> str | None:
    """What is wrong with study.json's shape (prepare writes: study, recipe, axes: {key:
    [values]}, runs: [{run, values: {key: value}}]), or None."""
    if not isinstance(doc, dict):
        return "it is not a JSON object"
    for key in ("study", "recipe"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            return f"{key} is not text"
    axes = doc.get("axes", {})
    if not isinstance(axes, dict) or not all(isinstance(v, list) for v in axes.values()):
        return "axes is not a mapping of keys to lists of values"
    runs = doc.get("runs", [])
    if not isinstance(runs, list) or not all(
        isinstance(r, dict) and isinstance(r.get("run"), str)
        and isinstance(r.get("values", {}), dict) for r in runs
    ):
        return "runs is not a list of {run: name, values: {key: value}}"
    return None


def _study(path: Path) -> Study:
    runs = [RunDir(p) for p in sorted(_subdirs(path)) if RunDir(p).exists()]
    try:
        doc = json.loads((path / STUDY).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Study(path, {}, runs)
    except (OSError, ValueError, RecursionError) as e:
        why = getattr(e, "strerror", None) or f"not valid JSON: {str(e)[:80]}"
        return Study(path, {}, runs, f"{STUDY} is damaged ({why})")
    why = _study_problem(doc)
    # a damaged study.json costs its axes and labels, not the listing of its runs
    return Study(path, {}, runs, f"{STUDY} is damaged ({why})") if why else Study(path, doc, runs)


def entries(runs_dir: Path) -> list[Entry]:
    """Runs and studies directly under `runs_dir`, newest first (run ids start with their
    time). `runs_dir` may itself be one run or one study."""
    runs_dir = Path(runs_dir)
    if is_study(runs_dir):
        return [_study(runs_dir)]
    if RunDir(runs_dir).exists():
        return [RunDir(runs_dir)]
    out: list[Entry] = []
    for p in sorted(_subdirs(runs_dir), key=lambda p: p.name, reverse=True):
        if is_study(p):
            out.append(_study(p))
        elif RunDir(p).exists():
            out.append(RunDir(p))
    return out


def all_runs(runs_dir: Path) -> list[RunDir]:
    """Every run, studies' runs included, newest first."""
    out: list[RunDir] = []
    for e in entries(runs_dir):
        out += e.runs if isinstance(e, Study) else [e]
    return sorted(out, key=lambda r: r.run_id, reverse=True)


ALLOCATION = "allocation.json"


def allocation_record(study: Study) -> dict | None:
    """A one-allocation study's record of its allocation (control/study.py writes it), or
    None before it started (or for a study of one job each)."""
    try:
        doc = json.loads((study.path / ALLOCATION).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def study_of(run: RunDir) -> Study | None:
    parent = run.path.parent
    return _study(parent) if is_study(parent) else None
