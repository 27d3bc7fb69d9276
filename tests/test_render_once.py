"""One plan, rendered once, in each place a run is planned: on the submitting side (what
the dry-run prints and the files it writes) and inside the allocation (the real nodes and
their addresses, what the orchestrator starts). Counted by wrapping the planner and the
renderer where the launcher calls them."""

from __future__ import annotations

import subprocess
import time
from collections import Counter

import pytest

from launcher import text
from launcher.control import allocation, backends, orchestrator, prepare, record
from launcher.planning import kv, render, schedulers
from launcher.run.rundir import RunRecord
from launcher.run.vocab import State


@pytest.fixture
def counts(monkeypatch) -> Counter:
    seen: Counter = Counter()

    def count(module, name: str) -> None:
        real = getattr(module, name)

        def wrapper(*a, **k):
            seen[name] += 1
            return real(*a, **k)

        monkeypatch.setattr(module, name, wrapper)

    for module in (prepare, allocation):
        count(module, "make_plan")
    count(kv, "read_checkpoint")  # the model folder: once per plan, not per engine
    for name in ("processes", "engine_processes", "commands_sh", "plan_doc"):
        count(render, name)
    count(schedulers.Slurm, "batch_script")
    return seen


def test_the_submitting_side_plans_once_and_renders_once(tmp_path, counts):
    [p] = prepare.prepare_all("devcluster-sim", [], [], tmp_path / "runs")
    text.plan_text(p)
    assert counts == Counter(make_plan=1, processes=1, engine_processes=len(p.plan.endpoints),
                             batch_script=1, commands_sh=1, plan_doc=1, read_checkpoint=1), counts
    # what was printed and written is that one render
    assert p.run.commands.read_text() == p.rendered.commands
    assert p.run.sbatch.read_text() == p.rendered.sbatch


def test_inside_the_allocation_the_plan_is_completed_not_made_again(tmp_path, counts):
    """The host check runs on the plan for the real nodes; the addresses the nodes report
    complete that plan; one render feeds plan.json, commands.sh and the orchestrator."""
    [p] = prepare.prepare_all("local-sim", [], [], tmp_path / "runs")
    run = p.run
    counts.clear()

    def step(name: str, commands: list[list[str]]) -> None:
        run.log(name).parent.mkdir(parents=True, exist_ok=True)
        with run.log(name).open("ab") as log:
            for cmd in commands:
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=120,
                               check=True)

    book = record.Book(run, RunRecord(state=State.RUNNING, started=time.time()))
    rendered = allocation.plan_here(run, book, step)
    orch = orchestrator.Orchestrator(run, rendered, backends.make_backend(
        rendered.plan, run.path), book)
    assert counts == Counter(make_plan=1, processes=1,
                             engine_processes=len(rendered.plan.endpoints),
                             commands_sh=1, plan_doc=1, read_checkpoint=1), counts
    assert orch.planned is rendered.processes
    assert run.commands.read_text() == rendered.commands
    assert {n.name: n.address for n in rendered.doc.nodes} == dict(rendered.plan.addresses)
