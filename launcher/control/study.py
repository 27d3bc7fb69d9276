"""A study in one allocation: its configurations in turn, each in its own run directory,
with the engines they share loaded once.

Each configuration runs as a run of its own (launcher.control.orchestrator: plan, preflight,
agents, engines, health, router, P->D check, sweep, gate, teardown, summary), except that
the engines it shares with the others are started by the first configuration that needs
them and kept loaded for the next. A router is started for each configuration with exactly
its endpoints. A configuration that fails fails alone: the engine that died is named there,
and the next configuration starts it again. A signal (scancel, the time limit) ends the
study: the configuration in progress tears down, the finished ones are kept, the rest are
recorded as not run. A lost node fails the configuration it was in; Slurm is asked to keep
the job on the other nodes, and the rest run on those (or are recorded as not run when they
need more). allocation.json in the study folder is the allocation's own record.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from launcher.control import allocation
from launcher.control.orchestrator import InStudy, Signals, run
from launcher.control.pool import EnginePool
from launcher.control.record import say
from launcher.control.watch import NodeWatch
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


def _plan_nodes(run: RunDir) -> list[str]:
    """The nodes a configuration's plan.json names (those it ran on, once planned there)."""
    doc = rundir.read_json(run.plan)
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    return [n.get("name") for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) \
        else []


def _short_of(run: RunDir, lost: dict[str, dict]) -> str | None:
    """Why a configuration cannot run on the nodes the allocation has left, or None."""
    need, left = len(_plan_nodes(run)), allocation.allocation_nodes() or []
    if need <= len(left):
        return None
    return (f"it needs {need} nodes and the allocation has {len(left)} left "
            f"({', '.join(left) or 'none'}) after losing "
            + ", ".join(f"{r['node']} in {r['run']}" for r in lost.values()))


def _lost_sentence(lost: dict[str, dict]) -> str:
    r = next(r for r in lost.values() if not r["released"])
    return (f"{r['node']} was lost in {r['run']} and Slurm would not keep the job on the "
            f"other nodes: {r.get('error')}")


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
    first = RunDir(study_dir / turns[0].run)
    prepared = rundir.read_json(first.plan)
    allocation.check_allocation(first.recipe, int(alloc.get("nodes") or 0),
                                prepared.get("runtime") if isinstance(prepared, dict) else None,
                                "this study")
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
    lost: dict[str, dict] = {}  # node -> its record in allocation.json's lost_nodes

    def lose(found: dict[str, str], where: str) -> bool:
        """Nodes found lost (in configuration `where`, or between two): Slurm is asked to
        keep the job on the others and their engines leave the pool; whether the study can
        go on (Slurm ends a job whose node it marks down unless the node left the job)."""
        new = {n: why for n, why in found.items() if n not in lost}
        if not new:
            return all(r["released"] for r in lost.values())
        error = allocation.release(sorted(new))
        pool.lose(set(new), where)
        for node, why in sorted(new.items()):
            lost[node] = {"node": node, "why": why, "run": where, "ts": time.time(),
                          "released": error is None, **({"error": error} if error else {})}
            doc.setdefault("lost_nodes", []).append(lost[node])
        left = allocation.allocation_nodes() or []
        say(f"study: lost {', '.join(sorted(new))} in {where}: " + (
            f"the job goes on on the other {len(left)} node(s) ({', '.join(left)})"
            if error is None else f"Slurm would not keep the job without it ({error})"))
        save()
        return error is None

    for i, turn in enumerate(turns):
        run_dir = RunDir(study_dir / turn.run)
        entry = {"run": turn.run, "turn": turn.to_json()}
        doc["configurations"].append(entry)
        if ended_by is None and signals.reason:
            ended_by = signals.reason
        if ended_by is None and i and doc["slurm_job_id"]:
            # a node can die between configurations, or hold only idle engines
            found = NodeWatch(allocation.allocation_nodes() or [], slurm=True).confirm()
            if found and not lose(found, "between configurations"):
                ended_by = _lost_sentence(lost)
        if ended_by is None and lost and (short := _short_of(run_dir, lost)):
            _not_run(run_dir, short)
            entry.update(state=str(State.CANCELLED), seconds=0.0, error=f"not run: {short}")
            save()
            continue
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
                                      str(study_dir), more=i < len(turns) - 1, lose=lose))
        except UserError as e:  # recorded in its run.json by the orchestrator
            say(f"study: {turn.run}: {e}")
        rec = run_dir.read_record()
        state = rec.state if rec else State.FAILED
        entry.update(state=str(state), seconds=round(time.time() - t0, 2),
                     error=rec.error if rec else "no run.json was written",
                     phases_s=_phases(run_dir), nodes=_plan_nodes(run_dir))
        if ended_by is None and not all(r["released"] for r in lost.values()):
            ended_by = _lost_sentence(lost)
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
        f"measuring)" + "".join(f"; {r['node']} lost in {r['run']}" for r in lost.values()))
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
