"""The one way to list what a runs directory holds: runs, and studies with their runs.

A run directory has a plan.json, run.json or recipe.yaml; a study directory has a
study.json and its runs one level down. The CLI (`launcher runs`) and the dashboard both
list through `entries`, so they always show the same runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.run.rundir import ALLOCATION, STUDY, RunDir
from launcher.run.studydoc import (
    AllocationRecord,
    StudyAllocation,
    StudyDoc,
    StudyFileError,
    read_allocation,
    read_study,
)


@dataclass
class Study:
    path: Path
    doc: StudyDoc = field(default_factory=StudyDoc.empty)  # study.json (empty: damaged)
    runs: list[RunDir] = field(default_factory=list)
    # study.json is damaged: its sentence (its axes, labels and plan are left out, not its runs)
    damaged: str | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def axes(self) -> dict[str, list]:
        return self.doc.axes

    def values(self, run: RunDir) -> dict[str, Any]:
        """The swept values of one of its runs ({} when study.json does not say)."""
        return self.doc.values(run.run_id)

    def configurations(self) -> list[tuple[str, Path]]:
        """(label, run path) per configuration, in study.json's order (then by name); the
        label is its swept values ('prefill.endpoints=4'), else its run id."""
        order = self.doc.order()
        runs = sorted(self.runs, key=lambda r: (order.get(r.run_id, len(order)), r.run_id))
        labels: list[tuple[str, Path]] = []
        seen: set[str] = set()
        for r in runs:
            lab = config_label(self.values(r), r.run_id)
            if lab in seen:  # two runs of one configuration: keep them apart
                lab = f"{lab} ({r.run_id})"
            seen.add(lab)
            labels.append((lab, r.path))
        return labels

    @property
    def planned(self) -> StudyAllocation | None:
        """study.json's plan for one allocation, or None (one job each, or damaged)."""
        return self.doc.allocation

    @property
    def in_one_allocation(self) -> bool:
        """Planned for one allocation, or holding the record of one (study.json damaged)."""
        return self.planned is not None or (self.path / ALLOCATION).is_file()

    def allocation(self) -> AllocationRecord | None:
        """Its allocation.json as it is now (it changes while the allocation runs); None
        before it started or for a study of one job each; StudyFileError when damaged."""
        return read_allocation(self.path)

    def allocation_or_why(self) -> tuple[AllocationRecord | None, str | None]:
        """(allocation.json's record, None), or (None, the sentence) when it is damaged."""
        try:
            return self.allocation(), None
        except StudyFileError as e:
            return None, str(e)

    def problems(self) -> list[str]:
        """Its damaged files, one sentence each (study.json's, then allocation.json's)."""
        return [w for w in (self.damaged, self.allocation_or_why()[1]) if w]


def config_label(values: dict[str, Any], fallback: str) -> str:
    """'prefill.endpoints=4' (the swept values of one configuration), or `fallback`."""
    if not values:
        return fallback
    return ", ".join(f"{k}={v}" for k, v in values.items())


Entry = RunDir | Study


def is_study(path: Path) -> bool:
    return (path / STUDY).is_file()


def _subdirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def study_at(path: Path) -> Study:
    """The study in folder `path`, its runs and study.json (damaged: its sentence)."""
    return _study(Path(path))


def _study(path: Path) -> Study:
    runs = [RunDir(p) for p in sorted(_subdirs(path)) if RunDir(p).exists()]
    try:
        doc = read_study(path)
    except StudyFileError as e:
        # a damaged study.json costs its axes and labels, not the listing of its runs
        return Study(path, StudyDoc.empty(), runs, str(e))
    return Study(path, doc or StudyDoc.empty(), runs)


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
    return sorted(out, key=_age, reverse=True)


def _age(run: RunDir) -> tuple[str, int, str]:
    """A run's id starts with the second it was made: two made in one second (a dry-run
    right after another) are told apart by when their recipe file was written, not by
    their names."""
    try:
        written = run.recipe.stat().st_mtime_ns
    except OSError:
        written = 0
    return run.run_id[:15], written, run.run_id


def study_of(run: RunDir) -> Study | None:
    parent = run.path.parent
    return _study(parent) if is_study(parent) else None
