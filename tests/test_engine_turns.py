"""One rule decides whether an engine is the same (planning.study.same_engine): the dry-run's
plan of turns of the published five-configuration study and the orchestrator's own decisions
replayed over the same plans (its pool between configurations, its sweep direction, its
restarts before a point) give the same engine starts, restarts and keeps."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.control.lifetime import EngineLifetime
from launcher.control.pool import EnginePool
from launcher.planning import study
from launcher.run.plandoc import read_plan
from launcher.run.vocab import Kind
from launcher.schema import recipe as recipe_mod

SEED = "qwen3.5-397b-gb200-disagg"


class FakeHandle:
    """A running engine part: alive, never stopped for real."""

    def __init__(self, proc):
        self.proc = proc

    def exit_code(self):
        return None


class FakeBackend:
    def stop(self, handles, grace_s=0.0):
        pass


class FakeBook:
    def event(self, *a, **k):
        pass


def replay(orch_runs: list[Path]) -> list[dict]:
    """The orchestrator's decisions, configuration by configuration in the study's order:
    EngineLifetime.direction, EnginePool.settle and the restarts of its sweep
    (study.changed), on one pool."""
    pool = EnginePool()
    out = []
    for run in orch_runs:
        doc = read_plan(run)
        engines = doc.of_kind(Kind.ENGINE)
        orch = object.__new__(EngineLifetime)  # the real methods, without a run to start
        orch.pool, orch.book, orch.descending = pool, FakeBook(), False
        orch.run = type("R", (), {"run_id": run.name, "path": run})()
        orch.plan = type("P", (), {"recipe": recipe_mod.load(str(run / "recipe.yaml"))})()
        want = orch.direction(engines, orch.signatures(engines))
        before = {ep: e.signature for ep, e in pool.loaded.items()}
        kept = pool.settle(want, run.name)
        started = sorted(ep for ep in want if ep not in kept)
        out.append({"run": run.name, "keep": sorted(kept),
                    "restart": sorted(ep for ep in started if ep in before),
                    "start": sorted(ep for ep in started if ep not in before),
                    "descending": orch.descending})
        for ep in started:
            pool.add(ep, [FakeHandle(p) for p in engines if p.endpoint == ep], want[ep],
                     run.name, FakeBackend())
        # its sweep: before each point the engines whose command line changes restart
        b = orch.plan.recipe.benchmark
        for c in sorted(b.concurrency, reverse=orch.descending):
            now = {ep: e.signature for ep, e in pool.loaded.items() if ep in want}
            at_c = orch.signatures(engines, at=c)
            for ep in study.changed(at_c, now):
                pool.drop(ep, run.name, "restart")
                pool.add(ep, [FakeHandle(p) for p in engines if p.endpoint == ep],
                         at_c[ep], run.name, FakeBackend())
    return out


def test_the_plan_of_turns_and_the_orchestrator_decide_alike(cli, tmp_path):
    code, out, err = cli("submit", SEED, "--sweep", "prefill.endpoints=4,5,6,7,8",
                         "--allocation", "one", "--dry-run", timeout=300)
    assert code == 0, err
    (folder,) = [p for p in (tmp_path / "runs").iterdir() if p.name.endswith("-study")]
    doc = json.loads((folder / "study.json").read_text())
    turns = doc["allocation"]["turns"]
    order = [folder / t["run"] for t in turns]
    got = replay(order)
    want = [{k: (sorted(t[k]) if isinstance(t[k], list) else t[k])
             for k in ("run", "keep", "restart", "start", "descending")} for t in turns]
    assert got == want
    # the published study as the golden plan shows it: everything loads once at the start;
    # each next configuration keeps every engine it uses as the last sweep left it, its
    # sweep running the other way (down from 5120, then up from 64, ...)
    assert len(turns[0]["start"]) == 9 and not any(t["restart"] for t in turns)
    assert [t["descending"] for t in turns] == [False, True, False, True, False]
