"""A study in one allocation (issue 24): the plan of which engines each configuration
starts, keeps or restarts; the dry-run's two ways side by side; and, on the local profile
with real processes behind the real router, a failure contained in one configuration and
a signal that ends the study keeping what finished."""

import json
import os
import signal
import subprocess
import sys
import time

import helpers
import yaml
from helpers import launcher, leftovers

from launcher.planning import study
from launcher.run import rundir
from launcher.run.plandoc import Process
from launcher.run.vocab import Kind, Role


def _engine(name, endpoint, node="n1", argv=("serve", "--x", "1"), run_dir="/runs/a"):
    return Process(name=name, kind=Kind.ENGINE, node=node, argv=list(argv),
                   env={"PD_RUN_DIR": run_dir, "SIM_ANSWER_KEY": f"{run_dir}/inputs/t.jsonl"},
                   log=f"logs/{name}.log", endpoint=endpoint, role=Role.DECODE, gpus=[0, 1])


def test_an_engine_is_the_same_across_configurations_whatever_its_run_directory():
    a = study.signatures([_engine("d@n1", "d")], "/runs/a")
    b = study.signatures([_engine("d@n1", "d", run_dir="/runs/b")], "/runs/b")
    c = study.signatures([_engine("d@n1", "d", argv=("serve", "--x", "2"))], "/runs/a")
    assert a == b and a != c


def test_the_order_runs_configurations_that_share_a_changed_engine_together():
    base, big = ("serve",), ("serve", "--max-cudagraph-capture-size", "768")
    configs = [  # the decode's command line alternates in the given order
        ("c1", {"decode": base, "p0": base}),
        ("c2", {"decode": big, "p0": base}),
        ("c3", {"decode": base, "p0": base, "p1": base}),
        ("c4", {"decode": big, "p0": base, "p1": base}),
    ]
    turns = study.schedule(configs)
    # the largest first (one load round), then what restarts nothing, then the two with the
    # other decode together, the larger first
    assert [t.run for t in turns] == ["c3", "c1", "c4", "c2"]
    assert sum(t.loads for t in turns) == 4  # decode, p0, p1, and the decode once more
    assert turns[0].start == ("decode", "p0", "p1")
    assert turns[1].keep == ("decode", "p0") and turns[1].idle == ("p1",)
    assert turns[2].restart == ("decode",) and turns[2].keep == ("p0", "p1")
    assert turns[3].keep == ("decode", "p0") and turns[3].idle == ("p1",)
    naive = [study._turn(r, w, dict(p for c in configs[:i] for p in c[1].items()))
             for i, (r, w) in enumerate(configs)]
    assert sum(t.loads for t in naive) > 4


def test_dry_run_shows_both_ways_and_writes_one_sbatch_for_the_study(tmp_path):
    code, out = launcher(tmp_path, "submit", "devcluster-sim", "--dry-run",
                         "--sweep", "prefill.endpoints=1,2,3", "--allocation", "one")
    assert code == 0, out
    assert "one allocation:  4 nodes x" in out and "<- this submission" in out
    assert "one job each:    3 jobs" in out
    assert "an engine start taken as" in out
    (study_dir,) = (tmp_path / "runs").glob("*-study")
    doc = json.loads((study_dir / "study.json").read_text())
    alloc = doc["allocation"]
    assert alloc["mode"] == "one" and alloc["nodes"] == 4
    # the largest configuration first: every engine loads in one round
    assert [t["start"] for t in alloc["turns"]] == [["decode-0", "prefill-0", "prefill-1",
                                                     "prefill-2"], [], []]
    assert [t["idle"] for t in alloc["turns"]] == [[], ["prefill-1", "prefill-2"],
                                                   ["prefill-2"]]
    sbatch = (study_dir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=4" in sbatch and "#SBATCH --job-name=pd-devcluster-sim-study" in sbatch
    runs = [study_dir / t["run"] for t in alloc["turns"]]
    assert not any((r / "job.sbatch").exists() for r in runs)
    plans = [json.loads((r / "plan.json").read_text()) for r in runs]
    decode = [[p for p in d["processes"] if p["endpoint"] == "decode-0"] for d in plans]
    assert all(d == decode[0] for d in decode[1:]) or all(
        [(p["node"], p["gpus"]) for p in d] == [(p["node"], p["gpus"]) for p in decode[0]]
        for d in decode)
    code, out = launcher(tmp_path, "submit", "devcluster-sim", "--dry-run",
                         "--sweep", "prefill.endpoints=1,2", "--allocation", "each")
    assert code == 0, out
    assert "one job each:    2 jobs" in out and out.count("<- this submission") == 1
    assert "As 2 jobs:" in out


def test_allocation_without_a_sweep_is_refused(tmp_path):
    code, out = launcher(tmp_path, "submit", "local-sim", "--dry-run", "--allocation", "one")
    assert code == 2 and "--allocation one is for a study: add --sweep" in out, out


def _wait(pred, timeout, what, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the study ended first:\n{proc.stdout.read()[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s")


def _turn_record(study_dir, i):
    alloc = json.loads((study_dir / "study.json").read_text())["allocation"]
    run = rundir.RunDir(study_dir / alloc["turns"][i]["run"])
    return run, run.read_record()


def _local_recipes(tmp_path, multipliers: dict[int, int]) -> list[str]:
    """local-sim with 1..4 prefill endpoints, each a recipe file of its own whose benchmark
    sends `multipliers[n]` x the concurrency in prompts."""
    return helpers.recipe_per_prefill_count(
        tmp_path, "local-sim",
        {n: {"benchmark": {"prompts_multiplier": m}} for n, m in multipliers.items()})


def test_a_dead_engine_fails_its_configuration_only_and_a_signal_keeps_what_finished(tmp_path):
    """Four configurations (1..4 prefill endpoints) in one local allocation, run as 4, 1, 2,
    3 (the largest loads every engine first). A kept prefill engine is killed during the
    second: it fails naming it, the third starts that engine again and succeeds. SIGTERM
    during the fourth ends the study: the first and third keep their results, the fourth is
    cancelled, nothing is left running."""
    # one recipe file per configuration: the two interrupted in their sweep (1 and 3 prefill
    # endpoints) send 3x the prompts, a window for the kill and the cancel; the two that
    # finish theirs, 1x
    recipes = _local_recipes(tmp_path, multipliers={1: 3, 2: 1, 3: 3, 4: 1})
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "submit", *recipes, "--runs-dir",
         str(tmp_path / "runs"), "--allocation", "one",
         "--set", "accuracy.enabled=false", "--set", "benchmark.concurrency=[4,16]",
         "--set", "sim.start_delay_s=2"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        study_dir = _wait(lambda: next((tmp_path / "runs").glob("*-study"), None), 60, "study",
                          proc)
        _wait(lambda: (study_dir / "study.json").is_file(), 60, "study.json", proc)

        def in_sweep(i):
            _, rec = _turn_record(study_dir, i)
            return rec if rec and rec.stage == "sweep" else None

        rec = _wait(lambda: in_sweep(1), 240, "configuration 2's sweep", proc)
        victim = rec.processes["prefill-0@local-3"]
        assert victim.started_by, "prefill-0 is kept from configuration 1"
        os.killpg(victim.pid, signal.SIGKILL)
        _wait(lambda: in_sweep(3), 240, "configuration 4's sweep", proc)
        # as scancel does to the batch step: the study's process gets SIGTERM
        code, said = launcher(tmp_path, "cancel", str(study_dir))
        assert code == 0 and "sent SIGTERM to its allocation's process" in said, said
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out[-3000:]
    assert [yaml.safe_load((_turn_record(study_dir, i)[0].path / "recipe.yaml").read_text())
            ["benchmark"]["prompts_multiplier"] for i in range(4)] == [1, 3, 1, 3]
    states = []
    for i in range(4):
        run, rec = _turn_record(study_dir, i)
        states.append(rec.state)
        assert leftovers(run.path) == [], run.path
    assert states == ["succeeded", "failed", "succeeded", "cancelled"], out[-3000:]
    run2, rec2 = _turn_record(study_dir, 1)
    assert rec2.culprit == "prefill-0@local-3" and "prefill-0@local-3" in rec2.error
    run3, rec3 = _turn_record(study_dir, 2)
    first = _turn_record(study_dir, 0)[0].run_id
    assert rec3.processes["prefill-0@local-3"].started_by is None  # started again there
    assert rec3.processes["prefill-1@local-3"].started_by == first
    assert rec3.processes["decode-0@local-1"].started_by == first
    summary3 = json.loads(run3.summary.read_text())
    assert summary3["verdict"] == "passed" and len(summary3["points"]) == 2
    # every engine start is a process record without started_by: decode once, prefill-0
    # twice (its death), every other prefill once
    starts: dict[str, int] = {}
    for i in range(4):
        for name, p in _turn_record(study_dir, i)[1].processes.items():
            if p.kind == Kind.ENGINE and p.started_by is None:
                starts[name] = starts.get(name, 0) + 1
    assert starts == {"decode-0@local-1": 1, "decode-0@local-2": 1, "prefill-0@local-3": 2,
                      "prefill-1@local-3": 1, "prefill-2@local-4": 1,
                      "prefill-3@local-4": 1}, starts
    alloc = json.loads((study_dir / "allocation.json").read_text())
    assert alloc["state"] == "cancelled"
    assert [c["state"] for c in alloc["configurations"]] == states
    assert alloc["summary"]["engine_starts"] == 6  # endpoints: decode, p0 twice, p1..p3
    assert alloc["configurations"][0]["turn"]["start"] == ["decode-0", "prefill-0",
                                                           "prefill-1", "prefill-2",
                                                           "prefill-3"]
    assert alloc["summary"]["succeeded"] == 2
    # a kept engine's log is read from where it stood when the configuration began
    kept = rec3.processes["decode-0@local-1"]
    assert 0 < kept.log_bytes_at_start <= kept.log_bytes_at_stop
    assert (run3.path / "logs" / "decode-0@local-1.log").is_symlink()


def test_launcher_run_takes_a_study_and_a_configuration_cancelled_before_its_turn_is_skipped(
        tmp_path):
    """`launcher run STUDY_DIR` (inside an allocation one already holds): a configuration
    cancelled alone is skipped at its turn and the allocation goes on."""
    from launcher.control import prepare

    runs = prepare.prepare_all(
        "local-sim", ["accuracy.enabled=false", "benchmark.concurrency=[4]",
                      "benchmark.prompts_multiplier=2"],
        ["prefill.endpoints=1,2"], tmp_path / "runs", allocation="one")
    study_dir = runs[0].shared.path
    first, second = (rundir.RunDir(study_dir / t.run) for t in runs[0].shared.turns)
    code, said = launcher(tmp_path, "cancel", str(second.path))
    assert code == 0 and "skips it when its turn comes" in said, said
    run = [sys.executable, "-m", "launcher", "run", str(study_dir)]
    p = subprocess.run(run, capture_output=True, text=True, timeout=200, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]  # not every configuration succeeded
    assert first.read_record().state == "succeeded", first.read_record().error
    rec = second.read_record()
    assert rec.state == "cancelled" and "cancelled by `launcher cancel` before its turn" in (
        rec.error), rec.error
    alloc = json.loads((study_dir / "allocation.json").read_text())
    assert [c["state"] for c in alloc["configurations"]] == ["succeeded", "cancelled"]
    # after it (issue 41, item 9): status shows the study, nothing kept loaded, what next
    code, said = launcher(tmp_path, "status", "--runs-dir", str(tmp_path / "runs"))
    assert code == 0 and f"{study_dir.name}/  (study: 2 runs" in said, said
    assert said.splitlines()[-1].startswith(f"next: python -m launcher report {study_dir}")
    assert first.read_record().processes["decode-0@local-1"].kept, "it was left for the next"
    code, said = launcher(tmp_path, "status", str(first.path))
    assert code == 0 and "kept loaded" not in said and "at the end of its study's" in said, said
    p = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 2 and "already holds an attempt (allocation.json)" in p.stderr, (
        p.stdout + p.stderr)


def test_the_load_time_assumed_is_measured_by_earlier_runs_of_the_model_there(tmp_path):
    """The dry-run's engine start: the median of the slowest engine's start-to-healthy time
    in earlier runs of the same model on the same profile (others are not counted)."""
    from launcher.control import prepare

    runs_root = tmp_path / "runs"
    for i, (model, cluster, slowest) in enumerate([
            ("sim/Qwen3.5-toy", "local", 30.0), ("sim/Qwen3.5-toy", "local", 50.0),
            ("sim/Qwen3.5-toy", "local", 70.0), ("other/model", "local", 999.0),
            ("sim/Qwen3.5-toy", "devcluster", 999.0)]):
        run = runs_root / f"20260101-00000{i}-earlier"
        run.mkdir(parents=True)
        (run / "recipe.yaml").write_text(f"name: x\ncluster: {cluster}\nmodel:\n  path: {model}\n")
        (run / "summary.json").write_text(json.dumps({"lifecycle": {"engine_ready_s": {
            "decode-0@local-1": slowest, "prefill-0@local-3": slowest / 2}}}))
        (run / "plan.json").write_text("{}")
    got = prepare.prepare_all("local-sim", ["accuracy.enabled=false"],
                              ["prefill.endpoints=1,2"], runs_root)
    cmp = got[0].compared
    assert cmp.load_s == 50.0, cmp
    assert cmp.load_basis == "measured: the median of 3 earlier run(s) of sim/Qwen3.5-toy on local"


def test_a_damaged_plan_of_turns_is_one_sentence(tmp_path):
    from launcher.control import prepare

    runs = prepare.prepare_all("local-sim", [], ["prefill.endpoints=1,2"], tmp_path / "runs",
                               allocation="one")
    study_dir = runs[0].shared.path
    doc = json.loads((study_dir / "study.json").read_text())
    doc["allocation"]["turns"] = [{"start": ["decode-0"]}]  # no run
    (study_dir / "study.json").write_text(json.dumps(doc))
    p = subprocess.run([sys.executable, "-m", "launcher", "run", str(study_dir)],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 2 and (f"{study_dir.name}/study.json is damaged "
                                  "(allocation.turns[0].run is missing)") in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (study_dir / "allocation.json").exists()


def test_a_configuration_the_study_ends_between_its_visits_is_cancelled_with_its_points(
        tmp_path, monkeypatch):
    """A configuration begun in an earlier visit (running, between visits) and not reached
    again: cancelled, saying its earlier visits' points are kept, and summarised with them;
    one never begun: `not run`."""
    from launcher.control import study as control_study
    from launcher.run.rundir import RunRecord
    from launcher.run.vocab import State

    begun = rundir.RunDir(tmp_path / "begun")
    begun.path.mkdir()
    begun.write_record(RunRecord(state=State.RUNNING, started=time.time() - 5))
    begun.event("visit_end", points=[4])
    fresh = rundir.RunDir(tmp_path / "fresh")
    fresh.path.mkdir()
    seen = {}  # the events there when the final state is written (docs/contracts.md)

    def spy(rd, rec, write=rundir.RunDir.write_record):
        if State(rec.state).final:
            seen[rd.path.name] = [e["event"] for e in rd.events()]
        write(rd, rec)

    monkeypatch.setattr(rundir.RunDir, "write_record", spy)
    for rd in (begun, fresh):
        control_study._not_run(rd, "the study ended before its turn (SIGTERM)")
    assert seen == {"begun": ["visit_end", "cancelled"], "fresh": ["cancelled"]}, seen
    rec = begun.read_record()
    assert rec.state == State.CANCELLED and rec.started is not None
    assert rec.error == ("cancelled before its later visits: the study ended before its turn "
                         "(SIGTERM); the points measured in its earlier visits are kept")
    assert json.loads(begun.summary.read_text())["state"] == "cancelled"
    assert fresh.read_record().error == "not run: the study ended before its turn (SIGTERM)"
