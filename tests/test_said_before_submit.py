"""Issue 41, items 2, 5 and 8: what the launcher says before anything is submitted. The cost
split into what is estimated and what is only a bound, a study's lines adding up to what
is submitted; every change to what was asked (time limit, nodes, way) said, with the
partition's MaxTime asked of Slurm; a submit blocker shown as one at dry-run, and a refused
submission recorded as refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import profile_copy

from launcher.control import prepare
from launcher.planning import cost
from launcher.schema import recipe

REPO = Path(__file__).resolve().parents[1]
SEED = "qwen3.5-397b-gb200-disagg"
STUDY = ["prefill.endpoints=4,5,6,7,8"]
# The base recipes' seven points (no decode restarts) and a 2-hour limit: one allocation is
# the fewer GPU-hours and needs a longer limit than each job (with the two top points each
# configuration's long sweep makes one job each the cheaper way: docs/published-recipe.md)
SHORT = ["benchmark.concurrency=[64,128,256,512,1024,2048,3072]", "slurm.time_limit=02:00:00"]
SHORT_ARGS = [x for s in SHORT for x in ("--set", s)]


def _hours(line: str) -> tuple[float, float]:
    """(GPU-hours as estimated, at most GPU-hours) of a cost line."""
    m = re.search(r"([\d,.]+) GPU-hours(?: of work)?, at most ([\d,.]+) GPU-hours", line)
    assert m, line
    return tuple(float(x.replace(",", "")) for x in m.groups())


# --- 8: the cost split into what is estimated and what is a bound ---------------------------


def test_the_cost_line_splits_the_work_from_the_loading_bound(cli, tmp_path):
    rc, out, err = cli("submit", SEED, "--dry-run", "--runs-dir", str(tmp_path))
    assert rc == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Cost: ")]
    [p] = prepare.prepare_all(SEED, [], [], tmp_path / "again")
    c = cost.estimate(p.plan)
    # the sweep, gate, preflight and teardown are estimated; the three loads (the start and
    # the decode's two restarts) at the profile's load time, bounded by the health timeout
    assert c.loads == 3 and c.load_expected_s == 600, c
    assert abs(c.expected_s - (c.work_s + 3 * 600)) < 1e-6, c
    assert abs(c.worst_s - (c.work_s + 3 * 2400)) < 1e-6, c
    assert f"about {cost.duration(c.expected_s)} (loading ~10 min (gb200-nvl72's load_time_s) " \
        "each for 3 load rounds (the start and 2 restarts" in line, line
    assert f"at most {cost.duration(c.worst_s)} if each load takes its health.timeout_s" in line
    assert "engine restarts" not in line, line  # a load is not a phase of the work
    about, most = _hours(line)
    assert abs(about - c.gpu_hours()) < 0.06 and abs(most - c.gpu_hours(c.worst_s)) < 0.06
    b = p.plan.recipe.benchmark
    warm = sum(b.warmups(x) for x in b.concurrency)
    assert warm and c.warmups == warm
    assert f"{c.requests:,} requests ({warm:,} of them warm-up, not measured)" in line, line
    # a profile that states no load time: each load is only its bound, not estimated
    bare = profile_copy(tmp_path / "bare.yaml", "gb200-nvl72", load_time_s=None)
    rc, out, err = cli("submit", SEED, "--set", f"cluster={bare}", "--dry-run",
                       "--runs-dir", str(tmp_path / "bare"))
    assert rc == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Cost: ")]
    assert f"about {cost.duration(c.work_s)} of work" in line, line
    assert ("loading up to 40 min (health.timeout_s) for each of 3 load rounds (the start and "
            "2 restarts") in line, line
    assert f"so at most {cost.duration(c.worst_s)}" in line, line
    work, most = _hours(line)
    assert abs(work - c.gpu_hours(c.work_s)) < 0.06 and abs(most - c.gpu_hours(c.worst_s)) < 0.06


def test_an_estimated_load_is_said_as_one_with_its_bound(cli, tmp_path):
    rc, out, err = cli("submit", "local-sim", "--dry-run", "--runs-dir", str(tmp_path))
    assert rc == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Cost: ")]
    assert re.search(r"; about \d+ s \(loading ~5 s \(the simulator's start", line), line
    assert "at most" in line and "if each load takes its health.timeout_s" in line, line


def _study_lines(runs) -> tuple[list[str], list[str]]:
    from launcher import text

    out = text.study_plan_text(runs).splitlines()
    return ([ln for ln in out if ln.startswith("Cost")],
            [ln for ln in out if ln.strip().startswith(("one allocation:", "one job each:"))])


def test_a_studys_cost_lines_add_up_to_what_is_submitted(tmp_path):
    runs = prepare.prepare_all(SEED, [], STUDY, tmp_path / "one", allocation="one")
    lines, ways = _study_lines(runs)
    assert len(lines) == 5 and all("its visits in the one allocation" in ln for ln in lines), lines
    one = next(w for w in ways if "one allocation:" in w)
    sums = [sum(x) for x in zip(*map(_hours, lines), strict=True)]
    assert all(abs(s - t) < 0.3 for s, t in zip(sums, _hours(one), strict=True)), (sums, one)
    # in seconds, exactly: the turns are the allocation
    cmp = runs[0].compared
    assert abs(sum(t.work_s for t in cmp.turn_costs) - cmp.one_work_s) < 1e-6
    assert abs(sum(t.work_s + t.rounds * cmp.load_s for t in cmp.turn_costs) - cmp.one_s) < 1e-6
    # the first visit loads every engine at once; the first visit at 4096 and the first at
    # 5120 restart the decode; every other visit keeps what it finds
    assert [t.rounds for t in cmp.turn_costs] == [1] + [0] * 4 + [1] + [0] * 4 + [1] + [0] * 4

    runs = prepare.prepare_all(SEED, [], STUDY, tmp_path / "each", allocation="each")
    lines, ways = _study_lines(runs)
    assert len(lines) == 5 and not any("turn" in ln for ln in lines), lines
    each = next(w for w in ways if "one job each:" in w)
    sums = [sum(x) for x in zip(*map(_hours, lines), strict=True)]
    assert all(abs(s - t) < 0.3 for s, t in zip(sums, _hours(each), strict=True)), (sums, each)


def test_a_studys_lines_take_the_measured_load_where_there_is_one(tmp_path, monkeypatch):
    """With a load time measured by earlier runs, each configuration's line counts its
    loads at it, as the comparison does, and still says the bound."""
    monkeypatch.setattr(prepare, "assumed_load_s",
                        lambda root, plan, c: (600.0, "measured: the median of 3 earlier runs"))
    runs = prepare.prepare_all(SEED, [], STUDY, tmp_path, allocation="each")
    lines, ways = _study_lines(runs)
    each = next(w for w in ways if "one job each:" in w)
    m = [re.search(r"about ([\d,.]+) GPU-hours, at most ([\d,.]+)", x) for x in lines + [each]]
    assert all(m), lines + [each]
    got = [tuple(float(g.replace(",", "")) for g in x.groups()) for x in m]
    assert all(abs(sum(x[i] for x in got[:-1]) - got[-1][i]) < 0.3 for i in (0, 1)), got
    assert all("~10 min each" in ln and "health.timeout_s (40 min)" in ln for ln in lines)


def test_the_json_cost_says_the_work_the_bound_and_the_warm_ups(cli, tmp_path):
    rc, out, err = cli("submit", SEED, "--dry-run", "--format", "json", "--runs-dir",
                       str(tmp_path))
    assert rc == 0, err
    [doc] = json.loads(out)
    c = doc["cost"]
    assert c["work_s"] < c["worst_s"] and c["loads"] == 3 and c["warmup_requests"] > 0, c
    r = recipe.load(SEED)
    assert c["warmup_requests"] == sum(r.benchmark.warmups(x) for x in r.benchmark.concurrency)


# --- 2: every change to what was asked said, the partition's limits asked of Slurm -----------


def _block(out: str) -> list[str]:
    lines = out.splitlines()
    i = lines.index("What this submission changes from what was asked:")
    return [ln for ln in lines[i + 1:] if ln.startswith("  - ")]


def _fake_scontrol(tmp_path: Path, line: str) -> dict:
    """PATH with an scontrol that answers `show partition` with `line` (Slurm's -o form)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/sh\necho '{line}'\n")
    fake.chmod(0o755)
    import os

    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _planned(tmp_path: Path):
    """The study's choice as planned here (the figures the CLI must print)."""
    runs = prepare.prepare_all(SEED, SHORT, STUDY, tmp_path / "planned")
    return runs[0].choice


def _hm(minutes: int) -> str:
    return cost.duration(minutes * 60)


def test_a_study_says_every_change_from_what_was_asked(cli, tmp_path):
    choice = _planned(tmp_path)
    cmp, minutes = choice.cmp, choice.one_minutes
    assert choice.way == "one" and minutes > 120, choice
    rc, out, err = cli("submit", SEED, "--sweep", *STUDY, *SHORT_ARGS, "--dry-run",
                       "--runs-dir", str(tmp_path / "runs"), env=_fake_scontrol(
                           tmp_path, "Partition batch not found"))
    assert rc == 0, err
    changes = _block(out)
    assert any(x.startswith(f"  - time limit: {_hm(minutes)} (--time={minutes}) for the one "
                            "job, where the recipe says 2 h 00 min (slurm.time_limit)")
               for x in changes), out
    assert any(x.startswith("  - nodes: 6 nodes held for every configuration, where they need "
                            "4 to 6") for x in changes), changes
    assert any(x.startswith("  - way: one allocation for the 5 configurations (no --allocation "
                            "given") for x in changes), changes
    # the choice's reasons: GPU-hours both ways, and what each way asks of the queue
    (chosen,) = [ln for ln in out.splitlines() if ln.startswith("Chosen: ")]
    one, each = cmp.one_gpu_s / 3600, cmp.each_gpu_s / 3600
    assert f"the fewer GPU-hours ({one:,.1f} against {each:,.1f} as one job each" in chosen
    (queue,) = [ln for ln in out.splitlines() if ln.startswith("  queue: ")]
    assert (f"the one allocation asks for 6 nodes for {_hm(minutes)} (--time={minutes})" in queue
            and "one job each asks for 4 to 6 nodes for 2 h 00 min each" in queue
            and f"the longest running at most {cost.duration(cmp.longest_job(bound=True))}"
            in queue), queue
    assert "partition batch's MaxTime and MaxNodes are not known here" in out
    (study,) = (tmp_path / "runs").glob("*-study")
    doc = json.loads((study / "study.json").read_text())
    assert doc["choice"]["way"] == "one" and doc["choice"]["time_minutes"] == minutes
    assert len(doc["choice"]["changes"]) == 3
    rc, out, err = cli("submit", SEED, "--sweep", *STUDY, *SHORT_ARGS, "--dry-run", "--format", "json",
                       "--runs-dir", str(tmp_path / "json"))
    assert rc == 0 and all(r["study_choice"]["changes"] == doc["choice"]["changes"]
                           for r in json.loads(out)), out[:2000]
    # a real submission says the same before it is refused (the model is not staged)
    rc, out, err = cli("submit", SEED, "--sweep", *STUDY, *SHORT_ARGS, "--runs-dir",
                       str(tmp_path / "real"))
    assert rc == 2 and "is a hub id" in err, (out, err)
    assert len(_block(out)) == 3, out


def test_past_the_partitions_max_time_one_allocation_falls_back_or_is_refused(cli, tmp_path):
    choice = _planned(tmp_path)
    cmp, minutes = choice.cmp, choice.one_minutes
    most = minutes - 60  # each job's 2 h fits, the one allocation does not
    env = _fake_scontrol(tmp_path, "PartitionName=batch Default=NO MaxNodes=UNLIMITED "
                                   f"MaxTime={most} State=UP")
    why = (f"the study's one allocation would need a time limit of {_hm(minutes)} ({minutes} "
           f"min), longer than partition batch's MaxTime of {_hm(most)} ({most} min)")
    rc, out, err = cli("submit", SEED, "--sweep", *STUDY, *SHORT_ARGS, "--dry-run",
                       "--runs-dir", str(tmp_path / "auto"), env=env)
    assert rc == 0, err
    (chosen,) = [ln for ln in out.splitlines() if ln.startswith("Chosen: ")]
    assert chosen.startswith(f"Chosen: one job each, not one allocation "
                             f"({cmp.one_gpu_s / 3600:,.1f} against "
                             f"{cmp.each_gpu_s / 3600:,.1f} GPU-hours"), chosen
    assert f"because {why}" in chosen, chosen
    assert f"partition batch (scontrol show partition): MaxTime {most}," in out
    assert [x.split(":")[0] for x in _block(out)] == ["  - way"], out
    (study,) = (tmp_path / "auto").glob("*-study")
    doc = json.loads((study / "study.json").read_text())
    assert "allocation" not in doc and doc["choice"]["way"] == "each"
    assert not (study / "job.sbatch").exists() and len(list(study.glob("*/job.sbatch"))) == 5
    # asked for: refused in one sentence naming both numbers and the flag; nothing written
    rc, out, err = cli("submit", SEED, "--sweep", *STUDY, *SHORT_ARGS, "--allocation", "one",
                       "--dry-run",
                       "--runs-dir", str(tmp_path / "one"), env=env)
    assert rc == 2 and out == "", (out, err)
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: --allocation one: {why}: use --allocation each"), line
    assert not list((tmp_path / "one").glob("*-study")), "a refused study left its folder"
    # MaxNodes: the same rule
    env = _fake_scontrol(tmp_path, "PartitionName=batch MaxNodes=5 MaxTime=UNLIMITED")
    rc, out, err = cli("submit", SEED, "--sweep", *STUDY, *SHORT_ARGS, "--dry-run",
                       "--runs-dir", str(tmp_path / "nodes"), env=env)
    assert rc == 0 and "6 nodes, more than partition batch's MaxNodes of 5" in out, out


@pytest.mark.slurm
def test_the_partitions_limits_are_asked_of_the_real_slurm(cli, tmp_path):
    """On the dev cluster: a partition made for the test with a MaxTime the one allocation
    passes and each job fits, then one it fits."""
    import os
    import shutil
    import subprocess

    if shutil.which("scontrol") is None or os.geteuid() != 0:
        pytest.fail("needs the dev cluster's scontrol, as root (make test)")
    name = f"pd41-{os.getpid()}"
    made = subprocess.run(["scontrol", "create", f"PartitionName={name}", "Nodes=ALL",
                           "MaxTime=12", "Default=NO", "State=UP"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    try:
        args = ["submit", "devcluster-sim", "--sweep", "prefill.endpoints=1,2,3", "--dry-run",
                "--set", f"slurm.partition={name}", "--set", "slurm.time_limit=00:10:00",
                "--set", "health.timeout_s=600"]
        rc, out, err = cli(*args, "--runs-dir", str(tmp_path / "a"))
        assert rc == 0, err
        assert f"partition {name} (scontrol show partition): MaxTime 00:12:00" in out, out
        assert f"longer than partition {name}'s MaxTime of 12 min" in out, out
        subprocess.run(["scontrol", "update", f"PartitionName={name}", "MaxTime=60"], check=True)
        rc, out, err = cli(*args, "--runs-dir", str(tmp_path / "b"))
        assert rc == 0, err
        assert "MaxTime 01:00:00" in out and out.count("<- this submission") == 1, out
        assert "Chosen: one allocation" in out, out
    finally:
        subprocess.run(["scontrol", "delete", f"PartitionName={name}"], capture_output=True)


# --- 5: a submit blocker shown as one; a refused submission recorded as refused -------------

HUB = "model nvidia/Qwen3.5-397B-A17B-NVFP4 is a hub id, gb200-nvl72's compute nodes have no internet"


def test_a_dry_run_shows_a_submit_blocker_as_one(cli, tmp_path):
    rc, out, err = cli("submit", SEED, "--dry-run", "--runs-dir", str(tmp_path / "a"))
    # a dry-run that wrote everything exits 0 (docs: --check and submit exit 2 on it)
    assert rc == 0, err
    (line,) = [ln for ln in out.splitlines() if HUB in ln]
    assert line.startswith("blocker: submit will refuse this run: " + HUB), line
    assert out.splitlines()[-1].startswith("Not submittable as it is: submit refuses it"), out
    assert f"blocker: submit will refuse this run: {HUB}" in err, err
    rc, out, err = cli("submit", SEED, "--dry-run", "--format", "json",
                       "--runs-dir", str(tmp_path / "j"))
    assert rc == 0 and json.loads(out)[0]["blockers"][0].startswith(HUB), out
    # without one, no such line
    rc, out, err = cli("submit", "local-sim", "--dry-run", "--runs-dir", str(tmp_path / "b"))
    assert rc == 0 and "blocker" not in out + err, (out, err)


def _states(cli, runs_dir: Path) -> str:
    rc, out, err = cli("runs", "--runs-dir", str(runs_dir))
    assert rc == 0, err
    return out


def test_a_refused_submission_is_recorded_as_refused(cli, tmp_path):
    from launcher.analysis import load
    from launcher.run.rundir import RunDir
    from launcher.run.vocab import State

    for how, extra in (("submit", []), ("check", ["--check"])):
        root = tmp_path / how
        rc, out, err = cli("submit", SEED, *extra, "--runs-dir", str(root))
        assert rc == 2 and HUB in err, (out, err)
        (run,) = [p.parent for p in root.glob("*/plan.json")]
        st = RunDir(run).status()
        assert st.state == State.REFUSED and st.error.startswith(HUB), st
        rc, out, err = cli("status", str(run), "--runs-dir", str(root))
        assert "state refused: nothing was submitted" in out and f"error: {HUB}" in out, out
        assert "planned" not in out, out
        listed = _states(cli, root)
        assert re.search(rf"{run.name}\s+refused\s", listed) and HUB[:40] in listed, listed
        info = load.run_info(run)  # what the dashboard's Runs page lists
        assert info.state == "refused" and info.error.startswith(HUB) and not info.live
    # a study: every configuration it refused
    root = tmp_path / "study"
    rc, out, err = cli("submit", SEED, "--sweep", "prefill.endpoints=4,5", "--runs-dir", str(root))
    assert rc == 2, (out, err)
    (study,) = root.glob("*-study")
    rc, out, err = cli("status", study.name, "--runs-dir", str(root))
    assert out.count(" refused ") == 2, out
    assert out.splitlines()[-1].startswith(
        f"next: mend what the error says, then submit it again: python -m launcher submit "
        f"{SEED} --sweep prefill.endpoints=4,5"), out


def test_past_the_partitions_max_time_a_run_is_blocked(cli, tmp_path):
    env = _fake_scontrol(tmp_path, "PartitionName=batch MaxNodes=UNLIMITED MaxTime=03:00:00")
    rc, out, err = cli("submit", SEED, "--dry-run", "--runs-dir", str(tmp_path / "r"), env=env)
    assert rc == 0, err
    assert ("blocker: submit will refuse this run: slurm.time_limit 04:00:00 (4 h 00 min, 240 "
            "min) is longer than partition batch's MaxTime of 3 h 00 min (180 min)") in out, out


def test_the_partition_judged_is_the_one_sbatch_takes_from_the_environment(cli, tmp_path):
    """sbatch takes SBATCH_PARTITION over the script's --partition line: the limits a run
    is judged by are that partition's, whatever the recipe names."""
    env = _fake_scontrol(tmp_path, "PartitionName=fromenv MaxNodes=UNLIMITED MaxTime=03:00:00")
    rc, out, err = cli("submit", SEED, "--dry-run", "--set", "slurm.partition=batch",
                       "--runs-dir", str(tmp_path / "r"), env={**env, "SBATCH_PARTITION": "fromenv"})
    assert rc == 0, err
    assert "longer than partition fromenv's MaxTime of 3 h 00 min (180 min)" in out, out
    rc, out, err = cli("submit", SEED, "--dry-run", "--set", "slurm.partition=batch",
                       "--runs-dir", str(tmp_path / "s"), env=env)
    assert rc == 0 and "fromenv" not in out, out  # batch: not the partition scontrol knows
    # a study's one allocation names it too where its limits are not known
    rc, out, err = cli("submit", SEED, "--sweep", *STUDY, *SHORT_ARGS, "--dry-run",
                       "--runs-dir", str(tmp_path / "t"), env={
                           **_fake_scontrol(tmp_path, "Partition fromenv not found"),
                           "SBATCH_PARTITION": "fromenv"})
    assert rc == 0, err
    assert "partition fromenv's MaxTime and MaxNodes are not known here" in out, out


@pytest.mark.slurm
def test_a_check_records_what_the_scheduler_said(cli, tmp_path):
    """On the dev cluster: a check the scheduler refuses is a refused submission; one it
    takes leaves a directory that says nothing was submitted."""
    from launcher.run.rundir import RunDir
    from launcher.run.vocab import State

    rc, out, err = cli("submit", "devcluster-sim", "--check", "--set", "slurm.partition=nosuch",
                       "--runs-dir", str(tmp_path / "bad"))
    assert rc == 2 and "sbatch --test-only refused" in err, (out, err)
    (run,) = [p.parent for p in (tmp_path / "bad").glob("*/plan.json")]
    st = RunDir(run).status()
    assert st.state == State.REFUSED and "sbatch --test-only refused" in st.error, st
    rc, out, err = cli("submit", "devcluster-sim", "--check", "--runs-dir", str(tmp_path / "ok"))
    assert rc == 0, err
    (run,) = [p.parent for p in (tmp_path / "ok").glob("*/plan.json")]
    rc, out, err = cli("status", str(run), "--runs-dir", str(tmp_path / "ok"))
    assert "nothing was submitted" in out and "sbatch --test-only" in out, out
    assert "not submitted yet" not in out, out


def test_a_refused_submission_reads_refused_on_the_dashboard(cli, tmp_path, monkeypatch):
    """The Overview page of a refused submission says it was refused and why, in red, not
    'planned'."""
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from dashboard import ui

    root = tmp_path / "runs"
    rc, out, err = cli("submit", SEED, "--runs-dir", str(root))
    assert rc == 2 and HUB in err, (out, err)
    (run,) = [p.parent for p in root.glob("*/plan.json")]
    monkeypatch.setenv(ui.RUNS_ENV, str(root))
    at = AppTest.from_file(str(Path(ui.__file__).parent / "app.py"), default_timeout=120)
    at.query_params["run"] = run.name
    at.run()
    at.switch_page("app_pages/overview.py").run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert any("was refused, nothing ran" in e and HUB[:40] in e for e in errors), errors
