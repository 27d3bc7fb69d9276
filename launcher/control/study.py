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

import math
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
from launcher.run import rundir, studydoc
from launcher.run.rundir import ALLOCATION, RunDir, RunRecord
from launcher.run.studydoc import (
    AllocationRecord,
    AllocationSummary,
    ConfigurationRecord,
    EngineEvent,
    LostNode,
    StudyAllocation,
)
from launcher.run.vocab import State


def study_plan(study_dir: Path) -> StudyAllocation:
    """study.json's plan for one allocation; UserError, one sentence, when the study has
    none or its study.json is damaged (studydoc.StudyFileError)."""
    doc = studydoc.read_study(study_dir)
    if doc is None or doc.allocation is None:
        raise UserError(f"{study_dir} is not a study prepared for one allocation (submit "
                        "RECIPE --sweep KEY=V1,V2,... --allocation one)")
    return doc.allocation


def _not_run(run: RunDir, why: str) -> None:
    """A configuration the study never reached: cancelled, and why, in its own run.json; one
    begun in an earlier visit keeps what it measured there and says which points it lacks."""
    now = time.time()
    rec = run.read_record()
    try:
        if rec is not None and not State(rec.state).final:
            rec.state, rec.ended, rec.updated, rec.stage = State.CANCELLED, now, now, None
            rec.error = (f"cancelled before its later visits: {why}; the points measured in "
                         "its earlier visits are kept")
            rec.failed_stage = None
            run.event("cancelled", error=rec.error)  # before the final state, as every run's
            run.write_record(rec)
            try:  # its summary: the points it has, labelled as a cancelled run's
                from launcher.run import figures

                rundir.write_json(run.summary, figures.summary(run.path, State.CANCELLED,
                                                               rec.error))
            except Exception as e:  # noqa: BLE001 - the record above is what must stay
                say(f"could not write {run.run_id}'s summary: {e!r}")
            return
        run.event("cancelled", error=f"not run: {why}")
        run.write_record(RunRecord(state=State.CANCELLED, started=None, ended=now, updated=now,
                                   error=f"not run: {why}", host=socket.gethostname()))
    except OSError as e:
        say(f"could not record that {run.run_id} was not run: {e}")


def _plan_nodes(run: RunDir) -> list[str]:
    """The nodes a configuration's plan.json names (those it ran on, once planned there)."""
    doc = rundir.read_json(run.plan)
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    return [n["name"] for n in nodes if isinstance(n, dict) and isinstance(n.get("name"), str)] \
        if isinstance(nodes, list) else []


def _short_of(run: RunDir, lost: dict[str, LostNode]) -> str | None:
    """Why a configuration cannot run on the nodes the allocation has left, or None."""
    need, left = len(_plan_nodes(run)), allocation.allocation_nodes() or []
    if need <= len(left):
        return None
    return (f"it needs {need} nodes and the allocation has {len(left)} left "
            f"({', '.join(left) or 'none'}) after losing "
            + ", ".join(f"{r.node} in {r.run}" for r in lost.values()))


def _lost_sentence(lost: dict[str, LostNode]) -> str:
    r = next(r for r in lost.values() if not r.released)
    return (f"{r.node} was lost in {r.run} and Slurm would not keep the job on the "
            f"other nodes: {r.error}")


def _phases(run: RunDir) -> dict[str, float]:
    """Its lifecycle's seconds per phase (summary.json), those that are numbers."""
    doc = rundir.read_json(run.summary)
    lc = doc.get("lifecycle") if isinstance(doc, dict) else None
    phases = lc.get("phases") if isinstance(lc, dict) else None
    return {str(k): float(v["seconds"]) for k, v in (phases or {}).items()
            if isinstance(v, dict) and type(v.get("seconds")) in (int, float)
            and math.isfinite(v["seconds"])} if isinstance(phases, dict) else {}


def run_study(study_dir: Path) -> int:
    """Every configuration of a study prepared for one allocation, in its planned order."""
    study_dir = Path(study_dir).resolve()
    alloc = study_plan(study_dir)
    if (study_dir / ALLOCATION).exists():
        raise UserError(f"{study_dir} already holds an attempt ({ALLOCATION}): a study is run "
                        "by one allocation only; submit it again for a new one")
    turns = [Turn.from_json(t) for t in alloc.turns]  # their shape: checked by its reader
    if not turns:
        raise UserError(f"{study_dir}: study.json lists no configuration to run")
    first = RunDir(study_dir / turns[0].run)
    prepared = rundir.read_json(first.plan)
    allocation.check_allocation(first.recipe, alloc.nodes,
                                prepared.get("runtime") if isinstance(prepared, dict) else None,
                                "this study")
    signals = Signals.for_recipe(RunDir(study_dir / turns[0].run).recipe)
    pool = EnginePool()
    doc = AllocationRecord(
        state=State.RUNNING, started=time.time(), host=socket.gethostname(), pid=os.getpid(),
        slurm_job_id=os.environ.get("SLURM_JOB_ID"), nodes=alloc.nodes,
        gpus_per_node=alloc.gpus_per_node)

    def save() -> None:
        doc.engines = [EngineEvent.of(e) for e in pool.events]
        try:
            studydoc.write_allocation(study_dir, doc)
        except OSError as e:
            say(f"could not write {study_dir / ALLOCATION}: {e}")

    save()
    ended_by: str | None = None
    lost: dict[str, LostNode] = {}  # node -> its record in allocation.json's lost_nodes

    def lose(found: dict[str, str], where: str) -> bool:
        """Nodes found lost (in configuration `where`, or between two): Slurm is asked to
        keep the job on the others and their engines leave the pool; whether the study can
        go on (Slurm ends a job whose node it marks down unless the node left the job)."""
        new = {n: why for n, why in found.items() if n not in lost}
        if not new:
            return all(r.released for r in lost.values())
        error = allocation.release(sorted(new))
        pool.lose(set(new), where)
        for node, why in sorted(new.items()):
            lost[node] = LostNode(node=node, why=why, run=where, ts=time.time(),
                                  released=error is None, error=error)
            doc.lost_nodes.append(lost[node])
        left = allocation.allocation_nodes() or []
        say(f"study: lost {', '.join(sorted(new))} in {where}: " + (
            f"the job goes on on the other {len(left)} node(s) ({', '.join(left)})"
            if error is None else f"Slurm would not keep the job without it ({error})"))
        save()
        return error is None

    for i, turn in enumerate(turns):
        run_dir = RunDir(study_dir / turn.run)
        entry = ConfigurationRecord(run=turn.run, turn=turn.to_json())
        doc.configurations.append(entry)
        rec = run_dir.read_record() if not turn.first else None
        if rec is not None and State(rec.state).final:  # it ended in an earlier visit
            entry.state, entry.seconds = rec.state, 0.0
            entry.error = f"not visited: it ended in an earlier visit ({rec.state})"
            save()
            continue
        if ended_by is None and signals.reason:
            ended_by = signals.reason
        if ended_by is None and i and doc.slurm_job_id:
            # a node can die between configurations, or hold only idle engines
            found = NodeWatch(allocation.allocation_nodes() or [], slurm=True).confirm()
            if found and not lose(found, "between configurations"):
                ended_by = _lost_sentence(lost)
        if ended_by is None and lost and (short := _short_of(run_dir, lost)):
            _not_run(run_dir, short)
            entry.state, entry.seconds, entry.error = State.CANCELLED, 0.0, f"not run: {short}"
            save()
            continue
        if ended_by is None and run_dir.read_cancel() is not None:
            _not_run(run_dir, "cancelled by `launcher cancel` before its turn")
            entry.state, entry.seconds = State.CANCELLED, 0.0
            save()
            continue
        if ended_by is not None:
            _not_run(run_dir, f"the study ended before its turn ({ended_by})")
            entry.state, entry.seconds = State.CANCELLED, 0.0
            save()
            continue
        say(f"study: visit {i + 1} of {len(turns)}: {turn.run}"
            + (f" at concurrency {', '.join(map(str, turn.points))}" if turn.points else "")
            + " (starts "
            f"{', '.join(turn.start + turn.restart) or 'no engine'}; keeps "
            f"{', '.join(turn.keep) or 'none'}; idle {', '.join(turn.idle) or 'none'}"
            + (f"; stops {', '.join(turn.stop)}, on GPUs or ports it needs" if turn.stop else "")
            + ")")
        t0 = time.time()
        try:
            run(run_dir.path, InStudy(pool, signals, alloc.port_span, str(study_dir),
                                      more=i < len(turns) - 1, lose=lose, visit=turn))
        except UserError as e:  # recorded in its run.json by the orchestrator
            say(f"study: {turn.run}: {e}")
        rec = run_dir.read_record()
        entry.state = rec.state if rec else State.FAILED
        entry.seconds = round(time.time() - t0, 2)
        entry.error = rec.error if rec else "no run.json was written"
        entry.phases_s = _phases(run_dir) if State(entry.state).final else {}
        entry.nodes = _plan_nodes(run_dir)
        if ended_by is None and not all(r.released for r in lost.values()):
            ended_by = _lost_sentence(lost)
        save()
    Signals.ignore()
    pool.stop_all("study", "the study's end")
    for t in turns:  # begun and not ended (a visit left undone): cancelled, its points kept
        rec = RunDir(study_dir / t.run).read_record()
        if rec is not None and not State(rec.state).final:
            _not_run(RunDir(study_dir / t.run), ended_by or "the study ended")
    final = {c.run: c.state for c in doc.configurations}  # each one's state after its last
    doc.state = (State.SUCCEEDED if all(s == State.SUCCEEDED for s in final.values())
                 else State.CANCELLED if signals.reason else State.FAILED)
    doc.ended = time.time()
    doc.engines = [EngineEvent.of(e) for e in pool.events]  # with the stops at its end
    doc.summary = s = allocation_summary(doc, study_dir)
    save()
    record_answer(study_dir)
    say(f"study {doc.state}: {s.succeeded} of {len(final)} configuration(s) succeeded; "
        f"{s.engine_starts} engine start(s); {s.gpu_hours:.2f} GPU-hours over "
        f"{s.wall_s:.0f} s ({s.loading_s:.0f} s loading, {s.measuring_s:.0f} s "
        f"measuring; useful GPU time {s.useful_gpu_time or 0:.2f}: the sweep points' windows "
        "over the allocation's time)" + "".join(f"; {r.node} lost in {r.run}" for r in lost.values()))
    return 0 if doc.state == State.SUCCEEDED else 1


def record_answer(study_dir: Path) -> None:
    """Under benchmark.slo: the study's answer (the best configuration at its largest
    passing load, each one's frontier) said and written to slo.json beside study.json."""
    from launcher.run import listing, slo_answer

    try:
        ans = slo_answer.answer(listing.study_at(study_dir).configurations())
        if ans is not None:
            slo_answer.write(study_dir, ans)
            say(f"study: {ans.sentence}")
    except Exception as e:  # noqa: BLE001 - the runs' own records stand without it
        say(f"could not write the study's SLO answer ({slo_answer.SLO_FILE}): {e!r}")


MEASURING = ("measuring",)  # the run's lifecycle phases (launcher.run.figures)
LOADING = ("loading",)


def allocation_summary(doc: AllocationRecord, study_dir: Path | None = None
                       ) -> AllocationSummary:
    """The allocation's figures: wall time and GPU-hours, engine starts, and its time spent
    loading engines against measuring (from each configuration's lifecycle)."""
    wall = (doc.ended or time.time()) - doc.started
    gpus = (doc.nodes or 0) * (doc.gpus_per_node or 0)
    phases: dict[str, float] = {}
    for c in doc.configurations:  # a configuration's lifecycle, from the visit that ended it
        for k, v in c.phases_s.items():
            phases[k] = phases.get(k, 0.0) + v
    final = {c.run: c.state for c in doc.configurations}
    measured = sum(measured_windows(study_dir / run) for run in final) if study_dir else None
    return AllocationSummary(
        wall_s=round(wall, 1), gpus=gpus, gpu_hours=round(gpus * wall / 3600, 3),
        engine_starts=sum(e.event == "started" for e in doc.engines),
        succeeded=sum(s == State.SUCCEEDED for s in final.values()),
        loading_s=round(sum(v for k, v in phases.items() if k in LOADING), 1),
        measuring_s=round(sum(v for k, v in phases.items() if k in MEASURING), 1),
        measured_windows_s=None if measured is None else round(measured, 1),
        useful_gpu_time=round(measured / wall, 3) if measured is not None and wall > 0
        else None,
    )


def measured_windows(run_dir: Path) -> float:
    """Seconds inside a configuration's measured windows: each sweep point's client run
    (its warm-up and measured requests), from its events."""
    return sum(float(e["seconds"]) for e in RunDir(run_dir).events()
               if e.get("event") == "sweep_point" and type(e.get("seconds")) in (int, float))
