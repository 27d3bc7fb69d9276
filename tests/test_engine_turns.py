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

SEED = "qwen3.5-397b-gb200-disagg"


class FakeHandle:
    """A running engine part: alive, never stopped for real."""

    def __init__(self, proc):
        self.proc = proc

    def exit_code(self):
        return None


class FakeBackend:
    def stop(self, handles, grace_s=0.0, settle=True):
        pass


class FakeBook:
    def event(self, *a, **k):
        pass


def replay(folder: Path, turns: list[dict]) -> list[dict]:
    """The orchestrator's decisions, visit by visit in the study's order: the signatures its
    engines start with for the visit's first point (EngineLifetime.take_over),
    EnginePool.settle, and the restarts its points would need (study.changed), on one
    pool."""
    pool = EnginePool()
    out = []
    for t in turns:
        run = folder / t["run"]
        doc = read_plan(run)
        engines = doc.processes_of_kind(Kind.ENGINE)
        life = object.__new__(EngineLifetime)  # the real methods, without a run to start
        life.pool, life.book = pool, FakeBook()
        life.run = type("R", (), {"run_id": run.name, "path": run})()
        first = t["points"][0] if t["points"] else None
        want = life.signatures(engines, at=first)
        before = {ep: e.signature for ep, e in pool.loaded.items()}
        kept = pool.settle(want, run.name)
        started = sorted(ep for ep in want if ep not in kept)
        out.append({"run": run.name, "keep": sorted(kept),
                    "restart": sorted(ep for ep in started if ep in before),
                    "start": sorted(ep for ep in started if ep not in before)})
        for ep in started:
            pool.add(ep, [FakeHandle(p) for p in engines if p.endpoint == ep], want[ep],
                     run.name, FakeBackend())
        # its points: none needs an engine other than the one it holds
        for c in t["points"]:
            now = {ep: e.signature for ep, e in pool.loaded.items() if ep in want}
            assert study.changed(life.signatures(engines, at=c), now) == [], (run.name, c)
    return out


def test_the_plan_of_turns_and_the_orchestrator_decide_alike(cli, tmp_path):
    code, out, err = cli("submit", SEED, "--sweep", "prefill.endpoints=4,5,6,7,8",
                         "--allocation", "one", "--dry-run", timeout=300)
    assert code == 0, err
    (folder,) = [p for p in (tmp_path / "runs").iterdir() if p.name.endswith("-study")]
    doc = json.loads((folder / "study.json").read_text())
    turns = doc["allocation"]["turns"]
    got = replay(folder, turns)
    want = [{k: sorted(t[k]) if isinstance(t[k], list) else t[k]
             for k in ("run", "keep", "restart", "start")} for t in turns]
    assert got == want
    # the published study as the golden plan shows it: everything loads once at the start;
    # every configuration's points below 4096 on it, then each at 4096 after one restart of
    # the decode, then each at 5120 after another: 3 load rounds, 11 engine starts
    assert len(turns[0]["start"]) == 9
    assert [t["restart"] for t in turns if t["restart"]] == [["decode-0"], ["decode-0"]]
    assert [len(t["points"]) for t in turns] == [7] * 5 + [1] * 10
    assert sum(len(t["start"]) + len(t["restart"]) for t in turns) == 11
