"""benchmark.agentic end to end through the dev cluster's Slurm (slurm/devcluster/): the
AIPerf that `env prepare --aiperf` staged on the shared filesystem, its venv built inside the
job without a package index, replays a tiny trace (tests/agentic_trace.py) through the real
vllm-router onto simulated engines, at two live-session counts in one allocation, over a
Mooncake KV store: the real `mooncake_master` as a Slurm step and each role's MultiConnector
of NixlConnector and MooncakeStoreConnector, as the published InferenceX store recipes write
them (docs/kv-store.md). The prefills' KV is too small for two sessions, so a later turn finds
blocks the prefill evicted in the store. One run; every assertion reads what AIPerf, the
engines, the master or Slurm recorded, and its dashboard pages and report are checked in
Chromium (tests/test_dashboard_browser.py's `visit`).

Needs the dev cluster up (`bash slurm/devcluster/up.sh`), the master (`bash
tests/mooncake/setup.sh`), Chromium (`bash tests/browser/setup.sh`) and the package index once
(the first `env prepare --aiperf` on a machine fetches ~230 MB of wheels; later runs reuse
them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import psutil
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
from test_kv_tiers import MASTER, STORE, master_installed, multi

from launcher.run import results, rundir
from launcher.telemetry import store

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]
SESSIONS, TURNS, BLOCK = 3, 3, 16
POINTS = [2, 3]
PREFILL_BLOCKS = 96


def agentic_recipe(tmp: Path, trace: str) -> Path:
    """The dev cluster's simulated recipe cut to two prefills and two decodes of one GPU
    each (the decodes log every request), the agentic benchmark at 2 and 3 live sessions;
    the engines at a twentieth of the shipped recipe's speed, so a request lasts about a
    second and each point a few (the telemetry's 1 s samples see them busy). A Mooncake
    store behind NIXL on both sides; the prefills hold PREFILL_BLOCKS blocks, one session's
    last prompt (~1,260 tokens, 79 blocks) but not two sessions' contexts. Run outside the
    image: it has no Mooncake client (nor the libibverbs it links), the host has."""
    r = yaml.safe_load((REPO / "launcher/recipes/devcluster-sim.yaml").read_text())
    r.pop("container")  # the image has no Mooncake client: the host's, as the master's
    r.update(
        name="devcluster-agentic",
        prefill={"endpoints": 2, "args": {"num-gpu-blocks-override": PREFILL_BLOCKS},
                 "kv_connector": multi("kv_both", {"kv_connector": "MooncakeStoreConnector"})},
        decode={"endpoints": 2, "args": {"num-gpu-blocks-override": 1024,
                                         "enable-log-requests": True},
                "kv_connector": multi("kv_consumer",
                                      {"kv_connector": "MooncakeStoreConnector"})},
        kv_store={"master_command": str(MASTER), "store_config": dict(STORE)},
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
    master_installed()
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
        # the engines' own counters: each later turn found its session's earlier prompt,
        # in the prefill's KV (a local hit) or, evicted there, in the store
        low, high = hit_bounds(recs, BLOCK)
        local = point["agentic"]["prefix_cache"]["prefill"]["hits"]
        stored = exported(art, "vllm:prompt_tokens_cached_by_source",
                          source="external_unspecified")
        assert 0 < low <= local + stored <= high, (low, local, stored, high)
    said = " ".join(out.split())
    assert "AIPerf: " + f"{staged}/venv/bin/aiperf (AIPerf 0.13.0 staged in {staged}" in said


def exported(art: Path, name: str, **labels: str) -> float:
    """A counter's increase over the point, summed over the engines, as AIPerf scraped them."""
    metric = json.loads((art / "server_metrics_export.json").read_text())["metrics"][name]
    return sum(s["stats"]["total"] for s in metric["series"]
               if all(s["labels"].get(k) == v for k, v in labels.items()))


def last_values(run: Path, names: list[str]):
    """Each series' last value in the run's telemetry (its counters' totals: the agents'
    last samples come after the last request)."""
    df = store.read_samples(run, names=names)
    df["role"] = df["process"].astype(str).str.split("-").str[0]
    return df.sort_values("ts").groupby(["process", "name", "labels"], observed=True).tail(1)


def test_the_master_runs_as_a_step_and_the_engines_use_its_store(agentic_run):
    """The real mooncake_master, an srun step of the job, healthy before any engine; the
    simulated engines' Mooncake clients put the prefills' blocks in it and get them back.
    A store hit is a later turn's blocks the prefill had evicted: the prefills' tokens served
    by the store (vLLM's external_unspecified source) are their load_get keys' blocks, and
    the master found every one of those keys (its own valid_get_nums_)."""
    run, _ = agentic_run
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    ready = [e["process"] for e in events if e.get("event") == "ready"]
    assert ready[0] == "mooncake-master" and len(ready) > 4, ready
    assert any(x.startswith("srun ") and "--job-name=mooncake-master" in x
               for x in (run / "commands.sh").read_text().splitlines())
    last = last_values(run, ["vllm:mooncake_store_operation_keys_total",
                             "vllm:prompt_tokens_cached_by_source_total",
                             "master_key_count", "valid_get_nums_"])

    def total(name: str, role: str, **labels: str) -> float:
        rows = last[(last["name"] == name) & (last["role"] == role)]
        for k, v in labels.items():
            rows = rows[rows["labels"].astype(str).str.contains(f'"{k}":"{v}"')]
        return float(rows["value"].sum())

    keys = "vllm:mooncake_store_operation_keys_total"
    assert total(keys, "prefill", operation="save_put") > 0  # kv_both: it saves its blocks
    assert total(keys, "decode", operation="save_put") == 0  # kv_consumer: it only reads
    for role in ("prefill", "decode"):
        assert total(keys, role, operation="lookup_exists") > 0, role
    got = total(keys, "prefill", operation="load_get")
    assert got > 0, "no later turn was served from the store"
    cached = "vllm:prompt_tokens_cached_by_source_total"
    assert total(cached, "prefill", source="external_unspecified") == got * BLOCK
    assert total(cached, "decode", source="external_unspecified") == 0  # NIXL serves them
    assert total("valid_get_nums_", "mooncake") == got
    assert total("master_key_count", "mooncake") > 0


def test_tokens_by_source_show_the_store_hits_per_point(agentic_run):
    """launcher/analysis/kv_tiers.py over the points' windows, as the dashboard and the
    report read it: the decodes' prompts came from their own KV or by the P->D handoff, the
    prefills' from their own KV, the store or computing; the store's share is no more than
    the engines counted."""
    from launcher.analysis import derive, kv_tiers, load

    run, _ = agentic_run
    plan = load.read_plan_safe(run)[0]
    ss = derive.SeriesSet(load.read_telemetry(run, names=load.TIER_NAMES), plan)
    ps = kv_tiers.point_sources(results.load_results(run), ss, plan)
    assert sorted(set(ps["concurrency"])) == POINTS and (ps["split"] == "tier").all(), ps
    decode, prefill = ps[ps["role"] == "decode"], ps[ps["role"] == "prefill"]
    assert (decode.groupby("point")["handoff"].sum() > 0).all(), decode
    # a decode finds a session's earlier turns in its own KV first, as real vLLM's does
    assert decode["local_hit"].sum() > 0, decode
    assert decode[["store_hit", "offload_hit", "external"]].sum().sum() == 0
    assert prefill["handoff"].sum() == 0
    assert (prefill.groupby("point")["computed"].sum() > 0).all(), prefill
    counted = last_values(run, ["vllm:prompt_tokens_cached_by_source_total"])
    counted = counted[counted["labels"].astype(str).str.contains("external_unspecified")]
    assert 0 < prefill["store_hit"].sum() <= counted["value"].sum() + 1e-6, prefill
    # each point's own figure, as AIPerf scraped the prefills: the store's share beside the
    # GPU KV's (the Sweep page and the report show both)
    tiers = [p["agentic"]["tier_hit_rate"] for p in results.load_results(run)]
    assert all(t is not None for t in tiers) and max(tiers) > 0, tiers


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
    # AIPerf's own workers, the master and the engines' Mooncake clients included: they
    # carry PD_RUN_DIR; each engine's log says its client was set up with the run's master
    assert leftovers(run) == []
    master = json.loads((run / "mooncake_store_config.json").read_text())[
        "master_server_address"]
    for log in (run / "logs").glob("*-[0-9]@*.log"):
        assert f"Mooncake store client set up with master {master} " in log.read_text(), log
    port = f"--port={master.rsplit(':', 1)[1]}"  # the master's argv (its own binary's)
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if port in (
        cmd := p.info["cmdline"] or []) and any(a.endswith("mooncake_master") for a in cmd)]


# --- the same run's pages in Chromium (tests/test_dashboard_browser.py's checks) ------------


@pytest.fixture(scope="module")
def pages(agentic_run, tmp_path_factory):
    """A dashboard server on the run's runs dir and a Chromium context, for this run only."""
    import os

    import synth
    from helpers import stop, streamlit_healthy
    from playwright.sync_api import sync_playwright
    from test_dashboard_browser import BROWSER_TZ, SERVER_TZ, free_port

    import dashboard

    if not os.path.exists(synth.CHROMIUM):
        pytest.fail("needs Debian's chromium: run `bash tests/browser/setup.sh` (as root)")
    run, _ = agentic_run
    port, log = free_port(), run.parent / "streamlit.log"
    zone = os.environ.get("TZ")
    os.environ["TZ"] = SERVER_TZ  # the server's zone, the browser's another (as there)
    try:
        with open(log, "wb") as out:
            proc = dashboard.start(run.parent, host="127.0.0.1", port=port, stdout=out,
                                   stderr=subprocess.STDOUT)
    finally:
        if zone is None:
            os.environ.pop("TZ")
        else:
            os.environ["TZ"] = zone
    try:
        base = dashboard.url("127.0.0.1", port)
        streamlit_healthy(base, proc, log)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=synth.CHROMIUM, args=synth.CHROMIUM_ARGS,
                                  env={**os.environ, "TZ": BROWSER_TZ})
            context = b.new_context()
            yield base, run, context, synth.screenshot_dir(tmp_path_factory.getbasetemp())
            context.close()
            b.close()
    finally:
        stop(proc)


# (page, title, charts drawn at least, texts on the page, texts its tables draw)
STORE_PAGES = [
    ("kv-tiers", "KV tiers", 3,
     ["Where each prompt token came from", "Prompt tokens by source, prefill",
      "Prompt tokens by source, decode", "Hits against the trace's theoretical hit rate",
      "KV store and master health"],
     {"KV store hit", "P→D handoff", "local prefix-cache hit", "master used (peak)"}),
    ("sweep", "Sweep", 5, ["Agentic sessions", "Sessions per decode endpoint"], set()),
    ("kv", "KV cache", 6, ["Agentic point: KV use, prefix hits and queue", "KV cache usage"],
     set()),
    ("ttft", "TTFT breakdown", 2, ["TTFT against the turn's context (agentic)",
                                   "The prefill compute line is the turn's whole context"],
     set()),
]


@pytest.mark.browser
@pytest.mark.parametrize("path, title, min_charts, wanted, drawn", STORE_PAGES,
                         ids=[p[0] for p in STORE_PAGES])
def test_the_runs_pages_in_chromium(pages, path, title, min_charts, wanted, drawn):
    """This run's pages at 1440 and 1280 px with every check of the dashboard's browser
    tests: tokens by source with the store's share, the agentic figures."""
    from test_dashboard_browser import visit

    base, run, context, shots = pages
    got = visit(context, f"{base}/{path}?run={run.name}", title, min_charts,
                shots / f"agentic-store-{path}.png")
    assert got["drawn"] >= min_charts
    for w in [run.name, "SIMULATION", *wanted]:
        assert w in got["text"], f"{w!r} missing on {path}"
    assert drawn <= set(got["canvas"]), set(got["canvas"])


@pytest.mark.browser
def test_the_report_in_chromium(pages):
    """`launcher report` for the run, opened as a file: tokens by source with the store's
    share, the store's health and the agentic prefix reuse."""
    base, run, context, shots = pages
    code, out = launcher(run.parents[1], "report", str(run))
    assert code == 0, out
    page = context.new_page()
    try:
        page.goto((run / "report.html").as_uri())
        page.screenshot(path=str(shots / "agentic-store-report.png"), full_page=True)
        text = page.inner_text("body")
    finally:
        page.close()
    for w in ("KV tiers: where each prompt token came from", "KV store hit %",
              "KV store and master health", "Prefix reuse (agentic)",
              "TTFT against the turn's context (agentic)", "Sessions per decode endpoint",
              "KV use, prefix hits and queue on one time axis"):
        assert w in text, w
    assert "nan" not in text.split() and "None" not in text.split()
