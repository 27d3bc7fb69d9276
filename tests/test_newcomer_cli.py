"""Issue 28, items 7, 9b, 11 and 12: commands that do what the README says, one damaged file
that costs only itself, output into a closed pipe, `logs -f` that ends with its run, and
errors in the launcher's own words with the name that was probably meant."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import select
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest
from helpers import plan_doc, profile_copy

from launcher import cli as cli_mod
from launcher.run import figures, results
from launcher.run.rundir import (
    CancelRecord,
    ProcessRecord,
    Reconciled,
    RunDir,
    RunRecord,
    Submission,
    write_json,
)
from launcher.run.vocab import Kind, Stage, State

REPO = Path(__file__).resolve().parents[1]
PROC = "decode-0@n1"
T0 = 1_764_400_000.0


def one_error_line(rc: int, out: str, err: str) -> str:
    """A refusal as the CLI must give it: exit 2, nothing on stdout, one line 'error: ...'."""
    assert rc == 2, (rc, out, err)
    assert out == "" and "Traceback" not in err, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# --- 7: prometheus-config ------------------------------------------------------------------


def test_prometheus_config_takes_what_the_readme_documents(cli, tmp_path):
    rc, out, err = cli("prometheus-config", "--help")
    assert rc == 0 and "--cluster" in out and "unrecognized" not in err, (out, err)
    # the shipped GB200 profile names no shared folder: said in one line, not "unrecognized"
    line = one_error_line(*cli("prometheus-config", "--cluster", "gb200-nvl72"))
    assert "prometheus_sd_dir" in line and "unrecognized" not in line
    line = one_error_line(*cli("prometheus-config", "/nonexistent"))
    assert "/nonexistent does not exist" in line
    (tmp_path / "a-file").write_text("x")
    one_error_line(*cli("prometheus-config", str(tmp_path / "a-file")))
    one_error_line(*cli("prometheus-config"))  # ./runs does not exist in tmp_path either
    # every invocation the README and docs/prometheus.md show, on real paths, works
    runs = tmp_path / "lustre-runs"
    runs.mkdir()
    sd = tmp_path / "shared-sd"
    profile = profile_copy(tmp_path / "your-profile.yaml", "gb200-nvl72",
                           prometheus_sd_dir=str(sd))
    shown = []
    for doc in (REPO / "README.md", REPO / "docs" / "prometheus.md"):
        shown += re.findall(r"python -m launcher (prometheus-config [^\n`]*)", doc.read_text())
    assert len(shown) >= 3, shown
    for line in shown:
        words = line.split("#")[0].split()
        words = [str(runs) if w.startswith("/lustre") else profile if w.endswith(
            "profile.yaml") else w for w in words]
        if "RUNS_DIR" in words:
            words[words.index("RUNS_DIR")] = str(runs)
        rc, out, err = cli(*words)
        assert rc == 0 and "scrape_configs:" in out, (line, err)
        want = f"{sd}/*.json" if "--cluster" in words else f"{runs}/prometheus/*.json"
        assert json.dumps(want) in out, (line, out)
    one_error_line(*cli("prometheus-config", str(runs), "--cluster", profile))


# --- 9b: a record file of the right JSON but the wrong types ---------------------------------


def _bench_result() -> dict:
    return {
        "date": "20251129-070704", "num_prompts": 320, "max_concurrency": 64,
        "duration": 100.0, "completed": 320, "failed": 0, "total_input_tokens": 320 * 8192,
        "total_output_tokens": 320 * 1024, "driver": "builtin", "status": "ok",
        "failure_reason": None, "window_start": T0 + 10, "window_end": T0 + 110,
        "errors": [""] * 2, "ttfts": [0.3, 0.4], "latencies": [20.0, 21.0],
        "output_lens": [1024, 1024],
        **{f"{q}_{m}_ms": 20.0 for m in ("ttft", "tpot", "itl", "e2el")
           for q in ("mean", "median", "p50", "p90", "p99")},
    }  # fmt: skip


def _accuracy() -> dict:
    return {"task": "gsm8k", "harness": "lm-eval", "accuracy": 0.9, "threshold": 0.88,
            "passed": True, "metric": "strict-match",
            "scores": {"strict-match": {"accuracy": 0.9}}, "num_questions": 10,
            "num_shots": 5, "chat": False, "invalid_rate": 0.0, "status": "ok",
            "failure_reason": None, "repeat": 1, "spread": {},
            "comparable_with_lm_eval": True, "timestamp": T0 + 200}  # fmt: skip


@functools.cache
def _plan_json() -> dict:
    return plan_doc(prefill=1, decode_dp=4).to_json()


def write_run(root: Path, name: str, *, summary: bool = True) -> RunDir:
    """A finished run with every record file, each field set (so each can be damaged)."""
    rd = RunDir(root / name)
    rd.path.mkdir(parents=True)
    write_json(rd.plan, {**_plan_json(), "run_id": name})
    proc = ProcessRecord(node="n1", kind=Kind.ENGINE, pid=4321, started=T0, exit_code=0,
                         stopped=True, log=f"logs/{PROC}.log", lost=False)
    rd.write_record(RunRecord(
        state=State.SUCCEEDED, stage=Stage.REPORT, started=T0, ended=T0 + 300, host="login",
        orchestrator_pid=1234, slurm_job_id="77", error="no error", culprit=PROC,
        failed_stage=Stage.SWEEP, serving=False, router_url="http://n1:8000",
        processes={PROC: proc}, progress={"sweep": {}}, accuracy=0.9, accuracy_passed=True,
        notes=["a note"], identity={"vllm": "0.33.0"},
    ))  # fmt: skip
    rd.write_submission(Submission(created=T0 - 60, study=None, by="me", slurm_job_id="77",
                                   submitted=T0 - 50, error=None))
    rd.write_cancel(CancelRecord(by="me@login", ts=T0 + 299, outcome="scancel"))
    rd.write_reconciled(Reconciled(State.CANCELLED, "cancelled", T0 + 301, "slurm"))
    write_json(rd.bench_result(64), _bench_result())
    write_json(rd.accuracy_result(), _accuracy())
    rd.logs.mkdir()
    rd.log(PROC).write_text("".join(f"line {i}\n" for i in range(50)))
    if summary:
        figures.write_summary(rd.path)
    return rd


def _wrong(type_text: str):
    """A JSON value that is not of the annotation `type_text`."""
    first = type_text.split(" | ")[0]
    if first.startswith("dict"):
        return ["not", "a", "mapping"]
    if first.startswith("list"):
        return {"not": "a list"}
    return {"str": 5, "int": "5", "float": "fast", "real": "fast", "bool": "yes"}.get(first, 5)


def damage_cases() -> list[tuple[str, tuple, object]]:
    """(file, key path, wrong value): every field of every record file, a wrong type each."""
    out = [("run.json", (), [1, 2])]
    for f in fields(RunRecord):
        out.append(("run.json", (f.name,), _wrong(str(f.type))))
        if "None" not in str(f.type):
            out.append(("run.json", (f.name,), None))
    for f in fields(ProcessRecord):
        out.append(("run.json", ("processes", PROC, f.name), _wrong(str(f.type))))
    for file, cls in (("submission.json", Submission), ("cancel.json", CancelRecord),
                      ("reconciled.json", Reconciled)):
        out.append((file, (), "text"))
        out += [(file, (f.name,), _wrong(str(f.type))) for f in fields(cls)]
    out += [("summary.json", (k,), _wrong(t)) for k, t in figures.SUMMARY_TYPES.items()]
    out += [("summary.json", ("points", 0, k), _wrong(t)) for k, t in figures.POINT_TYPES.items()]
    out += [("bench/c00064.json", (k,), _wrong(t)) for k, t in results.RESULT_TYPES.items()]
    out += [("accuracy/gsm8k.json", (k,), _wrong(t)) for k, t in figures.ACCURACY_TYPES.items()]
    out += [("plan.json", (k,), {"a": 1}) for k in ("run_id", "recipe", "cluster", "engine",
                                                    "mode", "engine_platform")]
    out += [("plan.json", ("capacity",), "x"), ("plan.json", ("model", "path"), 5)]
    return out


def _damage(rd: RunDir, file: str, path: tuple, value) -> None:
    target = rd.path / file
    doc = json.loads(target.read_text())
    if not path:
        doc = value
    else:
        node = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    target.write_text(json.dumps(doc))
    if file.startswith(("bench/", "accuracy/")):
        rd.summary.unlink()  # else the report shows the summary, not these files


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_mod.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_a_wrong_type_in_run_json_is_named_not_a_traceback(cli, tmp_path):
    # the held-out case: valid JSON, "state": 5
    runs = tmp_path / "runs"
    bad = write_run(runs, "20251129-000001-bad")
    write_run(runs, "20251129-000002-good")
    doc = json.loads(bad.state_file.read_text())
    doc["state"] = 5
    bad.state_file.write_text(json.dumps(doc))
    for args in (("status", bad.run_id), ("runs",), ("report", bad.run_id)):
        rc, out, err = cli(*args, "--runs-dir", str(runs))
        assert rc == 0 and "Traceback" not in err and "is not a valid State" not in err, err
        if args[0] == "report":
            out = Path(out.strip()).read_text()
        assert "run.json is damaged (state is 5" in out, out
    rc, out, _ = cli("runs", "--runs-dir", str(runs))
    good = next(x for x in out.splitlines() if "-good" in x)
    assert "succeeded" in good and "damaged" not in good  # the other run still lists as it is
    # nothing was written over the damaged record's run (no reconciled end from it)
    assert json.loads(bad.state_file.read_text())["state"] == 5
    # the dashboard reads the same status: the run's notes name the file, nothing raises
    from launcher.analysis import load

    assert any("run.json is damaged (state is 5" in n for n in load.run_info(bad.path).notes)
    assert len(load.list_run_dirs(runs)) == 2


def test_every_record_file_with_a_wrong_type_costs_only_itself(tmp_path, capsys):
    runs = tmp_path / "runs"
    good = write_run(runs, "20251128-000000-good")
    cases = damage_cases()
    damaged = {}
    for i, (file, path, value) in enumerate(cases):
        rd = write_run(runs, f"20251129-{i:06d}-case")
        _damage(rd, file, path, value)
        damaged[rd.run_id] = (file, path, value)
    # one listing shows every run, each damaged one naming its file, the good one as it is
    rc, out, err = _main("runs", "--runs-dir", str(runs))
    assert rc == 0 and err == "", err
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {*damaged, good.run_id}
    assert "succeeded" in rows[good.run_id] and "damaged" not in rows[good.run_id]
    for run_id, (file, path, value) in damaged.items():
        case = f"{file} {'.'.join(map(str, path))}={value!r}"
        shows = file in ("run.json", "submission.json", "cancel.json", "reconciled.json",
                         "plan.json")
        if shows:
            assert file in rows[run_id], (case, rows[run_id])
        rc, out, err = _main("status", run_id, "--runs-dir", str(runs))
        assert rc == 0 and err == "", (case, err)
        if shows:
            assert file in out and ("damaged" in out or "malformed" in out), (case, out)
        rc, out, err = _main("report", run_id, "--runs-dir", str(runs))
        assert rc == 0 and err == "", (case, err)
        page = Path(out.strip()).read_text()
        assert file in page and ("damaged" in page or "malformed" in page), case


def test_event_lines_of_the_wrong_types_are_shown_as_far_as_they_go():
    from launcher import text

    for row in ({"ts": "x", "event": 5}, {"ts": 1e300}, {"ts": float("nan"), "stage": [1]},
                {"ts": True}, {}):
        assert text.event_line(row).startswith("[")


def test_a_damaged_study_json_keeps_its_runs(tmp_path):
    runs = tmp_path / "runs"
    study = runs / "20251129-000000-s-study"
    for i in (1, 2):
        write_run(study, f"20251129-00000{i}-s_p{i}")
    for doc in ({"axes": {"prefill.endpoints": 5}}, {"runs": 5}, {"runs": [{"run": []}]},
                {"recipe": ["x"]}, ["not", "an", "object"]):
        (study / "study.json").write_text(json.dumps(doc))
        rc, out, err = _main("runs", "--runs-dir", str(runs))
        assert rc == 0 and "study.json is damaged" in out and out.count("_p") == 2, (doc, out)
        rc, out, err = _main("report", str(study), "--runs-dir", str(runs))
        assert rc == 0 and "study.json is damaged" in Path(out.strip()).read_text(), doc


# --- 11: a closed pipe, and logs -f --------------------------------------------------------


def _into_closed_pipe(args: list[str], cwd: Path, read_first: bool = False) -> tuple[int, str]:
    p = subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if read_first:
        p.stdout.readline()  # `| head -1`
    p.stdout.close()  # the reader is gone before (or while) the command writes
    err = p.stderr.read().decode()
    return p.wait(timeout=60), err


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    runs = tmp_path / "runs"
    rd = write_run(runs, "20251129-000000-pipe")
    rd.log(PROC).write_text("".join(f"line {i} {'x' * 80}\n" for i in range(20000)))
    r = ["--runs-dir", str(runs)]
    commands = [["status", rd.run_id, *r], ["runs", *r], ["logs", rd.run_id, *r],
                ["logs", rd.run_id, PROC, "-n", "20000", *r], ["recipes"],
                ["report", rd.run_id, *r], ["prometheus-config", str(runs)],
                ["submit", "local-sim", "--dry-run", *r], ["--help"]]
    for args in commands:
        for read_first in (False, True):
            rc, err = _into_closed_pipe(args, tmp_path, read_first)
            assert "Traceback" not in err and "BrokenPipe" not in err, (args, err)
            assert rc == 0, (args, rc, err)


def test_logs_follow_returns_when_the_run_has_ended(cli, tmp_path):
    runs = tmp_path / "runs"
    rd = write_run(runs, "20251129-000000-done")
    t = time.monotonic()
    rc, out, err = cli("logs", rd.run_id, PROC, "-f", "-n", "5", "--runs-dir", str(runs),
                       timeout=30)
    assert rc == 0 and out.splitlines() == [f"line {i}" for i in range(45, 50)], (out, err)
    assert time.monotonic() - t < 20 and "succeeded" in err


def test_logs_follow_prints_everything_up_to_the_end_of_a_live_run(tmp_path):
    runs = tmp_path / "runs"
    rd = RunDir(runs / "20251129-000000-live")
    rd.path.mkdir(parents=True)
    rec = RunRecord(state=State.RUNNING, stage=Stage.SWEEP, started=time.time())
    rd.write_record(rec)  # no pid, no job: nothing to reconcile, it is running
    rd.logs.mkdir()
    rd.log(PROC).write_text("first\n")
    p = subprocess.Popen([sys.executable, "-m", "launcher", "logs", rd.run_id, PROC, "-f",
                          "--runs-dir", str(runs)], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    def line() -> str:  # a follower that stops printing fails the test, not the suite
        ready, _, _ = select.select([p.stdout], [], [], 30)
        assert ready, "logs -f printed nothing for 30 s"
        return p.stdout.readline()

    try:
        assert line() == "first\n"
        with open(rd.log(PROC), "a") as f:
            f.write("second\n")
        assert line() == "second\n"
        with open(rd.log(PROC), "a") as f:
            f.write("last words\n")
        rec.state, rec.ended = State.FAILED, time.time()
        rd.write_record(rec)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill() if p.poll() is None else None
    assert p.returncode == 0 and out == "last words\n", (out, err)


def test_the_tail_leaves_the_log_where_the_follow_goes_on(tmp_path):
    """What is appended between printing the tail and following is printed too (it was
    skipped when the follower sought to the end after the tail); a line still being
    written is printed whole by the follower, not in two pieces."""
    from launcher.run.rundir import tail_of

    log = tmp_path / "x.log"
    log.write_bytes(b"a\nb\npart")
    with open(log, "rb") as f:
        assert tail_of(f, 5, whole=True) == ["a", "b"]
        with open(log, "ab") as g:
            g.write(b"ial\nnext\n")
        assert f.read() == b"partial\nnext\n"
    with open(log, "rb") as f:
        assert tail_of(f, 2) == ["partial", "next"]


# --- 12: the name probably meant, the real bound, the accepted form --------------------------


SEED = "qwen3.5-397b-gb200-disagg"


def _refused(cli, tmp_path, *args) -> str:
    line = one_error_line(*cli("submit", *args, "--dry-run", "--runs-dir",
                               str(tmp_path / "runs")))
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    for leak in ("Input should", "String should", "validation error", "type=", "pydantic",
                 "should match pattern", "^["):
        assert leak not in line, line
    return line


def test_misspelled_names_and_keys_get_a_suggestion(cli, tmp_path):
    assert "did you mean 'qwen3.5-397b-gb200-disagg'?" in _refused(
        cli, tmp_path, "qwen3.5-397b-gb200-dissagg")
    assert "did you mean 'local-sim'?" in _refused(cli, tmp_path, "local-simm")
    for override, meant in [("prefil.endpoints=4", "prefill"),
                            ("prefill.endpointz=4", "endpoints"),
                            ("slurm.time_limt=10", "time_limit"),
                            ("model.facts.weightbits=4", "weight_bits"),
                            ("mode=dissagg", "disagg"), ("engine=vlm", "vllm"),
                            ("cluster=gb200-nvl27", "gb200-nvl72")]:
        line = _refused(cli, tmp_path, SEED, "--set", override)
        assert f"did you mean '{meant}'?" in line, (override, line)
    line = _refused(cli, tmp_path, "local-sim", "--set", "sim.speeed=2")
    assert "did you mean 'speed'?" in line
    profile = profile_copy(tmp_path / "p.json", "local", port_bsae=9000)
    line = _refused(cli, tmp_path, "local-sim", "--set", f"cluster={profile}")
    assert "unknown key 'port_bsae'; did you mean 'port_base'?" in line


def test_an_empty_sweep_value_is_refused(cli, tmp_path):
    for spec in ("prefill.endpoints=4,,6", "prefill.endpoints=4,6,", "prefill.endpoints=,4"):
        line = _refused(cli, tmp_path, SEED, "--sweep", spec)
        assert "is empty" in line and spec in line, line


def test_a_bound_message_states_the_real_bound(cli, tmp_path):
    line = _refused(cli, tmp_path, SEED, "--set", "prefill.endpoints=-1")
    assert "prefill.endpoints: must be 1 or more with mode disagg" in line, line
    assert ">= 0" not in line and "0 or more" not in line
    assert ">= 1" in _refused(cli, tmp_path, SEED, "--set", "prefill.endpoints=0")
    line = _refused(cli, tmp_path, SEED, "--set", "agg.endpoints=-1")
    assert "agg.endpoints: must be 0 with mode disagg" in line, line
    line = _refused(cli, tmp_path, "qwen3.5-397b-gb200-agg", "--set", "decode.endpoints=-2")
    assert "decode.endpoints: must be 0 with mode agg" in line, line
    line = _refused(cli, tmp_path, SEED, "--set", "prefill.endpoints=100000")
    assert "must be 512 or less" in line, line


@pytest.mark.parametrize("override, words", [
    ("benchmark.concurrency=64,128", "must be a list, written [64,128]"),
    ("benchmark.concurrency=64", "must be a list, written [64]"),
    ("benchmark.concurrency=[]", "must hold at least 1 value"),
    ("slurm.partition=a b", "must be a Slurm name"),
    ("name=a b", "must be letters, digits"),
    ("engine_version=v1", "must be a version such as 0.33"),
    ("name=12", "must be text: quote it"),
    ("prefill.endpoints=1.5", "must be a whole number"),
    ("accuracy.enabled=maybe", "must be true or false"),
    ("model.facts.weight_bits=x", "must be a number"),
    ("health.timeout_s=.inf", "must be a finite number"),
    ("prefill=3", "must be a section of keys and values"),
    ("vllm_args.max-num-seqs=[1,2]", "vllm_args.max-num-seqs lists 2 values, but --max-num-seqs takes one"),
    ("vllm_args.max-num-seqs=[1,[2]]", "in a list of flag values: write numbers or words"),
])  # fmt: skip
def test_validation_errors_say_the_accepted_form(cli, tmp_path, override, words):
    line = _refused(cli, tmp_path, SEED, "--set", override)
    assert words in line and override.partition("=")[0] in line, line


def test_a_wrong_run_or_process_name_gets_a_suggestion(cli, tmp_path):
    runs = tmp_path / "runs"
    rd = write_run(runs, "20251129-000000-named")
    line = one_error_line(*cli("status", "20251129-000000-namde", "--runs-dir", str(runs)))
    assert f"did you mean '{rd.run_id}'?" in line
    line = one_error_line(*cli("logs", rd.run_id, "decode-0@m1", "--runs-dir", str(runs)))
    assert f"did you mean '{PROC}'?" in line


# --- 1: engine flags and values the engine would refuse, refused at dry-run ------------------


@pytest.mark.parametrize("override, words", [
    ("vllm_args.max-num-sequences=512", "unrecognized arguments: --max-num-sequences 512: fix "
     "vllm_args.max-num-sequences (did you mean '--max-num-seqs'?)"),
    # (max-num-seqs=abc is refused before the table, for every vLLM: test_engine_values.py)
    ("vllm_args.stream-interval=abc", "argument --stream-interval: invalid int value: 'abc': "
     "fix vllm_args.stream-interval"),
    ("prefill.args.gdn-prefill-backend=auto", "argument --gdn-prefill-backend: invalid choice: "
     "'auto' (choose from 'flashinfer', 'triton'"),
    ("decode.args.max_num_batchd_tokens=8", "fix decode.args.max_num_batchd_tokens (did you "
     "mean '--max-num-batched-tokens'?)"),
])  # fmt: skip
def test_a_flag_vllm_would_refuse_fails_the_dry_run(cli, tmp_path, override, words):
    """vLLM 0.33's own parser (its flag table) reads every kind of engine command line before
    anything is written: the sentence names the engines, vLLM's words and the key to fix."""
    line = _refused(cli, tmp_path, SEED, "--set", override, "--dry-run")
    assert "`vllm serve` 0.33.0 would refuse the command line of " in line, line
    assert words in line, line
    role = override.split(".")[0]
    # the seed's decode has a front on each of its two nodes (decode.fronts: per_node)
    other = "decode-0 (front on another node)"
    named = {"prefill": ["prefill-0"], "decode": ["decode-0", other]}.get(
        role, ["decode-0", other, "prefill-0"])
    assert all(n in line for n in named), line
    assert not list(tmp_path.rglob("plan.json")), "a refused dry-run wrote a run directory"


@pytest.mark.parametrize("override, words", [
    ("kv_connector.kv_buffer_devic=cuda", "kv_connector.kv_buffer_devic is not a key of vLLM "
     "0.33.0's KV-transfer config: did you mean 'kv_buffer_device'?"),
    ("kv_connector.kv_load_failure_policy=retry", "kv_connector.kv_load_failure_policy must be "
     "one of 'recompute', 'fail' (got 'retry')"),
    ("sim.speed=0", "sim.speed: must be > 0"),
    ("sim.kv_fail_fraction=1.5", "sim.kv_fail_fraction: must be between 0 and 1"),
    ("sim.start_delay_s=-3", "sim.start_delay_s: must be >= 0"),
    ("slurm.time_limit=99999999999", "slurm.time_limit: at most 365 days"),
    ("slurm.time_limit=01:75:00", "minutes and seconds go up to 59"),
    ("model.facts.weight_bits=1e-300", "model.facts.weight_bits: must be 1 or more"),
])  # fmt: skip
def test_values_the_engine_or_slurm_would_refuse_fail_the_dry_run(cli, tmp_path, override, words):
    recipe = "devcluster-sim" if override.startswith("sim.") else SEED
    line = _refused(cli, tmp_path, recipe, "--set", override, "--dry-run")
    assert words in line, line


def test_the_simulator_refuses_what_the_recipe_refuses():
    """One rule for both: what the dry-run refuses in `sim:` the engine refuses in SIM_*."""
    from launcher.sim import knobs

    for name, bad in (("speed", "0"), ("kv_fail_fraction", "1.5"), ("start_delay_s", "-3")):
        with pytest.raises(ValueError, match=f"SIM_{name.upper()} must be"):
            knobs.load({f"SIM_{name.upper()}": bad})
    assert knobs.load({"SIM_SPEED": "2"}).speed == 2.0


# --- 2, 5, 20: what a job costs, a time limit that cannot fit, what the lengths are ---------


def test_a_time_limit_that_cannot_fit_is_refused_and_a_tight_one_warned(cli, tmp_path):
    line = _refused(cli, tmp_path, SEED, "--set", "slurm.time_limit=00:20:00")
    assert "slurm.time_limit 00:20:00 (20 min) cannot fit this run" in line, line
    assert "from the published per-point figures" in line and "raise slurm.time_limit" in line
    # about 1 h 56 min with its 3 load rounds at the profile's 15 min: 2 h 10 fits that, but
    # not every load at its 40-minute health timeout
    rc, out, err = cli("submit", SEED, "--set", "slurm.time_limit=02:10:00", "--dry-run",
                       "--runs-dir", str(tmp_path / "runs"))
    assert rc == 0, err
    assert ("warning: slurm.time_limit 02:10:00 (2 h 10 min) fits the work" in out
            and "each load at its health.timeout_s (40 min)" in out
            and "a slow load ends the job" in out), out
    rc, out, err = cli("submit", SEED, "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    assert rc == 0 and "warning: slurm.time_limit" not in out, out


def test_a_study_dry_run_says_what_it_reserves_once(cli, tmp_path):
    rc, out, err = cli("submit", SEED, "--sweep", "prefill.endpoints=4,5,6,7,8", "--dry-run",
                       "--format", "json", "--runs-dir", str(tmp_path / "j"))
    assert rc == 0, err
    costs = [r["cost"] for r in json.loads(out)]
    assert [(c["gpus_allocated"], c["gpus_working"]) for c in costs] == [
        (16, 16), (20, 18), (20, 20), (24, 22), (24, 24)]  # 5 and 7 x DEP2 leave 2 GPUs idle
    rc, out, err = cli("submit", SEED, "--sweep", "prefill.endpoints=4,5,6,7,8", "--dry-run",
                       "--runs-dir", str(tmp_path / "runs"), "--allocation", "each")
    assert rc == 0, err
    lines = out.splitlines()
    # every line once but the process tables' rows (each run has its own table)
    repeated = {ln for ln in lines if lines.count(ln) > 1 and ln.strip()
                and not ln.startswith("gb200-")}
    assert not repeated, repeated
    assert sum(1 for ln in lines if ln.startswith("Cost: ")) == 5
    assert "Cost: 5 nodes, 20 GPUs allocated, 18 working (2 idle)" in out
    (total,) = [ln for ln in lines if ln.startswith("Study: ")]
    (jobs,) = [ln for ln in lines if ln.startswith("As 5 jobs: ")]
    hours = sum(c["gpu_hours"] for c in costs)
    m = re.search(r"about ([\d,.]+) GPU-hours", jobs)
    assert m and abs(float(m.group(1).replace(",", "")) - hours) < 0.2, (jobs, hours)
    assert "100 GPUs working over them" in total
    assert f"{sum(c['requests'] for c in costs):,} requests" in total
    # both ways side by side: one allocation of the largest footprint loads every engine
    # once and each decode setting (4096, 5120) once for every configuration's points that
    # need it; as one job each, each configuration's sweep restarts the decode twice
    (one,) = [ln for ln in lines if ln.strip().startswith("one allocation:")]
    assert one.strip().startswith("one allocation:  6 nodes x") and "11 engine start(s)" in one
    assert "each for 3 load rounds" in one
    (each,) = [ln for ln in lines if ln.strip().startswith("one job each:")]
    assert "5 jobs" in each and "45 engine start(s)" in each and "<- this submission" in each
    # the default takes the fewer GPU-hours at the profile's load time: one allocation, with
    # the two top points too (3 load rounds for the whole study against 15 as a job each)
    for sets, way in [([], "one allocation:"),
                      (["--set", "benchmark.concurrency=[64,128,256,512,1024,2048,3072]"],
                       "one allocation:")]:
        rc, out, err = cli("submit", SEED, "--sweep", "prefill.endpoints=4,5,6,7,8", *sets,
                           "--dry-run", "--runs-dir", str(tmp_path / f"auto{len(sets)}"))
        assert rc == 0, err
        both = {ln.strip().split(":")[0] + ":": ln for ln in out.splitlines()
                if ln.strip().startswith(("one allocation:", "one job each:"))}
        hours = {k: float(re.search(r"about ([\d,.]+) GPU-hours", v).group(1).replace(",", ""))
                 for k, v in both.items()}
        assert min(hours, key=hours.get) == way and "<- this submission" in both[way], out


def test_the_sweep_line_says_the_lengths_the_range_ratio_draws():
    from launcher import text
    from launcher.schema import recipe

    b = recipe.load(SEED).benchmark  # sa-bench's rule, as published
    assert text.length_range(b) == "inputs 6,553-8,192, outputs 819-1,024 tokens"
    vllm = b.model_copy(update={"length_rule": "vllm"})
    assert text.length_range(vllm) == "inputs 1,638-14,746, outputs 204-1,844 tokens"
    assert "exactly" in text.length_range(b.model_copy(update={"range_ratio": 1.0}))
    assert "exactly" in text.length_range(vllm.model_copy(update={"range_ratio": 0}))


def test_the_estimate_is_near_what_the_demo_took(tmp_path_factory):
    """The cost line's figure for the demo (simulator's speed model) against the demo's own
    record: within a factor of two, preflight to teardown."""
    import synth

    from launcher.planning import cost
    from launcher.planning import plan as plan_mod
    from launcher.schema import cluster, recipe

    run = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    rec = RunDir(run).read_record()
    took = rec.ended - rec.started
    r = recipe.load(str(run / "recipe.yaml"))
    c = cluster.load(r.cluster)
    p = plan_mod.make_plan(r, c, cluster.profile_nodes(c, plan_mod.nodes_needed(r, c)))
    est = cost.estimate(p)
    assert took / 2 < est.expected_s < took * 2, (est, took)


# --- 6, 9: a finished run's status says its result; a dry-run says what it is ---------------


def test_status_of_a_finished_run_shows_its_result_and_exit_codes(cli, tmp_path_factory):
    import synth

    run = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    rc, out, err = cli("status", str(run), "--runs-dir", str(run.parent))
    assert rc == 0, err
    summary = json.loads((run / "summary.json").read_text())
    best = summary["headline"]["total_tokens_per_s_per_gpu"]
    assert re.search(r"state succeeded .* took \d+ s", out), out
    assert "verdict passed" in out
    assert f"best {best:,.0f} tok/s/GPU (working GPUs; " in out, out
    assert f"at concurrency {summary['headline']['max_concurrency']}" in out
    acc = summary["accuracy"]
    assert f"accuracy gsm8k strict-match {acc['accuracy']:.3f} (threshold 0.7, passed" in out
    assert f"report: python -m launcher report {run}" in out or "report.html" in out
    codes = {n: p for n, p in RunRecord.from_json(
        json.loads((run / "run.json").read_text())).processes.items()}
    for name, p in codes.items():
        if p.stopped and p.exit_code not in (None, 0):
            assert re.search(rf"{re.escape(name)}\s+\S+\s+stopped \({p.exit_code}\)", out), out


def test_status_and_runs_of_a_dry_run_say_dry_run(cli, tmp_path):
    rc, out, err = cli("submit", "local-sim", "--dry-run", "--runs-dir", str(tmp_path))
    assert rc == 0, err
    (run,) = [r.parent for r in tmp_path.glob("*/plan.json")]
    rc, out, err = cli("status", str(run), "--runs-dir", str(tmp_path))
    assert "state dry-run (planned and written; nothing was submitted)" in out, out
    assert "ago" not in out.splitlines()[1]
    rc, out, err = cli("runs", "--runs-dir", str(tmp_path))
    assert re.search(rf"{run.name}\s+dry-run\s", out), out


# --- 14: the dry-run shows an engine command line; commands.sh is not run whole by mistake --


def test_the_dry_run_shows_engine_command_lines_and_commands_sh_refuses_to_run_whole(
        cli, tmp_path):
    import os
    import stat
    import subprocess

    rc, out, err = cli("submit", SEED, "--dry-run", "--runs-dir", str(tmp_path))
    assert rc == 0, err
    (run,) = [r.parent for r in tmp_path.glob("*/plan.json")]
    plan = json.loads((run / "plan.json").read_text())
    for role in ("decode", "prefill"):
        head = next(p for p in plan["processes"]
                    if p["kind"] == "engine" and p["role"] == role and not p["headless"])
        line = next(ln for ln in out.splitlines() if ln.startswith(f"{role} ({head['name']}): "))
        import shlex

        assert shlex.split(line.split(": ", 1)[1]) == head["argv"], line
    commands = run / "commands.sh"
    assert not os.stat(commands).st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    p = subprocess.run(["bash", str(commands)], capture_output=True, text=True, timeout=10,
                       cwd=tmp_path)
    assert p.returncode == 2 and "for reading and for copying one line" in p.stderr, p
    assert not (run / "logs").exists() or not any((run / "logs").iterdir()), "something ran"


# --- 8: a study is a target of status, logs, cancel and recommend ---------------------------


def test_a_study_is_a_target_of_status_logs_cancel_and_recommend(cli, tmp_path):
    rc, out, err = cli("submit", "local-sim", "--sweep", "prefill.endpoints=1,2", "--dry-run",
                       "--runs-dir", str(tmp_path))
    assert rc == 0, err
    (study,) = [p.parent for p in tmp_path.glob("*/study.json")]
    runs = sorted(p.parent.name for p in study.glob("*/plan.json"))
    for ref in (study.name, str(study)):
        rc, out, err = cli("status", ref, "--runs-dir", str(tmp_path))
        assert rc == 0, err
        assert f"{study.name}/  (study: 2 runs over prefill.endpoints=1,2, in one allocation)" \
            in out, out
        assert all(re.search(rf"  {r}\s+dry-run", out) for r in runs), out
    rc, out, err = cli("logs", study.name, "--runs-dir", str(tmp_path))
    assert rc == 0 and all(f"== {r}" in out for r in runs), (out, err)
    line = one_error_line(*cli("logs", study.name, "-f", "--runs-dir", str(tmp_path)))
    assert "is a study of 2 runs: follow one of them" in line, line
    rc, out, err = cli("recommend", study.name, "--runs-dir", str(tmp_path))
    assert "no run" not in err and "Traceback" not in err, err
    rc, out, err = cli("cancel", study.name, "--runs-dir", str(tmp_path))
    assert rc == 0, err
    assert f"study {study.name}: nothing to cancel (2 dry-run(s), 0 run(s) already ended)" in out
    rc, out, err = cli("status", study.name, "--runs-dir", str(tmp_path))
    assert out.count(" dry-run ") == 2, out


# --- 19: tables fitted to what they hold, a headline figure, CSV exports --------------------


def test_runs_and_recipes_tables_and_csv_exports(cli, tmp_path_factory):
    import csv
    import io

    import synth

    demo = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    runs_dir = demo.parent
    rc, out, err = cli("runs", "--runs-dir", str(runs_dir))
    assert rc == 0, err
    head, *rows = out.splitlines()
    assert head.split() == ["RUN", "STATE", "STAGE", "AGE", "ENGINE", "TOK/S/GPU"], head
    assert head.index("STATE") == len(demo.name) + 1, head  # RUN as wide as the name
    best = json.loads((demo / "summary.json").read_text())["headline"]
    (row,) = [r for r in rows if r.startswith(demo.name)]
    assert row.endswith(f"{best['total_tokens_per_s_per_gpu']:,.0f} @{best['max_concurrency']}")
    rc, out, err = cli("runs", "--runs-dir", str(runs_dir), "--format", "csv")
    (rec,) = [r for r in csv.DictReader(io.StringIO(out)) if r["run"] == demo.name]
    assert rec["state"] == "succeeded" and rec["engine"] == "sim" and rec["error"] == ""
    rc, out, err = cli("report", str(demo), "--format", "csv")
    assert rc == 0, err
    points = list(csv.DictReader(io.StringIO(out)))
    summary = json.loads((demo / "summary.json").read_text())
    assert [int(p["max_concurrency"]) for p in points] == [
        p["max_concurrency"] for p in summary["points"]]
    assert abs(float(points[-1]["total_tokens_per_s_per_gpu"])
               - summary["points"][-1]["total_tokens_per_s_per_gpu"]) < 1e-6
    rc, out, err = cli("recipes")
    head = out.splitlines()[0]
    assert head.split() == ["RECIPE", "MODEL", "SHAPE", "CLUSTER", "ENGINE"], head


# --- 3, 4: inputs the containers cannot see; a runs directory the nodes cannot see ---------


def test_inputs_outside_every_container_mount_are_named(cli, tmp_path):
    rc, out, err = cli("submit", SEED, "--dry-run", "--runs-dir", str(tmp_path / "a"))
    assert rc == 0, err
    for key, name in (("data", "test"), ("train", "train")):
        assert (f"warning: accuracy.{key} /datasets/gsm8k/{name}.jsonl is not readable here and "
                "is under none of the container mounts") in out, out
    rc, out, err = cli("submit", SEED, "--dry-run", "--runs-dir", str(tmp_path / "b"),
                       "--set", 'container.mounts=["/datasets/gsm8k:/datasets/gsm8k:ro"]')
    assert rc == 0, err
    assert "warning: accuracy." not in out, out


def test_a_runs_directory_on_a_local_disk_is_named_for_a_multi_host_profile(cli, tmp_path):
    from launcher.control import visibility
    from launcher.planning import plan as plan_mod
    from launcher.schema import cluster, recipe

    mounts = ("/dev/sda1 / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n"
              "fs1@o2ib:/lustre /lustre lustre rw 0 0\n")
    gb = cluster.load("gb200-nvl72")
    p = plan_mod.make_plan(recipe.load(SEED), gb, cluster.expand_nodelist("gb200-[001-004]"))
    why = visibility.runs_dir_warning(p, Path("/tmp/me/runs"), mounts)
    assert why and "is on this host's local tmpfs (/tmp)" in why and "PD_RUNS_DIR" in why
    assert visibility.runs_dir_warning(p, Path("/lustre/me/runs"), mounts) is None
    dev = cluster.load("devcluster")  # every node is this host: a local disk is shared
    p = plan_mod.make_plan(recipe.load("devcluster-sim"), dev,
                           cluster.expand_nodelist("gb200-[01-04]"))
    assert visibility.runs_dir_warning(p, Path("/tmp/me/runs"), mounts) is None
    # through the CLI: on stderr (stdout stays the plan, or JSON), once for a study
    fs = visibility.filesystem(tmp_path)
    if fs is not None and fs[1] in visibility.LOCAL_FS:
        rc, out, err = cli("submit", SEED, "--sweep", "prefill.endpoints=4,5", "--dry-run",
                           "--format", "json", "--runs-dir", str(tmp_path / "j"))
        assert rc == 0 and json.loads(out), err
        assert err.count(f"warning: --runs-dir {tmp_path / 'j'} is on this host's local") == 1
    # the default runs directory comes from PD_RUNS_DIR
    rc, out, err = cli("submit", "local-sim", "--dry-run", env={"PD_RUNS_DIR": str(tmp_path / "r")})
    assert rc == 0, err
    assert list((tmp_path / "r").glob("*/plan.json")), out


# --- 18: a reference of recipe fields; a recipe shown resolved -----------------------------


def test_recipes_fields_and_show(cli, tmp_path):
    import yaml

    from launcher.schema import recipe as recipe_mod

    rc, out, err = cli("recipes", "fields")
    assert rc == 0, err
    keys = {line.split()[0] for line in out.splitlines() if line.strip()}
    for key in ("slurm.account", "slurm.qos", "slurm.partition", "slurm.time_limit",
                "benchmark.range_ratio", "accuracy.harness", "prefill.endpoints", "cluster"):
        assert key in keys, key
    assert re.search(r"^slurm\.time_limit\s+str\s+'02:00:00'\s+HH:MM:SS", out, re.M), out
    rc, out, err = cli("recipes", "show", "local-sim", "--set", "prefill.endpoints=3")
    assert rc == 0, err
    doc = yaml.safe_load(out)
    assert doc["prefill"]["endpoints"] == 3 and doc["name"] == "local-sim"
    (tmp_path / "r.yaml").write_text(out)
    assert recipe_mod.load(str(tmp_path / "r.yaml")).prefill.endpoints == 3
    line = one_error_line(*cli("recipes", "show"))
    assert "recipes show NAME" in line
