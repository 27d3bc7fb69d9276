"""The one way to list what a runs directory holds: runs, and studies with their runs.

A run directory has a plan.json, run.json or recipe.yaml; a study directory has a
study.json and its runs one level down. The CLI (`launcher runs`) and the dashboard both
list through `entries`, so they always show the same runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.run.rundir import STUDY, RunDir, read_json


@dataclass
class Study:
    path: Path
    doc: dict[str, Any]
    runs: list[RunDir] = field(default_factory=list)

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


def _study(path: Path) -> Study:
    doc = read_json(path / STUDY, {})
    runs = [RunDir(p) for p in sorted(_subdirs(path)) if RunDir(p).exists()]
    return Study(path, doc if isinstance(doc, dict) else {}, runs)


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


def study_of(run: RunDir) -> Study | None:
    parent = run.path.parent
    return _study(parent) if is_study(parent) else None
