"""The run-directory contract: one answer to "what state is this run in" from files with one
writer each, one listing of runs and studies, logs read without colour codes."""

from __future__ import annotations

import json
import time

from launcher import text
from launcher.control import runs
from launcher.run import listing, rundir
from launcher.run.rundir import (
    CancelRecord,
    Reconciled,
    RunDir,
    RunRecord,
    Submission,
    concurrency_of,
    create,
    read_json,
    tail,
)  # fmt: skip
from launcher.run.vocab import Stage, State


def test_state_comes_from_the_file_its_writer_owns(tmp_path):
    run = create(tmp_path, "r")
    (run.path / "recipe.yaml").write_text("name: r\n")
    assert run.status().state == State.PLANNED
    run.write_submission(Submission(created=1.0, slurm_job_id="77", submitted=2.0))
    assert run.status().state == State.SUBMITTED and run.status().slurm_job_id == "77"
    run.write_record(RunRecord(state=State.RUNNING, stage=Stage.SWEEP))
    st = run.status()
    assert (st.state, st.stage) == (State.RUNNING, Stage.SWEEP)
    # a dead orchestrator's end, found from outside, wins over its last "running"
    run.write_reconciled(Reconciled(State.FAILED, "gone", time.time(), "slurm"))
    assert run.status().state == State.FAILED and run.status().error == "gone"
    # ... but never over the orchestrator's own final record
    run.write_record(RunRecord(state=State.SUCCEEDED, failed_stage=None))
    assert run.status().state == State.SUCCEEDED


def test_sbatch_refusal_and_cancel_before_start(tmp_path):
    a = create(tmp_path, "a")
    a.write_submission(Submission(created=1.0, error="sbatch refused the job: bad partition"))
    assert a.status().state == State.REFUSED and "bad partition" in a.status().error
    b = create(tmp_path, "b")
    (b.path / "recipe.yaml").write_text("name: b\n")
    assert runs.cancel(b) == 0
    assert b.status().state == State.CANCELLED and b.read_cancel().outcome == "marked"


def test_a_local_orchestrator_that_vanished_is_reconciled_at_once(tmp_path):
    run = create(tmp_path, "r")
    import socket

    run.write_record(RunRecord(state=State.RUNNING, stage=Stage.SWEEP, orchestrator_pid=2**22 - 3,
                               host=socket.gethostname()))  # fmt: skip
    t = time.monotonic()
    st = runs.reconcile(run)
    assert st.state == State.FAILED and "is gone without recording its end" in st.error
    assert run.read_reconciled().source == "pid"
    assert runs.cancel(run) == 0 and time.monotonic() - t < 5  # no 60 s wait


def test_corrupt_files_read_as_missing(tmp_path):
    (tmp_path / "run.json").write_text('{"state": "runn')
    assert read_json(tmp_path / "run.json", "default") == "default"
    assert RunDir(tmp_path).read_record() is None


def test_logs_are_read_without_colour_codes(tmp_path):
    log = tmp_path / "router.log"
    log.write_text("\x1b[2m2026-11-30\x1b[0m \x1b[32m INFO\x1b[0m Starting router\n")
    assert tail(log, 5) == ["2026-11-30  INFO Starting router"]


def test_the_cli_and_the_listing_agree_on_a_study(tmp_path):
    study = create(tmp_path, "s-study").path
    (study / "study.json").write_text(json.dumps({"axes": {"prefill.endpoints": [1, 2]},
                                                  "runs": []}))  # fmt: skip
    for name in ("s_one", "s_two"):
        r = create(study, name)
        (r.path / "recipe.yaml").write_text("name: x\n")
    lone = create(tmp_path, "lone")
    (lone.path / "recipe.yaml").write_text("name: y\n")
    (tmp_path / "prometheus").mkdir()  # not a run
    entries = listing.entries(tmp_path)
    assert [type(e).__name__ for e in entries] == ["RunDir", "Study"] or [
        type(e).__name__ for e in entries] == ["Study", "RunDir"]
    assert len(listing.all_runs(tmp_path)) == 3
    statuses = {str(r.path): r.status() for r in listing.all_runs(tmp_path)}
    out = text.runs_text(entries, statuses, tmp_path)
    assert "(study: 2 runs over prefill.endpoints=1,2)" in out
    assert out.count("planned") == 3


def test_result_file_names_carry_their_point(tmp_path):
    run = RunDir(tmp_path)
    assert run.bench_result(64).name == "c00064.json" and concurrency_of("c00064.json") == 64
    rec = CancelRecord(by="me", ts=1.0)
    run.write_cancel(rec)
    assert run.read_cancel() == rec


def test_the_lifecycle_splits_the_allocation_into_phases_that_add_up(tmp_path):
    from launcher.run import figures

    rd = rundir.RunDir(tmp_path)
    t = 1_800_000_000.0
    stages = [(0, "preflight"), (30, "agents"), (32, "endpoints"), (35, "health"),
              (635, "router"), (640, "sweep"), (1840, "accuracy"), (2140, "teardown"),
              (2170, "report")]
    lines = [{"ts": t, "event": "planned"}]
    lines += [{"ts": t + dt, "event": "stage", "stage": s} for dt, s in stages]
    lines += [{"ts": t + 32.5, "event": "process_started", "process": "decode-0@n1"},
              {"ts": t + 600.5, "event": "ready", "process": "decode-0@n1"},
              {"ts": t + 2175, "event": "succeeded"}]
    rd.events_file.write_text("".join(json.dumps(x) + "\n" for x in lines))
    lc = figures.lifecycle(rd, None, 16)
    phases = {k: v["seconds"] for k, v in lc["phases"].items()}
    assert phases == {"preflight": 30.0, "loading": 610.0, "measuring": 1500.0,
                      "holding": 0.0, "teardown": 35.0}
    assert sum(phases.values()) == lc["seconds"] == 2175.0
    assert lc["gpu_hours"] == round(16 * 2175 / 3600, 4)
    assert lc["engine_ready_s"] == {}  # without a plan no process is known as an engine
    line = figures.lifecycle_line(lc)
    assert line.startswith("16 GPUs for 36.2 min = 9.67 GPU-hours: preflight 30.0 s (1 %), "
                           "loading 10.2 min (28 %), measuring 25.0 min (69 %)"), line
    assert figures.lifecycle(rundir.RunDir(tmp_path / "none"), None, 16) is None
