"""Faults inside a study run in one allocation (issue 39): a node lost in the middle of the
study fails the configuration it was in, naming the node, and the study goes on with what
the remaining nodes hold; nothing is left behind in the job.

The dev-cluster test (marker `slurm`) needs `bash slurm/devcluster/up.sh` and root: it
kills a node's slurmd and everything of the job on it, as tests/test_faults.py does, and
brings the node back afterwards.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import helpers
import pytest
import yaml
from helpers import launcher, leftovers
from test_faults import bring_back, job_gone, lose_node, need_cluster, steps_left

from launcher.run import rundir

# This module's port bases (test_faults, test_cancel_stages and test_prometheus take others;
# the first block free now is used).
PORT_BASES = (29000, 30000, 31000)


def _sets(*pairs: str) -> list[str]:
    return [w for p in pairs for w in ("--set", p)]


def _wait(pred, timeout: float, what: str):
    return helpers.wait_for(pred, timeout, what, poll=0.3)


def _state(run: Path) -> rundir.RunStatus:
    return rundir.RunDir(run).status()


def _release_when_ports_free(study: Path, job: str, base: int) -> None:
    """The held job's ports are its profile's port_base shifted by its job id (another
    suite's run, shifted by its own, can sit there): released once they are free."""
    from launcher.planning.plan import job_port_shift
    from launcher.schema import cluster

    span = int(json.loads((study / "study.json").read_text())["allocation"]["port_span"])
    prof = cluster.load("devcluster").model_copy(update={"port_base": base})
    start = base + job_port_shift(job, prof, span)
    _wait(lambda: all(helpers._binds(p) for p in range(start, start + span)), 180,
          f"ports {start}-{start + span - 1} free for job {job}")
    subprocess.run(["scontrol", "release", job], check=True, capture_output=True)


def _recipes(tmp_path: Path, holds: dict[int, float]) -> list[str]:
    """devcluster-sim with 1..3 prefill endpoints, each a recipe file of its own holding
    `holds[n]` seconds."""
    return helpers.recipe_per_prefill_count(tmp_path, "devcluster-sim",
                                            {n: {"hold_s": h} for n, h in holds.items()})


def _slurm_down(node: str) -> bool:
    state = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], capture_output=True,
                           text=True).stdout.strip()
    return state.startswith(("down", "fail"))  # not "*" alone: not responding yet


def _in_hold(run: Path) -> bool:
    st = _state(run)
    if st.final:
        raise AssertionError(f"{run.name} ended before its hold: {st.state} {st.error}")
    return st.state == "running" and st.stage == "hold"


@pytest.mark.whole_partition
@pytest.mark.slurm
def test_a_node_lost_in_the_second_configuration_fails_it_and_the_third_runs(tmp_path):
    """1..3 prefill endpoints in one allocation of 4 nodes run as 3, 1, 2. During the
    second (decode on nodes 1-2, prefill-0 on node 3) node 3 dies: that configuration fails
    naming it, Slurm keeps the job on the other three (past the moment it marks the node
    down), and the third (2 prefill endpoints, 3 nodes) is planned on them and succeeds; the
    job then ends with nothing left. The configurations are recipes of their own (a study
    of several recipes), so each holds what it needs: the first, which only loads what the
    others keep, nothing; the second 40 s (its node is lost in its hold); the third 30 s, to
    outlast SlurmdTimeout (20 s)."""
    need_cluster()
    base = helpers.free_port_base(PORT_BASES, 400)
    prof = helpers.profile_copy(tmp_path / "devcluster-study-faults.yaml", "devcluster",
                                port_base=base)
    recipes = _recipes(tmp_path, holds={1: 40, 2: 30, 3: 0})
    code, out = launcher(tmp_path, "submit", *recipes, *_sets(
        f"cluster={prof}", "accuracy.enabled=false", "benchmark.concurrency=[4]",
        "slurm.directives.hold=true"), "--allocation", "one")
    assert code == 0, out
    job = re.search(r"submitted job (\d+)", out).group(1)
    (study,) = [p.parent for p in (tmp_path / "runs").glob("*/study.json")]
    turns = json.loads((study / "study.json").read_text())["allocation"]["turns"]
    runs = [study / t["run"] for t in turns]
    assert [yaml.safe_load((r / "recipe.yaml").read_text())["hold_s"] for r in runs] \
        == [0, 40, 30]
    node = None
    try:
        _release_when_ports_free(study, job, base)
        _wait(lambda: _in_hold(runs[1]), 300, "the second configuration's hold")
        plan = json.loads((runs[1] / "plan.json").read_text())
        assert [len(json.loads((r / "plan.json").read_text())["endpoints"]) for r in runs] \
            == [4, 2, 3]  # the decode and 3, 1, 2 prefill endpoints
        batch = plan["nodes"][0]["name"]
        node = next(p["node"] for p in plan["processes"] if p["name"].startswith("prefill-0@"))
        assert node != batch
        t0 = time.monotonic()
        lose_node(node)
        second = _wait(lambda: (s := _state(runs[1])).final and s, 60,
                       "the second configuration's end")
        # Slurm marks the node down (SlurmdTimeout, 20 s here) while the third runs: a job
        # still holding it would be ended then (NODE_FAIL)
        _wait(lambda: _slurm_down(node), 120, f"Slurm to mark {node} down")
        assert not _state(runs[2]).final, _state(runs[2])
        third = _wait(lambda: (s := _state(runs[2])).final and s, 240,
                      "the third configuration's end")
        job_gone(job, timeout=120)
        took = time.monotonic() - t0
    finally:
        subprocess.run(["scancel", job], capture_output=True)  # a failed test: nothing holds it
        if node is not None:
            bring_back(node)
    # the configuration the node was in fails naming it, and what went with it
    assert second.state == "failed", (second.state, second.error)
    assert second.error.startswith(f"node lost: {node} ("), second.error
    assert second.record.culprit == node and f"prefill-0@{node}" in second.error
    code, said = launcher(tmp_path, "status", str(runs[1]))
    assert code == 0 and f"node lost: {node}" in said, said
    # the third ran on the nodes left: its prefill endpoints moved off the lost node
    assert third.state == "succeeded", (third.state, third.error)
    plan3 = json.loads((runs[2] / "plan.json").read_text())
    nodes3 = [n["name"] for n in plan3["nodes"]]
    assert node not in nodes3 and len(nodes3) == 3, nodes3
    summary3 = json.loads((runs[2] / "summary.json").read_text())
    assert summary3["verdict"] == "passed" and len(summary3["points"]) == 1
    assert _state(runs[0]).state == "succeeded"
    # the study's record: what was lost where, and an honest end
    alloc = json.loads((study / "allocation.json").read_text())
    assert [c["state"] for c in alloc["configurations"]] == ["succeeded", "failed",
                                                             "succeeded"]
    (lost,) = alloc["lost_nodes"]
    assert lost["node"] == node and lost["run"] == runs[1].name and lost["released"], lost
    assert alloc["configurations"][2]["nodes"] == nodes3
    assert alloc["state"] == "failed" and alloc["summary"]["succeeded"] == 2
    # an engine of the lost node that was idle (prefill-1) is dropped with the node, and one
    # the third configuration's new places need (prefill-2's GPUs) is stopped first
    stops = {}
    for e in alloc["engines"]:
        if e["event"] == "stopped":
            stops.setdefault(e["endpoint"], e["why"])  # the first
    assert f"its node {node} was lost" in stops["prefill-1"], alloc["engines"]
    assert "GPUs" in stops["prefill-2"], alloc["engines"]
    # nothing left: no process of any configuration, no step, the job gone
    assert all(leftovers(r) == [] for r in runs), [leftovers(r) for r in runs]
    assert steps_left(job) == []
    code, said = launcher(tmp_path, "status", str(study))
    assert code == 0 and f"{node} lost" in said, said
    print(f"\nnode {node} lost in {runs[1].name}; the study ended {took:.0f} s later")


# --- without the dev cluster: the pieces the study leans on ----------------------------------


def _engine(name: str, endpoint: str, node: str, gpus: list[int]):
    from launcher.run.plandoc import Process
    from launcher.run.vocab import Kind, Role

    return Process(name=name, kind=Kind.ENGINE, node=node, argv=["serve"], env={},
                   log=f"logs/{name}.log", endpoint=endpoint, role=Role.PREFILL, gpus=gpus)


def test_the_pool_drops_a_lost_nodes_engines_and_one_whose_gpus_a_moved_plan_takes(tmp_path):
    """After a node loss the next configuration is planned on the nodes left, so its engines
    can land on GPUs an idle engine holds (prefill-2 on n4 GPUs 0-1): that one is stopped
    first. The engines of the lost node leave the pool without waiting on their steps."""
    from launcher.control.backends import Backend, Handle
    from launcher.control.pool import EnginePool
    from launcher.planning.study import signatures

    backend, pool = Backend(None, tmp_path), EnginePool()
    placed = {"prefill-1": _engine("prefill-1@n3", "prefill-1", "n3", [2, 3]),
              "prefill-2": _engine("prefill-2@n4", "prefill-2", "n4", [0, 1]),
              "prefill-3": _engine("prefill-3@n4", "prefill-3", "n4", [2, 3])}
    handles = {}
    for ep, p in placed.items():
        handles[ep] = Handle(p, backend.spawn(["sleep", "60"], tmp_path / p.log),
                             tmp_path / p.log)
        pool.add(ep, [handles[ep]], signatures([p], str(tmp_path))[ep], "c1", backend)
    pool.lose({"n3"}, "c2")
    assert "prefill-1" not in pool.loaded and handles["prefill-1"].exit_code() is not None
    moved = signatures([_engine("prefill-0@n4", "prefill-0", "n4", [0, 1])], str(tmp_path))
    assert pool.settle(moved, "c3") == set()
    assert set(pool.loaded) == {"prefill-3"}  # on n4 too, on other GPUs: left loaded
    assert handles["prefill-2"].exit_code() is not None
    why = {e["endpoint"]: e["why"] for e in pool.events if e["event"] == "stopped"}
    assert why == {"prefill-1": "its node n3 was lost",
                   "prefill-2": "this configuration's engines take its GPUs (n4 GPU 0, "
                                "n4 GPU 1)"}, why
    pool.stop_all("end", "the test's end")


FAKE_SCONTROL = """#!/bin/bash
echo "$*" >> "$FAKE_LOG"
case "$1" in
  show) tr , '\\n' <<<"$3" ;;
  update) [ -n "$FAKE_REFUSE" ] && { echo "$FAKE_REFUSE" >&2; exit 1; }
          printf 'export SLURM_NODELIST="n1,n2"\\nexport SLURM_JOB_NODELIST="n1,n2"\\n' \\
            > "slurm_job_${SLURM_JOB_ID}_resize.sh"
          printf 'export SLURM_NNODES=2\\nunset SLURM_NTASKS\\n' >> "slurm_job_${SLURM_JOB_ID}_resize.sh" ;;
esac
"""


def test_a_lost_node_is_taken_out_of_the_job_and_the_job_environment_follows(
        tmp_path, monkeypatch):
    """`scontrol update JobId NodeList=<the others>`, then the SLURM_* node variables that
    Slurm's resize script gives; a refusal is one sentence with Slurm's words."""
    from launcher.control import allocation

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls"))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1,n2,n3")
    monkeypatch.setenv("SLURM_NODELIST", "n1,n2,n3")
    monkeypatch.setenv("SLURM_NNODES", "3")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    monkeypatch.setenv("FAKE_REFUSE", "Requested operation not supported on this system")
    said = allocation.release(["n3"])
    assert said == ("scontrol update JobId=7 NodeList=...: Requested operation not supported "
                    "on this system"), said
    assert allocation.allocation_nodes() == ["n1", "n2", "n3"]
    monkeypatch.delenv("FAKE_REFUSE")
    assert allocation.release(["n3"]) is None
    assert "update JobId=7 NodeList=n1,n2" in (tmp_path / "calls").read_text()
    assert allocation.allocation_nodes() == ["n1", "n2"]
    env = __import__("os").environ
    assert env["SLURM_NNODES"] == "2" and "SLURM_NTASKS" not in env


def test_a_configuration_the_nodes_left_cannot_hold_is_not_run_with_the_reason(
        tmp_path, monkeypatch):
    """The study's own bookkeeping (the orchestrator replaced): two nodes lost in the second
    of three configurations leave two, the third needs three: it is recorded as not run,
    saying so, and the study ends failed with the lost nodes in allocation.json."""
    import os
    import signal

    from launcher.control import allocation, prepare, study
    from launcher.control.watch import NodeWatch
    from launcher.run.rundir import RunRecord
    from launcher.run.vocab import State

    # run_study takes these signals (and ignores two at its end): given back after
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    runs = prepare.prepare_all("local-sim", ["accuracy.enabled=false"],
                               ["prefill.endpoints=1,2,3"], tmp_path / "runs",
                               allocation="one")
    study_dir = runs[0].shared.path
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "local-1,local-2,local-3,local-4")
    monkeypatch.setattr(allocation, "allocation_nodes",
                        lambda: os.environ["SLURM_JOB_NODELIST"].split(","))
    monkeypatch.setattr(NodeWatch, "confirm", lambda self, nodes=None: {})

    def release(lost):
        left = [n for n in allocation.allocation_nodes() if n not in lost]
        os.environ["SLURM_JOB_NODELIST"] = ",".join(left)

    monkeypatch.setattr(allocation, "release", release)
    seen = []

    def fake_run(run_dir, shared):
        run = rundir.RunDir(run_dir)
        seen.append(run.run_id)
        state, error = State.SUCCEEDED, None
        if len(seen) == 2:
            assert shared.lose({"local-3": "its slurmd does not answer",
                                "local-4": "its slurmd does not answer"}, run.run_id)
            state, error = State.FAILED, "node lost: local-3 (its slurmd does not answer)"
        run.write_record(RunRecord(state=state, error=error, ended=time.time()))
        return 0 if state == State.SUCCEEDED else 1

    monkeypatch.setattr(study, "run", fake_run)
    try:
        assert study.run_study(study_dir) == 1
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    turns = json.loads((study_dir / "study.json").read_text())["allocation"]["turns"]
    assert seen == [t["run"] for t in turns[:2]]  # the third never started
    third = rundir.RunDir(study_dir / turns[2]["run"]).read_record()
    assert third.state == "cancelled" and third.error == (
        f"not run: it needs 3 nodes and the allocation has 2 left (local-1, local-2) after "
        f"losing local-3 in {seen[1]}, local-4 in {seen[1]}"), third.error
    alloc = json.loads((study_dir / "allocation.json").read_text())
    assert [c["state"] for c in alloc["configurations"]] == ["succeeded", "failed",
                                                             "cancelled"]
    assert [(r["node"], r["run"], r["released"]) for r in alloc["lost_nodes"]] == [
        ("local-3", seen[1], True), ("local-4", seen[1], True)]
    assert alloc["state"] == "failed" and alloc["summary"]["succeeded"] == 1
