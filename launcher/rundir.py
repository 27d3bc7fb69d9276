"""The run directory: the only interface between launcher, telemetry and dashboard.

Safe on NFS/Lustre: every file has one writer and is either append-only (events.jsonl,
logs) or replaced whole by write-then-rename (run.json, plan.json, summary.json).

    runs/<run-id>/
      recipe.yaml  plan.json  job.sbatch  commands.sh  run.json  events.jsonl  summary.json
      logs/<process>.log      telemetry/<node>/      bench/      accuracy/
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# run.json "state": planned -> submitted (Slurm) -> running -> one of these. The stages a
# running run passes through are the orchestrator's (launcher/orchestrator.py).
FINAL_STATES = ("succeeded", "failed", "cancelled")


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` whole: readers see the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line; a torn last line (writer killed mid-write) is skipped."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return rows


def tail(path: Path, lines: int = 20, max_bytes: int = 256 * 1024) -> list[str]:
    """The last lines of a log without reading all of it (logs of long runs are big)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return []
    out = data.splitlines()
    if size > max_bytes and out:
        out = out[1:]  # the first one is probably cut
    return [x.decode("utf-8", "replace") for x in out[-lines:]]


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    # --- file names, one place -------------------------------------------------------
    @property
    def recipe(self) -> Path:
        return self.path / "recipe.yaml"

    @property
    def plan(self) -> Path:
        return self.path / "plan.json"

    @property
    def sbatch(self) -> Path:
        return self.path / "job.sbatch"

    @property
    def commands(self) -> Path:
        return self.path / "commands.sh"

    @property
    def state_file(self) -> Path:
        return self.path / "run.json"

    @property
    def events_file(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def cancel_request(self) -> Path:
        """Written by `launcher cancel`; the orchestrator polls for it and tears down."""
        return self.path / "cancel.request"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def bench(self) -> Path:
        return self.path / "bench"

    @property
    def accuracy(self) -> Path:
        return self.path / "accuracy"

    @property
    def slurm(self) -> Path:
        """submitit's folder: its pickles and the batch step's own stdout/stderr."""
        return self.path / "slurm"

    def telemetry(self, node: str | None = None) -> Path:
        base = self.path / "telemetry"
        return base / node if node else base

    def log(self, process: str) -> Path:
        return self.logs / f"{process}.log"

    # --- state -----------------------------------------------------------------------
    def read_state(self) -> dict:
        return read_json(self.state_file, default={}) or {}

    def update_state(self, **fields: Any) -> dict:
        """Merge `fields` into run.json (the orchestrator is its only writer)."""
        state = self.read_state()
        state.update(fields)
        state["updated"] = time.time()
        write_json(self.state_file, state)
        return state

    def event(self, kind: str, **fields: Any) -> None:
        """Append one line to events.jsonl (stage changes and notable events)."""
        self.events_file.parent.mkdir(parents=True, exist_ok=True)
        row = {"ts": round(time.time(), 3), "event": kind, **fields}
        with open(self.events_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def events(self) -> list[dict]:
        return read_jsonl(self.events_file)


def new_run_id(recipe_name: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{stamp}-{recipe_name}"


def create(runs_root: Path, recipe_name: str) -> RunDir:
    """A fresh run directory; a second run in the same second gets a suffix, never a clash."""
    runs_root.mkdir(parents=True, exist_ok=True)
    base = new_run_id(recipe_name)
    for i in range(1000):
        path = runs_root / (base if i == 0 else f"{base}.{i}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return RunDir(path)
    raise RuntimeError(f"could not create a run directory under {runs_root}")
