"""A study in one allocation: its configurations in turn, each in its own run directory,
with the engines they share loaded once.

Each configuration runs as a run of its own (launcher.control.orchestrator: plan, preflight,
agents, engines, health, router, P->D check, sweep, gate, teardown, summary), except that
the engines it shares with the others are started by the first configuration that needs
them and kept loaded for the next. A router is started for each configuration with exactly
its endpoints. A configuration that fails fails alone: the engine that died is named there,
and the next configuration starts it again. A signal (scancel, the time limit) ends the
study: the configuration in progress tears down, the finished ones are kept, the rest are
recorded as not run. allocation.json in the study folder is the allocation's own record.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from launcher.control.orchestrator import InStudy, Signals, run
from launcher.control.pool import EnginePool
from launcher.control.record import say
from launcher.errors import UserError
from launcher.planning.study import Turn
from launcher.run import rundir
from launcher.run.rundir import RunDir, RunRecord
from launcher.run.vocab import State

ALLOCATION = "allocation.json"


def study_doc(study_dir: Path) -> dict:
    doc = rundir.read_json(study_dir / rundir.STUDY)
    alloc = (doc or {}).get("allocation") if isinstance(doc, dict) else None
    if not isinstance(alloc, dict) or alloc.get("mode") != "one":
        raise UserError(f"{study_dir} is not a study prepared for one allocation (submit "
                        "RECIPE --sweep KEY=V1,V2,... --allocation one)")
    return alloc


def _not_run(run: RunDir, why: str) -> None:
    """A configuration the study never reached: cancelled, and why, in its own run.json."""
    now = time.time()
    try:
        run.write_record(RunRecord(state=State.CANCELLED, started=None, ended=now, updated=now,
                                   error=f"not run: {why}", host=socket.gethostname()))
        run.event("cancelled", error=f"not run: {why}")
    except OSError as e:
        say(f"could not record that {run.run_id} was not run: {e}")


def _phases(run: RunDir) -> dict[str, float]:
    lc = (rundir.read_json(run.summary) or {}).get("lifecycle") or {}
    return {k: float(v.get("seconds") or 0) for k, v in (lc.get("phases") or {}).items()
            if isinstance(v, dict)}


def run_study(study_dir: Path) -> int:
    """Every configuration of a study prepared for one allocation, in its planned order."""
    study_dir = Path(study_dir).resolve()
    alloc = study_doc(study_dir)
    record_file = study_dir / ALLOCATION
    if record_file.exists():
        raise UserError(f"{study_dir} already holds an attempt ({ALLOCATION}): a study is run "
                        "by one allocation only; submit it again for a new one")
    try:
        turns = [Turn.from_json(t) for t in alloc.get("turns") or []]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UserError(f"{study_dir}: study.json's allocation.turns is damaged (each is "
                        "{run, start, restart, keep, idle}): prepare the study again") from None
    if not turns:
        raise UserError(f"{study_dir}: study.json lists no configuration to run")
    signals = Signals.for_recipe(RunDir(study_dir / turns[0].run).recipe)
    pool = EnginePool()
    started = time.time()
    doc: dict = {
        "state": str(State.RUNNING), "started": started, "ended": None,
        "host": socket.gethostname(), "pid": os.getpid(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "nodes": alloc.get("nodes"),
        "gpus_per_node": alloc.get("gpus_per_node"), "configurations": [],
        "engines": pool.events,
    }

    def save() -> None:
        try:
            rundir.write_json(record_file, doc)
        except OSError as e:
            say(f"could not write {record_file}: {e}")

    save()
    ended_by: str | None = None
    for i, turn in enumerate(turns):
        run_dir = RunDir(study_dir / turn.run)
        entry = {"run": turn.run, "turn": turn.to_json()}
        doc["configurations"].append(entry)
        if ended_by is None and signals.reason:
            ended_by = signals.reason
        if ended_by is None and run_dir.read_cancel() is not None:
            _not_run(run_dir, "cancelled by `launcher cancel` before its turn")
            entry.update(state=str(State.CANCELLED), seconds=0.0)
            save()
            continue
        if ended_by is not None:
            _not_run(run_dir, f"the study ended before its turn ({ended_by})")
            entry.update(state=str(State.CANCELLED), seconds=0.0)
            save()
            continue
        say(f"study: configuration {i + 1} of {len(turns)}: {turn.run} (starts "
            f"{', '.join(turn.start + turn.restart) or 'no engine'}; keeps "
            f"{', '.join(turn.keep) or 'none'}; idle {', '.join(turn.idle) or 'none'})")
        t0 = time.time()
        try:
            run(run_dir.path, InStudy(pool, signals, int(alloc.get("port_span") or 0),
                                      str(study_dir), more=i < len(turns) - 1))
        except UserError as e:  # recorded in its run.json by the orchestrator
            say(f"study: {turn.run}: {e}")
        rec = run_dir.read_record()
        state = rec.state if rec else State.FAILED
        entry.update(state=str(state), seconds=round(time.time() - t0, 2),
                     error=rec.error if rec else "no run.json was written",
                     phases_s=_phases(run_dir))
        if rec and rec.error and rec.error.startswith("node lost"):
            ended_by = f"a node was lost in {turn.run}"
        save()
    Signals.ignore()
    pool.stop_all("study", "the study's end")
    ended = time.time()
    states = [c.get("state") for c in doc["configurations"]]
    doc["state"] = str(State.SUCCEEDED if all(s == State.SUCCEEDED for s in states)
                       else State.CANCELLED if signals.reason else State.FAILED)
    doc["ended"] = ended
    doc["summary"] = allocation_summary(doc)
    save()
    s = doc["summary"]
    say(f"study {doc['state']}: {s['succeeded']} of {len(turns)} configuration(s) succeeded; "
        f"{s['engine_starts']} engine start(s); {s['gpu_hours']:.2f} GPU-hours over "
        f"{s['wall_s']:.0f} s ({s['loading_s']:.0f} s loading, {s['measuring_s']:.0f} s "
        f"measuring)")
    return 0 if doc["state"] == State.SUCCEEDED else 1


MEASURING = ("measuring",)  # the run's lifecycle phases (launcher.run.figures)
LOADING = ("loading",)


def allocation_summary(doc: dict) -> dict:
    """The allocation's figures: wall time and GPU-hours, engine starts, and its time spent
    loading engines against measuring (from each configuration's lifecycle)."""
    wall = (doc.get("ended") or time.time()) - (doc.get("started") or time.time())
    gpus = int(doc.get("nodes") or 0) * int(doc.get("gpus_per_node") or 0)
    confs = doc.get("configurations") or []
    phases: dict[str, float] = {}
    for c in confs:
        for k, v in (c.get("phases_s") or {}).items():
            phases[k] = phases.get(k, 0.0) + v
    return {
        "wall_s": round(wall, 1), "gpus": gpus, "gpu_hours": round(gpus * wall / 3600, 3),
        "engine_starts": sum(e.get("event") == "started" for e in doc.get("engines") or []),
        "succeeded": sum(c.get("state") == State.SUCCEEDED for c in confs),
        "loading_s": round(sum(v for k, v in phases.items() if k in LOADING), 1),
        "measuring_s": round(sum(v for k, v in phases.items() if k in MEASURING), 1),
    }
