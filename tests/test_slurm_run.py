"""Submitting to a real Slurm (slurm/devcluster/): submitit, srun steps, health, teardown.

These need the dev cluster up (`bash slurm/devcluster/up.sh`, which `make test` runs).
"""

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import helpers
import pytest
import yaml
from helpers import launcher, leftovers, recipe_per_prefill_count

from launcher.run import rundir

pytestmark = pytest.mark.slurm
RECIPE = "devcluster-sim"
SERVE_ONLY = ["--set", "benchmark.enabled=false", "--set", "accuracy.enabled=false"]


@pytest.fixture(scope="module", autouse=True)
def cluster_up():
    if shutil.which("sinfo") is None:
        pytest.fail("Slurm is not installed: run `bash slurm/devcluster/up.sh` (as root)")
    out = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"the dev cluster does not answer ({out.stderr.strip()}): run up.sh")


def submit(tmp_path, *args) -> Path:
    code, out = launcher(tmp_path, "submit", RECIPE, *args)
    assert code == 0, out
    assert re.search(r"submitted job \d+", out), out
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    return run


def wait_for(run: Path, pred, timeout=120, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = rundir.RunDir(run).status()
        if pred(st):
            return st
        time.sleep(0.5)
    raise AssertionError(f"{what} not reached in {timeout} s: {rundir.RunDir(run).status()}")


def job_gone(job_id: str, timeout=60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        if not out:
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still in squeue: {out}")


def ended(st):
    return st.final


def serving(st):
    return bool(st.record and st.record.serving) or st.final


def test_serving_through_slurm_then_clean_end(tmp_path):
    run = submit(tmp_path, *SERVE_ONLY, "--set", "hold_s=8")
    st = wait_for(run, serving, what="serving")
    assert st.record.serving, st
    plan = json.loads((run / "plan.json").read_text())
    assert not plan["placeholder_nodes"] and len(plan["nodes"]) == 4
    decode = [p for p in plan["processes"] if p["endpoint"] == "decode-0"]
    assert len({p["node"] for p in decode}) == 2, "decode must span two nodes"
    prefill_nodes = {p["node"] for p in plan["processes"] if p["role"] == "prefill"}
    assert len(prefill_nodes) == 2 and not prefill_nodes & {p["node"] for p in decode}
    # A completion through the real router, P/D across "nodes".
    body = json.dumps({"model": plan["model"]["served_name"], "prompt": "Hello", "max_tokens": 8})
    req = urllib.request.Request(
        st.record.router_url + "/v1/completions", data=body.encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer = json.loads(resp.read())
    assert answer["usage"]["completion_tokens"] == 8
    st = wait_for(run, ended, timeout=120, what="the end of the run")
    assert st.state == "succeeded", st.error
    job_gone(st.slurm_job_id)
    assert leftovers(run) == []
    for proc in plan["processes"]:
        if proc["kind"] in ("engine", "router", "agent"):
            assert (run / proc["log"]).stat().st_size > 0, proc["name"]
    # What was submitted is what the dry-run showed.
    (tmp_path / "dry").mkdir()
    code, out = launcher(
        tmp_path / "dry", "submit", RECIPE, *SERVE_ONLY, "--set", "hold_s=8", "--dry-run"
    )
    assert code == 0, out
    (dry,) = [p.parent for p in (tmp_path / "dry" / "runs").glob("*/plan.json")]
    submitted = (run / "job.sbatch").read_text().replace(str(run), "<RUN>")
    assert submitted == (dry / "job.sbatch").read_text().replace(str(dry), "<RUN>")


def test_sweep_and_gate_through_slurm_with_wait(tmp_path):
    code, out = launcher(tmp_path, "submit", RECIPE, "--wait")
    assert code == 0, out
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    summary = json.loads((run / "summary.json").read_text())
    assert [p["status"] for p in summary["points"]] == ["ok", "ok"]
    assert summary["verdict"] == "passed"
    assert leftovers(run) == []
    # --wait returns once Slurm has let go of the job (not while it is still COMPLETING), so
    # a chained `submit --wait` finds the nodes free
    job = rundir.RunDir(run).read_submission().slurm_job_id
    assert not subprocess.run(["squeue", "-h", "-j", job], capture_output=True,
                              text=True).stdout.strip()


def test_decode_crash_fails_run_and_status_names_it(tmp_path):
    # the engines serve about 3 s after they start (7 s on a busy host); the decode crashes
    # 12 s after its start, while serving
    run = submit(
        tmp_path, *SERVE_ONLY, "--set", "hold_s=120", "--set", "decode.env.SIM_CRASH_AFTER_S=12"
    )
    st = wait_for(run, serving, what="serving")
    serving_at = time.monotonic()
    assert st.record.serving, f"the decode crashed before the run served: {st.error}"
    st = wait_for(run, ended, timeout=90, what="failure")
    assert time.monotonic() - serving_at < 40
    assert st.state == "failed"
    assert re.match(r"decode-0@gb200-\d+ on gb200-\d+ exited with status", st.error), st.error
    code, out = launcher(tmp_path, "status", str(run))
    assert "state failed" in out and "decode-0@gb200-" in out and "exited with status" in out
    job_gone(st.slurm_job_id)
    assert leftovers(run) == []
    assert (run / "logs").is_dir() and len(list((run / "logs").glob("*.log"))) >= 10


def test_prefill_never_healthy_times_out_with_its_log(tmp_path):
    run = submit(
        tmp_path, "--set", "prefill.env.SIM_HANG_BEFORE_HEALTHY=1", "--set", "health.timeout_s=8"
    )
    st = wait_for(run, ended, timeout=120, what="failure")
    assert st.state == "failed"
    assert "not healthy within 8 s" in st.error and "prefill-0@gb200-" in st.error
    assert "last lines of logs/prefill-0@" in st.error
    job_gone(st.slurm_job_id)
    assert leftovers(run) == []


def all_idle(timeout=90, settle_s=5.0) -> None:
    """Every node of this lane's dev-cluster partition idle and no job queued for it, for
    `settle_s` on end (a previous test's job may still be ending): within a second or so of
    a job's end, Slurm 22.05 here has placed the next jobs around some of its nodes as if
    they were busy."""
    part = helpers.devcluster_partition()
    deadline = time.monotonic() + timeout
    since = None
    while time.monotonic() < deadline:
        states = subprocess.run(["sinfo", "-h", "-N", "-p", part, "-o", "%t"],
                                capture_output=True, text=True).stdout.split()
        queued = subprocess.run(["squeue", "-h", "-p", part], capture_output=True,
                                text=True).stdout.strip()
        if states and all(s == "idle" for s in states) and not queued:
            since = since or time.monotonic()
            if time.monotonic() - since >= settle_s:
                return
        else:
            since = None
        time.sleep(0.5)
    raise AssertionError(f"partition {part}'s nodes not idle in {timeout} s: {states}")


@pytest.mark.whole_partition
def test_a_study_submits_one_job_per_value_and_jobs_sharing_a_host_do_not_collide(tmp_path):
    """1 and 2 prefill endpoints take 3 + 3 of the 6 nodes: the two jobs run side by side on
    this one host, and each plans its ports inside its allocation. Each holds 30 s: for up
    to ~30 s after a job ends on a node whose slurmd was restarted (the node-loss tests
    bring theirs back), Slurm 22.05 leaves that node out of its placements while sinfo shows
    it idle, so the second job may wait that long for its third node; it retries every
    second (sched_interval=1), and the first is still running when it starts."""
    all_idle()
    code, out = launcher(
        tmp_path, "submit", RECIPE, *SERVE_ONLY, "--set", "hold_s=30",
        "--sweep", "prefill.endpoints=1,2", "--allocation", "each", "--wait"
    )  # fmt: skip
    assert code == 0, out
    (study,) = [p.parent for p in (tmp_path / "runs").glob("*/study.json")]
    doc = json.loads((study / "study.json").read_text())
    assert [r["values"] for r in doc["runs"]] == [
        {"prefill.endpoints": 1},
        {"prefill.endpoints": 2},
    ]
    jobs, spans, ports = set(), [], []
    for r in doc["runs"]:
        run = study / r["run"]
        st = rundir.RunDir(run).status()
        assert st.state == "succeeded", st.error
        jobs.add(st.slurm_job_id)
        rec = rundir.RunDir(run).read_record()
        spans.append((rec.started, rec.ended))
        plan = json.loads((run / "plan.json").read_text())
        n = r["values"]["prefill.endpoints"]
        assert sum(1 for e in plan["endpoints"] if e["role"] == "prefill") == n
        router_port = int(plan["router"]["url"].rsplit(":", 1)[1])
        ports.append({e["http_port"] for e in plan["endpoints"]} | {router_port})
        assert leftovers(run) == []
    assert len(jobs) == 2
    assert max(a for a, _ in spans) < min(b for _, b in spans), f"not side by side: {spans}"
    assert not ports[0] & ports[1], ports
    code, out = launcher(tmp_path, "runs")
    assert code == 0 and out.count("succeeded") == 2
    # two dev-cluster runs that differ in one setting: diff names it, single-variable
    one, two = (str(study / r["run"]) for r in doc["runs"])
    code, out = launcher(tmp_path, "diff", one, two)
    assert code == 0, out
    assert "single-variable: only prefill.endpoints differs, and nothing drifted" in out, out


# A model-load delay, and the simulator's speed model slow enough that CPU contention on
# this small host does not set the figures (at speed 2 a configuration's tok/s/GPU repeats
# within a few per cent).
STUDY = ["--set", "accuracy.enabled=false", "--set", "sim.start_delay_s=3",
         "--set", "sim.speed=2", "--set", "benchmark.concurrency=[8,32]",
         "--set", "benchmark.prompts_multiplier=2",
         # points of ~1.8 s whose decode holds requests for the last ~0.8 s of each: samples
         # every 0.25 s see it whatever the phase of the agents' beat
         "--set", "telemetry.interval_s=0.25"]
SPREAD = 0.10


def _headline(run: Path) -> dict[int, float]:
    summary = json.loads((run / "summary.json").read_text())
    return {p["max_concurrency"]: p["total_tokens_per_s_per_gpu"] for p in summary["points"]}


def _a_run_of_its_own(run: Path, points: int = 2) -> None:
    """What a run directory holds after a successful run of `points` sweep points, whichever
    way it ran."""
    from launcher.analysis import derive, load

    st = rundir.RunDir(run).status()
    assert st.state == "succeeded", (run, st.error)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verdict"] == "passed" and [p["status"] for p in summary["points"]] == [
        "ok"] * points
    plan = load.read_plan_safe(run)[0]
    for proc in plan.processes:
        assert (run / proc.log).is_file(), f"{run.name}: no log for {proc.name}"
    for node in plan.nodes:
        assert list((run / "telemetry" / node.name).glob("samples-*")), (run.name, node)
    table = derive.point_table(summary["points"], plan, derive.SeriesSet(
        load.read_telemetry(run), plan))
    assert (table["decode_kv_max"] > 0).all() and (table["transfers"] > 0).all(), table
    assert leftovers(run) == []


@pytest.mark.whole_partition
@pytest.mark.alone  # figures measured against each other / sample times matched
def test_a_study_in_one_allocation_loads_each_engine_once_and_matches_runs_of_their_own(
        tmp_path):
    """One decode, 1..3 prefill endpoints, a load delay: one Slurm job of 4 nodes; every
    engine starts once; each configuration's directory is a run of its own, and its
    tok/s/GPU is that of the same configuration submitted alone."""
    all_idle()
    code, out = launcher(tmp_path, "submit", RECIPE, *STUDY, "--sweep",
                         "prefill.endpoints=1,2,3", "--allocation", "one", "--wait",
                         timeout=400)
    assert code == 0, out[-4000:]
    assert re.search(r"submitted job \d+: study .* \(3 configurations in one allocation\)", out)
    (study,) = [p.parent for p in (tmp_path / "runs").glob("*/study.json")]
    alloc = json.loads((study / "allocation.json").read_text())
    runs = [study / c["run"] for c in alloc["configurations"]]
    jobs = {rundir.RunDir(r).status().slurm_job_id for r in runs}
    assert len(jobs) == 1 and alloc["slurm_job_id"] in jobs
    assert alloc["state"] == "succeeded" and alloc["nodes"] == 4
    starts: dict[str, int] = {}
    for r in runs:
        _a_run_of_its_own(r)
        for name, p in rundir.RunDir(r).read_record().processes.items():
            if p.kind == "engine" and p.started_by is None:
                starts[name] = starts.get(name, 0) + 1
    assert starts and set(starts.values()) == {1}, starts  # each engine loaded once
    assert len(starts) == 2 + 3  # the decode's two parts, three prefill endpoints
    s = alloc["summary"]
    assert s["engine_starts"] == 4 and s["succeeded"] == 3
    assert s["gpu_hours"] > 0 and s["loading_s"] > 3 and s["measuring_s"] > 0
    # a router of its own per configuration, registered in seconds
    for r in runs:
        events = rundir.RunDir(r).events()
        started = next(e["ts"] for e in events if e.get("event") == "process_started"
                       and e.get("process") == "router")
        serving = next(e["ts"] for e in events if e.get("event") == "serving")
        assert serving - started < 15, (r.name, serving - started)
    # the same configurations as jobs of their own, one after the other
    by_n = {json.loads((r / "plan.json").read_text())["gpu_count"]["prefill"] // 2: r
            for r in runs}
    for n in (1, 3):
        alone = tmp_path / f"alone{n}"
        alone.mkdir()
        code, out = launcher(alone, "submit", RECIPE, *STUDY, "--set",
                             f"prefill.endpoints={n}", "--wait", timeout=300)
        assert code == 0, out[-3000:]
        (run,) = [p.parent for p in (alone / "runs").glob("*/summary.json")]
        shared, own = _headline(by_n[n]), _headline(run)
        for c, v in own.items():
            assert abs(shared[c] - v) <= SPREAD * v, (n, c, shared[c], v)


@pytest.mark.whole_partition
def test_scancel_during_the_third_configuration_keeps_the_first_two(tmp_path):
    """A study in one allocation ended by scancel: the configuration in progress is
    cancelled, the finished ones keep their results, nothing is left in the job."""
    all_idle()
    # one recipe file per configuration (1, 2, 3 prefill endpoints), so each holds what it
    # needs: the first two only have to finish, the third serves until the scancel
    recipes = recipe_per_prefill_count(tmp_path, "devcluster-sim",
                                       {1: {"hold_s": 0}, 2: {"hold_s": 30}, 3: {"hold_s": 0}})
    code, out = launcher(tmp_path, "submit", *recipes, *SERVE_ONLY, "--allocation", "one")
    assert code == 0, out
    (study,) = [p.parent for p in (tmp_path / "runs").glob("*/study.json")]
    turns = json.loads((study / "study.json").read_text())["allocation"]["turns"]
    runs = [study / t["run"] for t in turns]
    assert [yaml.safe_load((r / "recipe.yaml").read_text())["hold_s"] for r in runs] \
        == [0, 0, 30]
    st = wait_for(runs[2], serving, timeout=180, what="the third configuration serving")
    assert not st.final, st
    subprocess.run(["scancel", st.slurm_job_id], check=True)
    job_gone(st.slurm_job_id)
    alloc = json.loads((study / "allocation.json").read_text())
    assert alloc["state"] == "cancelled", alloc
    states = [rundir.RunDir(r).status().state for r in runs]
    assert states == ["succeeded", "succeeded", "cancelled"], states
    assert "scancel" in rundir.RunDir(runs[2]).status().error
    assert all(leftovers(r) == [] for r in runs)


@pytest.mark.whole_partition
def test_a_study_loads_each_decode_setting_once_for_every_configurations_points(tmp_path):
    """Two configurations whose decode needs another command line from 16 and again from
    32 (args_from_concurrency), in one Slurm job: every configuration's 8 on the first
    decode, every one's 16 on the second, every one's 32 on the third: the decode started 3
    times in all (a configuration at a time: 5), every configuration's curve whole, and the
    measured useful GPU time on the Study page's facts."""
    from launcher.analysis import studies

    all_idle()
    steps = "{16: {num-gpu-blocks-override: 1152}, 32: {num-gpu-blocks-override: 1280}}"
    code, out = launcher(tmp_path, "submit", RECIPE, *STUDY, "--set",
                         "benchmark.concurrency=[8,16,32]", "--set",
                         f"decode.args_from_concurrency={steps}", "--sweep",
                         "prefill.endpoints=1,2", "--allocation", "one", "--wait", timeout=400)
    assert code == 0, out[-4000:]
    assert "6 visits, 3 load rounds" in out, out[-4000:]
    (study,) = [p.parent for p in (tmp_path / "runs").glob("*/study.json")]
    alloc = json.loads((study / "allocation.json").read_text())
    assert alloc["state"] == "succeeded", alloc
    decode = [e for e in alloc["engines"] if e["endpoint"] == "decode-0"
              and e["event"] == "started"]
    assert len(decode) == 3, alloc["engines"]
    assert [c["turn"]["points"] for c in alloc["configurations"]] == [[8], [8], [16], [16],
                                                                       [32], [32]]
    for run in {c["run"] for c in alloc["configurations"]}:
        r = study / run
        _a_run_of_its_own(r, points=3)  # its telemetry and figures at every point too
        assert sorted(_headline(r)) == [8, 16, 32]
    s = alloc["summary"]
    assert s["succeeded"] == 2 and 0 < s["useful_gpu_time"] < 1, s
    facts = dict(studies.allocation_facts(studies.find_study(study.parent, None)))
    assert facts["useful GPU time"].startswith(f"{s['useful_gpu_time']:.2f}: "), facts
