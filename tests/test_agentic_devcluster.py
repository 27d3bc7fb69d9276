"""benchmark.agentic end to end through the dev cluster's Slurm (slurm/devcluster/): the
AIPerf that `env prepare --aiperf` staged on the shared filesystem, its venv built inside the
job without a package index, replays a tiny trace (tests/agentic_trace.py) through the real
vllm-router onto simulated engines in pyxis containers, at two live-session counts in one
allocation. One run; every assertion reads what AIPerf, the engines or Slurm recorded.

Needs the dev cluster up (`bash slurm/devcluster/up.sh`) and the package index once (the
first `env prepare --aiperf` on a machine fetches ~230 MB of wheels; later runs reuse them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from agentic_trace import (
    conversations_by_engine,
    hit_bounds,
    records,
    write_tokenizer,
    write_trace,
)
from helpers import launcher, leftovers

from launcher.run import results, rundir
from launcher.telemetry import store

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]
SESSIONS, TURNS, BLOCK = 3, 3, 16
POINTS = [2, 3]


def agentic_recipe(tmp: Path, trace: str) -> Path:
    """The dev cluster's simulated recipe cut to two prefills and two decodes of one GPU
    each (the decodes log every request), the agentic benchmark at 2 and 3 live sessions;
    the engines at a twentieth of the shipped recipe's speed, so a request lasts about a
    second and each point a few (the telemetry's 1 s samples see them busy)."""
    r = yaml.safe_load((REPO / "launcher/recipes/devcluster-sim.yaml").read_text())
    r.update(
        name="devcluster-agentic",
        prefill={"endpoints": 2, "args": {"num-gpu-blocks-override": 2048}},
        decode={"endpoints": 2, "args": {"num-gpu-blocks-override": 1024,
                                         "enable-log-requests": True}},
        benchmark={"concurrency": POINTS, "agentic": {
            "trace": trace, "block_size": 64, "tokenizer": str(tmp / "tok"),
            "drain_poll_s": 0.3}},
        accuracy={"enabled": False},
        sim={"speed": 1},
    )
    path = tmp / "agentic.yaml"
    path.write_text(yaml.safe_dump(r, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def agentic_run(tmp_path_factory) -> tuple[Path, str]:
    if shutil.which("sinfo") is None:
        pytest.fail("Slurm is not installed: run `bash slurm/devcluster/up.sh` (as root)")
    tmp = tmp_path_factory.mktemp("agentic-dc")
    code, out = launcher(tmp, "env", "prepare", "--cluster", "devcluster", "--aiperf",
                         timeout=600)
    assert code == 0 and "AIPerf 0.13.0 (benchmark.agentic) staged in " in out, out
    write_tokenizer(tmp / "tok")
    trace = write_trace(tmp / "trace.jsonl", SESSIONS, TURNS, output_len=32)
    code, out = launcher(tmp, "stage-dataset", str(trace), "--cluster", "devcluster",
                         "--block-size", "64")
    assert code == 0, out
    staged = out.split("set benchmark.agentic.trace: ", 1)[1].strip()
    code, out = launcher(tmp, "submit", str(agentic_recipe(tmp, staged)), "--wait",
                         timeout=900)
    (run,) = [p.parent for p in (tmp / "runs").glob("*/plan.json")]
    assert code == 0, out
    return run, out


def test_staged_aiperf_replays_sessions_on_the_dev_cluster(agentic_run):
    run, out = agentic_run
    assert rundir.RunDir(run).status().state == "succeeded"
    plan = json.loads((run / "plan.json").read_text())
    staged = f"{plan['runtime']['env'].rsplit('/', 1)[0]}/aiperf-0.13.0-x86_64-py3.11"
    assert f"bash {staged}/bootstrap.sh\n" in (run / "job.sbatch").read_text()
    assert Path(staged, "venv", ".ready").exists()  # built inside a job, from its wheels
    points = {r["max_concurrency"]: r for r in results.load_results(run)}
    assert sorted(points) == POINTS
    for c, point in points.items():
        art = run / "bench" / point["agentic"]["artifacts"]
        export = json.loads((art / "profile_export_aiperf.json").read_text())
        assert point["agentic"]["command"][0] == f"{staged}/venv/bin/aiperf"
        assert export["aiperf_version"] == "0.13.0"
        assert point["status"] == "ok", point["failure_reason"]
        recs = records(art)
        assert len(recs) == SESSIONS * TURNS and not any(r.get("error") for r in recs)
        assert point["agentic"]["sessions"] == c
        # the prefills' own counters: each later turn found its session's earlier prompt on
        # the prefill it reached
        low, high = hit_bounds(recs, BLOCK)
        hits = point["agentic"]["prefix_cache"]["prefill"]["hits"]
        assert 0 < low <= hits <= high, (low, hits, high)
    said = " ".join(out.split())
    assert "AIPerf: " + f"{staged}/venv/bin/aiperf (AIPerf 0.13.0 staged in {staged}" in said


def test_each_session_stays_on_one_decode(agentic_run):
    """The decodes' own per-request lines: every conversation (a session of a point) on one
    decode, and as many lines as AIPerf recorded requests."""
    run, _ = agentic_run
    convs = conversations_by_engine(run, "decode")
    lines = sum(log.read_text().count("] SIMULATED request ")
                for log in (run / "logs").glob("decode-*.log"))
    assert len(convs) == len(POINTS) * SESSIONS, convs
    assert lines == len(POINTS) * SESSIONS * TURNS
    assert all(len(engines) == 1 for engines in convs.values()), convs


def test_every_point_drains_to_idle_before_the_next_without_a_restart(agentic_run):
    """The engines' own gauges as the telemetry sampled them: busy during the first point,
    every engine's running and waiting requests at 0 when the second point's first request
    left AIPerf; and each engine the same process throughout (its process_start_time_seconds
    as AIPerf scraped it in both points, one start line in its log)."""
    run, _ = agentic_run
    arts = [run / "bench" / f"aiperf-c{c:05d}" for c in POINTS]
    first, second = (records(a) for a in arts)
    begin = min(r["metadata"]["request_start_ns"] for r in first) / 1e9
    end = max(r["metadata"]["request_end_ns"] for r in first) / 1e9
    start = min(r["metadata"]["request_start_ns"] for r in second) / 1e9
    assert start > end
    df = store.read_samples(run, names=["vllm:num_requests_running",
                                        "vllm:num_requests_waiting"], end=start)
    engines = df[df["process"].str.match(r"(prefill|decode)-\d+@")]
    during = engines[(engines["ts"] >= begin) & (engines["ts"] <= end)]
    assert (during["value"] > 0).any(), during  # the samples saw the point's requests
    last = engines.sort_values("ts").groupby(["process", "name", "labels"]).tail(1)
    assert set(last["process"].str.split("@").str[0]) == {
        "prefill-0", "prefill-1", "decode-0", "decode-1"}, last
    # rows are change points: a series' last one before the second point is its value then
    assert (last["value"] == 0).all(), last
    started = [{s["endpoint_url"]: s["stats"]["max"] for s in json.loads(
        (a / "server_metrics_export.json").read_text())["metrics"][
        "process_start_time_seconds"]["series"]} for a in arts]
    assert len(started[0]) == 4 and started[0] == started[1], started
    for log in (run / "logs").glob("*-[0-9]@*.log"):
        assert log.read_text().count("Starting vLLM server on ") == 1, log.name


def test_nothing_is_left_running_after_teardown(agentic_run):
    run, _ = agentic_run
    job = rundir.RunDir(run).read_submission().slurm_job_id
    # `submit --wait` returned once Slurm let go of the job (COMPLETING included)
    assert not subprocess.run(["squeue", "-h", "-j", job], capture_output=True,
                              text=True).stdout.strip()
    assert leftovers(run) == []  # AIPerf's own workers included: they carry PD_RUN_DIR
