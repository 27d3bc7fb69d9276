"""benchmark.agentic: the real AIPerf 0.13.0 (tests/aiperf/setup.sh) replays a tiny session
trace through the real vllm-router over simulated engines; the per-point results come from
AIPerf's own files and the engines' own prefix-cache counters (docs/agentic.md). Plus the
dry-run's refusals, one sentence each, and the import of InferenceX's agentic recipe."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import helpers
import numpy as np
import pandas as pd
import pytest
import yaml
from agentic_trace import (
    AIPERF,
    agentic_recipe,
    aiperf_or_fail,
    conversations_by_engine,
    hit_bounds,
    records,
    write_tokenizer,
    write_trace,
)
from helpers import launcher, leftovers

from launcher.analysis import agentic as agentic_views
from launcher.analysis import derive, diagnose, load
from launcher.clients import agentic
from launcher.control import datasets, prepare
from launcher.errors import UserError
from launcher.run import results, rundir
from launcher.schema import srt_slurm, srt_slurm_v2

PORT_BASES = range(29400, 31400, 200)
SESSIONS, TURNS, BLOCK = 3, 3, 16  # the sim's KV block size (the recipe's block-size)
AGENTIC = (srt_slurm.BUNDLED / "InferenceX/benchmarks/multi_node/srt-slurm-recipes/dsv4/vllm/"
           "gb200-fp4/agentx/disagg-1p1d-dep8-dep8-mtp.yaml")


def aiperf() -> str:
    return aiperf_or_fail(AIPERF)


def recipe_file(tmp: Path, trace: Path, decodes: int = 1, **agentic) -> Path:
    return agentic_recipe(tmp, trace, AIPERF, decodes, block=BLOCK, **agentic)


def test_aiperf_replays_sessions_through_the_router_and_the_second_turn_hits_the_prefix(
        tmp_path, monkeypatch):
    aiperf()
    write_tokenizer(tmp_path / "tok")
    trace = write_trace(tmp_path / "trace.jsonl", SESSIONS, TURNS)
    prof = helpers.profile_copy(tmp_path / "local.yaml", "local",
                                port_base=helpers.free_port_base(PORT_BASES, 200))
    code, out = launcher(tmp_path, "submit", str(recipe_file(tmp_path, trace, decodes=2)),
                         "--set", f"cluster={prof}")
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    assert code == 0, out
    assert rundir.RunDir(run).status().state == "succeeded"
    router = next(p for p in json.loads((run / "plan.json").read_text())["processes"]
                  if p["name"] == "router")["argv"]
    assert router[router.index("--prefill-policy") + 1] == "consistent_hash"
    assert router[router.index("--decode-policy") + 1] == "consistent_hash"
    points = {r["max_concurrency"]: r for r in results.load_results(run)}
    assert sorted(points) == [2, 3]
    for c, point in points.items():
        art = run / "bench" / point["agentic"]["artifacts"]
        export = json.loads((art / "profile_export_aiperf.json").read_text())
        assert export["aiperf_version"] == "0.13.0"
        # every turn of every session, once: figures as AIPerf's own export has them
        assert point["status"] == "ok", point["failure_reason"]
        assert point["driver"] == "aiperf" and point["completed"] == SESSIONS * TURNS
        assert point["failed"] == 0
        assert point["p90_ttft_ms"] == export["time_to_first_token"]["p90"]
        assert point["p99_itl_ms"] == export["inter_token_latency"]["p99"]
        assert point["request_throughput"] == export["request_throughput"]["avg"]
        assert point["total_output_tokens"] == 8 * SESSIONS * TURNS
        ag = point["agentic"]
        assert [t["turn"] for t in ag["per_turn"]] == list(range(TURNS))
        assert all(t["requests"] == SESSIONS for t in ag["per_turn"])
        assert ag["drain"]["idle"] and ag["sessions"] == c
        # the prefills' own counters over the point: each later turn found the previous
        # turn's prompt in the KV of the prefill it reached (its session's: a turn sent to
        # the other prefill would miss all of it), the first turns nothing (AIPerf's
        # per-point cache-bust keeps the second point from the first one's blocks)
        low, high = hit_bounds(records(art), BLOCK)
        hits = ag["prefix_cache"]["prefill"]["hits"]
        assert 0 < low <= hits <= high, (low, hits, high)
        assert ag["prefix_hit_rate"] == hits / ag["prefix_cache"]["prefill"]["queries"]
        # the decode keeps its session's blocks too and hits what the prefill hits, pulling
        # only the rest over NIXL, as real vLLM's does (832 tokens on each in
        # tests/test_vllm_cpu.py; docs/sim-prefix-cache.md)
        assert ag["prefix_cache"]["decode"]["hits"] == hits
    # the working set fits the KV: the prefills' hits are within a few points of what the
    # trace offers, and no capacity-cliff verdict
    table = derive.point_table(results.load_results(run), None, None)
    verdicts = diagnose.diagnose(table.to_dict("records"))
    for point in points.values():
        ag = point["agentic"]
        assert ag["trace_hit_rate"] == pytest.approx(792 / 1560)  # see the unit test below
        assert abs(ag["prefix_hit_rate"] - ag["trace_hit_rate"]) < 0.05, ag
    assert [v.kind for v in verdicts if v.kind == diagnose.KV_CLIFF] == []
    # one session's requests all reached one decode engine, by the decodes' own records:
    # each point's sessions are their own conversations (AIPerf's cache-bust marker
    # starts each first turn), every turn of one on a single decode
    convs = conversations_by_engine(run, "decode")
    turns = sum(line.count("] SIMULATED request ")
                for log in (run / "logs").glob("decode-*.log")
                for line in log.read_text().splitlines())
    assert len(convs) == 2 * SESSIONS and turns == 2 * SESSIONS * TURNS, (convs, turns)
    assert all(len(engines) == 1 for engines in convs.values()), convs
    # what the dashboard and the report show of it, read again from the same files: the
    # sessions each decode served per point (the engines' lines, none split), and TTFT by
    # context bucket as AIPerf's own records give it
    views = agentic_views.load_run(run, load.load_bench(run), load.read_plan_safe(run)[0])
    t = views.sessions
    assert list(t.groupby("point", sort=False)["sessions"].sum().items()) == [
        ("c=2", SESSIONS), ("c=3", SESSIONS)], t
    assert t["requests"].sum() == 2 * SESSIONS * TURNS and t["split"].sum() == 0, t
    per_engine = {}
    for engines in convs.values():
        (e,) = engines
        per_engine[e] = per_engine.get(e, 0) + 1
    assert t.groupby("endpoint")["sessions"].sum().to_dict() == per_engine, (t, per_engine)
    for c, point in points.items():
        art = run / "bench" / point["agentic"]["artifacts"]
        mine = [(r["metrics"]["usage_prompt_tokens"]["value"],
                 r["metrics"]["time_to_first_token"]["value"]) for r in records(art)]
        b = views.buckets[views.buckets["point"] == f"c={c}"]
        assert b["requests"].sum() == SESSIONS * TURNS and len(b) == TURNS, b
        for r in b.itertuples():  # each turn's context is its own bucket here
            ttfts = [t for n, t in mine if r.lo <= n < r.hi]
            assert r.ttft_p50_ms == pytest.approx(float(np.percentile(ttfts, 50)))
            assert r.ttft_p90_ms == pytest.approx(float(np.percentile(ttfts, 90)))
        # the compute line: the prefills' prefill seconds over their computed prompt tokens
        server = json.loads((art / "server_metrics_export.json").read_text())["metrics"]
        prefills = {u for u, role in views.roles.items() if role == "prefill"}
        # (a series with nothing observed in the phase has no sum)
        secs = sum(x["stats"].get("sum", 0) for x in server[
            "vllm:request_prefill_time_seconds"]["series"] if x["endpoint_url"] in prefills)
        computed = sum(x["stats"].get("total", 0) for x in server[
            "vllm:prompt_tokens_by_source"]["series"] if x["endpoint_url"] in prefills
            and x["labels"]["source"] == "local_compute")
        assert views.ms_per_token[f"c={c}"] == pytest.approx(1000 * secs / computed)
    assert leftovers(run) == []
    said = " ".join(out.split())
    assert ("agentic points (AIPerf, conc = live sessions): tok/s counts input as the server "
            "counts it, its cached prefix included") in said
    assert f"c=3 {points[3]['agentic']['prefix_hit_rate'] * 100:.1f} %" in said
    code, _ = launcher(tmp_path, "report", str(run), "-o", str(tmp_path / "r.html"))
    page = " ".join((tmp_path / "r.html").read_text().split())
    assert code == 0 and "agentic session replay (benchmark.agentic) with AIPerf" in page
    assert "<h3>TTFT against the turn's context (agentic)</h3>" in page
    for r in t.itertuples():
        assert (f'<td>{r.point}</td><td>{r.endpoint}</td><td class="n" '
                f'data-value="{r.sessions}">{r.sessions}</td>') in page, page
    # AIPerf ended before its summary (killed mid-point): the requests its records hold are
    # kept, the point failed with AIPerf's own last words
    crashed = tmp_path / "aiperf-crashed"
    shutil.copytree(run / "bench" / points[3]["agentic"]["artifacts"], crashed)
    (crashed / "profile_export_aiperf.json").unlink()
    res = agentic.to_result(crashed, 3, {}, -9, ["Killed"])
    assert res["status"] == "failed" and res["completed"] == SESSIONS * TURNS
    assert res["failure_reason"] == (
        "AIPerf exited with status -9 before writing profile_export_aiperf.json (Killed); "
        f"the {SESSIONS * TURNS} request(s) it had recorded are kept (profile_export.jsonl)")
    assert res["p50_ttft_ms"] == pytest.approx(points[3]["p50_ttft_ms"])
    # the dashboard's Sweep page: live sessions against the prefill hit rate, both points
    at = helpers.open_app(run.parent, monkeypatch, run=run.name)
    at.switch_page("app_pages/sweep.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Agentic sessions" in [h.value for h in at.subheader]
    shown = next(t.value for t in at.dataframe if "hit" in t.value.columns)
    assert list(shown["sessions"]) == [2, 3]
    assert [round(h, 6) for h in shown["hit"]] == [
        round(points[c]["agentic"]["prefix_hit_rate"] * 100.0, 6) for c in (2, 3)]
    assert [round(h, 6) for h in shown["offered"]] == [round(792 / 1560 * 100.0, 6)] * 2
    assert "KV capacity cliff" not in list(shown["verdict"])
    spread = next(x.value for x in at.dataframe if "endpoint" in x.value.columns)
    assert spread.to_dict("records") == t.to_dict("records")
    at.switch_page("app_pages/ttft.py").run()
    assert not at.exception, [e.value for e in at.exception]
    shown = next(x.value for x in at.dataframe if "over_line" in x.value.columns)
    assert list(shown["ttft_p50_ms"]) == list(views.buckets["ttft_p50_ms"])
    said = "\n".join(f"- {c}" for c in agentic_views.line_crossings(views.buckets))
    assert said.startswith("- c=2: TTFT p50 ") and said in [m.value for m in at.markdown]


def test_the_theoretical_hit_rate_is_what_each_turn_repeats_of_its_session(tmp_path):
    """Two sessions of three turns (input 256, output 8) and a lone turn: turn k of a
    session repeats its earlier context k x 264; the lone turn and first turns repeat
    nothing."""
    trace = write_trace(tmp_path / "t.jsonl", 2, 3)
    with trace.open("a") as f:
        f.write(json.dumps({"input_length": 100, "output_length": 4}) + "\n")
    repeat = 2 * (264 + 528)
    total = 2 * (256 + 520 + 784) + 100
    assert agentic.trace_hit_rate(str(trace)) == repeat / total
    (tmp_path / "text.jsonl").write_text('{"session_id": "a", "text_input": "hi"}\n')
    assert agentic.trace_hit_rate(str(tmp_path / "text.jsonl")) is None


def test_a_working_set_past_the_prefix_kv_falls_below_the_theoretical_hit_rate(
        tmp_path, monkeypatch):
    """One prefill with 80 KV blocks of 16 tokens for 3 live sessions whose third turns
    are ~75 blocks each: a returning session finds its prefix evicted, the hit rate falls
    far below the trace's and the verdict names the capacity cliff."""
    aiperf()
    write_tokenizer(tmp_path / "tok")
    trace = write_trace(tmp_path / "trace.jsonl", SESSIONS, TURNS)
    prof = helpers.profile_copy(tmp_path / "local.yaml", "local",
                                port_base=helpers.free_port_base(PORT_BASES, 200))
    code, out = launcher(tmp_path, "submit", str(recipe_file(tmp_path, trace)),
                         "--set", f"cluster={prof}", "--set", "prefill.endpoints=1",
                         "--set", "prefill.args={num-gpu-blocks-override: 80}",
                         "--set", "prefill.env.SIM_PREFILL_TOKENS_PER_S=2000",
                         "--set", "benchmark.concurrency=[3]")
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    assert code == 0, out
    (point,) = results.load_results(run)
    ag = point["agentic"]
    assert ag["trace_hit_rate"] - ag["prefix_hit_rate"] > 0.10, ag
    assert ag["kv_usage_max"]["prefill"] >= 0.90, ag
    (v,) = diagnose.diagnose(derive.point_table([point], None, None).to_dict("records"))
    assert v.kind == diagnose.KV_CLIFF, v
    achieved, offered = ag["prefix_hit_rate"] * 100, ag["trace_hit_rate"] * 100
    assert v.evidence[0] == (f"GPU prefix-cache hit rate {achieved:.0f}% achieved vs "
                             f"{offered:.0f}% the trace offers (gap > 10%)"), v.evidence
    assert leftovers(run) == []
    # the report and the Sweep page show both rates and the verdict (with the telemetry)
    code, _ = launcher(tmp_path, "report", str(run), "-o", str(tmp_path / "r.html"))
    page = " ".join((tmp_path / "r.html").read_text().split())
    assert code == 0 and "Prefix reuse (agentic)" in page
    assert (f'<td class="n">3</td><td class="n" data-value="{achieved!r}">{achieved:.1f}</td>'
            '<td class="n">—</td>'  # no store or offload: no tier's hits
            f'<td class="n" data-value="{offered!r}">{offered:.1f}</td>'
            "<td>KV capacity cliff</td>") in page, page
    at = helpers.open_app(run.parent, monkeypatch, run=run.name)
    at.switch_page("app_pages/sweep.py").run()
    assert not at.exception, [e.value for e in at.exception]
    shown = next(t.value for t in at.dataframe if "hit" in t.value.columns)
    assert list(shown["verdict"]) == ["KV capacity cliff"]
    assert [round(x, 6) for x in shown["offered"]] == [round(offered, 6)]
    assert any(w.value.startswith("c=3: KV capacity cliff: ") for w in at.warning)
    # the point on one time axis (the run's telemetry): the prefill's KV pinned at or above
    # 90 % for part of it, fewer hits there than the trace offers, shaded on the KV page and
    # in the report
    plan = load.read_plan_safe(run)[0]
    ss = derive.SeriesSet(load.read_telemetry(run, names=load.KV_NAMES), plan)
    tl = agentic_views.point_timeline(ss, derive.window_of(point), ["decode", "prefill"],
                                      "prefill", ag["trace_hit_rate"])
    assert tl["full_spans"] and tl["hit_full"] < ag["trace_hit_rate"] - 0.10, tl
    said = agentic_views.timeline_evidence(tl)
    assert said[0].startswith("prefill KV at or above 90% for "), said
    at.switch_page("app_pages/kv_cache.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Agentic point: KV use, prefix hits and queue" in [h.value for h in at.subheader]
    assert f"c=3: KV capacity cliff. {'; '.join(said)}." in [w.value for w in at.warning]
    assert "<h3>c=3: KV use, prefix hits and queue on one time axis</h3>" in page
    assert page.count('class="span"') == 2 * len(tl["full_spans"]), page


def test_stage_dataset_copies_a_trace_and_refuses_a_broken_one(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", 2, 2)
    code, out = launcher(tmp_path, "stage-dataset", str(trace), "--cluster", "local",
                         "--block-size", "64")
    staged = tmp_path / "runs" / datasets.STAGED / "t.jsonl"
    assert code == 0 and staged.read_text() == trace.read_text(), out
    assert f"set benchmark.agentic.trace: {staged}" in out
    (tmp_path / "cut.jsonl").write_text(trace.read_text()[:-20])
    code, out = launcher(tmp_path, "stage-dataset", str(tmp_path / "cut.jsonl"), "--cluster",
                         "local", "--block-size", "64")
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert "line 4 is not JSON (a file cut short?)" in out
    code, out = launcher(tmp_path, "stage-dataset", "no_such_corpus", "--cluster", "local")
    assert code == 2 and "neither a file here nor a corpus AIPerf 0.13.0 knows" in out, out


def _refusal(tmp_path: Path, trace: Path | None = None, sets: tuple = (), **agentic) -> str:
    write_tokenizer(tmp_path / "tok")
    trace = trace or write_trace(tmp_path / "trace.jsonl", 2, 2)
    with pytest.raises(UserError) as e:
        prepare.prepare_all(str(recipe_file(tmp_path, trace, **agentic)), list(sets), [],
                            tmp_path / "runs")
    assert not list((tmp_path / "runs").glob("*/plan.json"))  # nothing written
    return " ".join(str(e.value).split())


@pytest.mark.parametrize("change, said", [
    (lambda t: t.write_text(t.read_text()[:-15]), "line 4 is not JSON (a file cut short?)"),
    (lambda t: t.write_text('{"session_id": "a", "output_length": 3}\n'),
     "line 1 needs exactly one of input_length, text_input, messages, payload"),
    (lambda t: t.write_text('{"input_length": 300, "hash_ids": [1, 2]}\n'),
     "line 1 has input_length 300 for 2 hash_ids of 64 tokens"),
    (lambda t: t.unlink(), "cannot be read"),
])
def test_a_corrupt_or_truncated_trace_is_one_sentence_at_dry_run(tmp_path, change, said):
    trace = write_trace(tmp_path / "trace.jsonl", 2, 2)
    change(trace)
    text = _refusal(tmp_path, trace)
    assert f"benchmark.agentic.trace {trace}: " in text and said in text, text


def test_contexts_past_max_model_len_and_bad_values_are_one_sentence(tmp_path):
    text = _refusal(tmp_path, sets=("vllm_args.max-model-len=200",))
    assert "a session reaches 528 tokens of context but decode.args.max-model-len 200 is " \
        "shorter" in text, text
    text = _refusal(tmp_path, max_context=4096, sets=("vllm_args.max-model-len=1024",))
    assert "benchmark.agentic.max_context 4,096 is longer than decode.args.max-model-len " \
        "1,024" in text, text
    assert "every concurrency must be between 1 and 1,000,000" in _refusal(
        tmp_path, sets=("benchmark.concurrency=[0]",))
    assert "is neither a path nor a corpus AIPerf 0.13.0 knows" in _refusal(
        tmp_path, sets=("benchmark.agentic.trace=cc_traces_weka",))
    assert "below the 900 s scenario inferencex-agentx-mvp requires" in _refusal(
        tmp_path, sets=("benchmark.agentic.trace=semianalysis_cc_traces_weka_062126",
                        "benchmark.agentic.scenario=inferencex-agentx-mvp",
                        "benchmark.agentic.duration_s=60"))


def test_an_unstaged_corpus_is_a_blocker_with_the_command_that_stages_it(tmp_path):
    write_tokenizer(tmp_path / "tok")
    path = recipe_file(tmp_path, tmp_path / "x.jsonl")
    prof = helpers.profile_copy(tmp_path / "local.yaml", "local",
                                models={"hf_home": str(tmp_path / "hf"), "internet": False})
    [p] = prepare.prepare_all(str(path), [
        f"cluster={prof}", "benchmark.agentic.trace=semianalysis_cc_traces_weka_062126"],
        [], tmp_path / "runs")
    assert p.blockers == [
        "the corpus semianalysis_cc_traces_weka_062126 (semianalysisai/cc-traces-weka-062126) "
        f"is not staged in {tmp_path / 'hf'}: python -m launcher stage-dataset "
        f"semianalysis_cc_traces_weka_062126 --cluster {prof}"]
    snap = datasets.corpus_dir(str(tmp_path / "hf"), "semianalysis_cc_traces_weka_062126")
    (snap / "snapshots" / "abc").mkdir(parents=True)
    [p] = prepare.prepare_all(str(path), [
        f"cluster={prof}", "benchmark.agentic.trace=semianalysis_cc_traces_weka_062126"],
        [], tmp_path / "runs")
    assert p.blockers == []
    bench = next(x for x in p.rendered.processes if x.name == "bench-c2")
    assert bench.argv[bench.argv.index("--public-dataset") + 1] == \
        "semianalysis-cc-traces-weka-062126"
    assert {k: bench.env[k] for k in ("HF_HOME", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")} == {
        "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def test_an_aiperf_missing_on_a_local_profile_is_a_blocker(tmp_path):
    write_tokenizer(tmp_path / "tok")
    path = recipe_file(tmp_path, write_trace(tmp_path / "trace.jsonl", 2, 2))
    [p] = prepare.prepare_all(str(path), ["benchmark.agentic.aiperf=/no/such/aiperf"], [],
                              tmp_path / "runs")
    assert p.blockers == [
        "benchmark.agentic.aiperf /no/such/aiperf is not a command on this host: install "
        "AIPerf 0.13.0 in an environment of its own (bash tests/aiperf/setup.sh makes one) and "
        "name its aiperf"]


def test_an_agentic_script_setting_the_driver_does_not_read_is_refused_by_name():
    data = yaml.safe_load(AGENTIC.read_text())
    data = srt_slurm_v2.deep_merge(data, {"benchmark": {"env": {
        "AIPERF_TRAJECTORY_START_MIN_RATIO": "0.25", "CONC_LIST": "16 64"}}})
    aliases = {"deepseek-v4-pro": "deepseek-ai/DeepSeek-V4-Pro"}
    with pytest.raises(UserError) as e:
        srt_slurm.convert(data, "x.yaml", "0" * 64, aliases)
    text = " ".join(str(e.value).split())
    assert "problems" not in text and "benchmark.env.AIPERF_TRAJECTORY_START_MIN_RATIO is read " \
           "by InferenceX's script, not by the launcher's AIPerf driver" in text, text
    del data["benchmark"]["env"]["AIPERF_TRAJECTORY_START_MIN_RATIO"]
    recipe, _ = srt_slurm.convert(data, "x.yaml", "0" * 64, aliases)
    assert recipe["benchmark"]["concurrency"] == [16, 64]


def test_the_dry_run_says_how_many_live_sessions_the_decode_kv_holds(tmp_path):
    """At the trace's mean session context (3 sessions of 2 turns of 64 + 8 tokens: 144),
    100 blocks of 16 tokens hold floor(99 / 9) = 11 sessions; 16 live sessions are more."""
    from launcher import text

    write_tokenizer(tmp_path / "tok")
    trace = write_trace(tmp_path / "trace.jsonl", 3, 2, input_len=64)
    path = recipe_file(tmp_path, trace)
    [p] = prepare.prepare_all(str(path), [
        "model.facts={total_params_b: 0.5, full_attention_layers: 16, num_kv_heads: 4, "
        "head_dim: 64, max_position_embeddings: 4096}",
        "decode.args={num-gpu-blocks-override: 100}", "benchmark.concurrency=[4,16]"],
        [], tmp_path / "runs")
    out = text.plan_text(p)
    assert ("KV: the decode side holds about 11 live sessions' contexts at once at 144 "
            "tokens each (the trace's mean session context, 3 sessions; decode-0 11); above "
            "that (16 live sessions at the top point)") in out, out
    assert "warning: " not in out  # the fixed-length sweep's KV warnings do not apply


def test_a_shared_profile_runs_the_staged_aiperf_and_blocks_until_env_prepare_stages_it(
        tmp_path):
    """compute_env.mode shared (the dev cluster's, GB200's): the run calls the AIPerf that
    `env prepare --aiperf` stages beside the launcher's environment, the job builds its venv
    once; not staged, the dry-run names the command that stages it."""
    write_tokenizer(tmp_path / "tok")
    path = recipe_file(tmp_path, write_trace(tmp_path / "trace.jsonl", 2, 2))
    prof = helpers.profile_copy(tmp_path / "dc.yaml", "devcluster", compute_env={
        "mode": "shared", "python": "/usr/bin/python3", "python_version": "3.11",
        "dir": str(tmp_path / "env")})
    sets = [f"cluster={prof}", "benchmark.agentic.aiperf=null", "slurm.partition=dev"]
    [p] = prepare.prepare_all(str(path), sets, [], tmp_path / "runs")
    staged = p.plan.runtime.aiperf_env
    assert staged == str(tmp_path / "env" / f"aiperf-0.13.0-{p.plan.runtime.arch}-py3.11")
    assert p.blockers == [
        f"AIPerf 0.13.0 is not staged for devcluster's nodes ({p.plan.runtime.arch}, Python "
        f"3.11): python -m launcher env prepare --cluster {prof} --aiperf"], p.blockers
    bench = next(x for x in p.rendered.processes if x.name == "bench-c2")
    assert bench.argv[bench.argv.index("--aiperf") + 1] == f"{staged}/venv/bin/aiperf"
    sbatch = p.run.sbatch.read_text()
    assert f"bash {staged}/bootstrap.sh\n" in sbatch, sbatch
    code, out = launcher(tmp_path, "env", "show", "--cluster", prof)
    assert (f"AIPerf 0.13.0 (benchmark.agentic) not staged: python -m launcher env prepare "
            f"--cluster {prof} --aiperf") in out, out
    # a run that names its own aiperf builds nothing of AIPerf's
    [p] = prepare.prepare_all(str(path), sets[:1] + [f"benchmark.agentic.aiperf={AIPERF}"],
                              [], tmp_path / "runs")
    assert "aiperf-0.13.0" not in p.run.sbatch.read_text() and p.blockers == []
    # the local profile runs this interpreter: nothing to stage, one sentence
    code, out = launcher(tmp_path, "env", "prepare", "--cluster", "local", "--aiperf")
    assert code == 2 and "compute_env.mode: submitter" in out \
        and len(out.strip().splitlines()) == 1, out


def test_staging_aiperf_for_aarch64_trays_names_the_wheel_the_index_lacks(tmp_path):
    """AIPerf 0.13.0 needs crick 0.0.8, which the package index has for x86_64 only: staging
    for GB200's aarch64 trays stops with one sentence saying which wheel to build and where
    to put it (a wheel put there is taken: --find-links)."""
    if os.uname().machine == "aarch64":
        pytest.skip("this machine is aarch64: the cross-arch fetch is what is tested")
    from launcher.control import compute_env
    from launcher.schema import cluster

    c = cluster.load("gb200-nvl72")
    c = c.model_copy(update={"compute_env": c.compute_env.model_copy(
        update={"dir": str(tmp_path)})})
    with pytest.raises(UserError) as e:
        compute_env.prepare_aiperf(c, tmp_path, quiet=True)
    env = tmp_path / "aiperf-0.13.0-aarch64-py3.12"
    assert str(e.value) == (
        "crick~=0.0.8 has no wheel for aarch64 Python 3.12 on the package index (AIPerf "
        "0.13.0's wheels need it): build one on an aarch64 host with Python 3.12 (pip wheel "
        f"'crick~=0.0.8' --no-deps -w {env}/wheels), then run this again (log: "
        f"{env}/prepare.log)")
    assert not (env / "wheels.ready").exists()


def test_context_buckets_are_round_bounds_labelled_in_tokens():
    assert agentic_views.bucket_edges(391, 1192) == [300, 500, 700, 1000, 1500]
    assert agentic_views.bucket_edges(9000, 142000) == [
        7000, 10000, 15000, 20000, 30000, 50000, 70000, 100000, 150000]
    recs = pd.DataFrame([("c=4", 4, "profiling", "s", 0, 0.0, 1.0, float(ttft), float(ctx),
                          False) for ctx, ttft in ((9000, 100), (9500, 300), (142000, 900))]
                        + [("c=4", 4, "warmup", "w", 0, 0.0, 1.0, 1.0, 9000.0, False),
                           ("c=4", 4, "profiling", "e", 0, 0.0, 1.0, 5.0, 9000.0, True)],
                        columns=agentic_views.RECORD_COLUMNS)
    b = agentic_views.context_buckets(recs)  # the warm-up and the failed request left out
    assert list(b["bucket"]) == ["7k–10k", "100k–150k"] and list(b["requests"]) == [2, 1]
    assert list(b["ttft_p50_ms"]) == [200.0, 900.0] and list(b["ttft_p90_ms"]) == [280.0, 900.0]
    # where TTFT p50 leaves the compute line as the context grows
    b = agentic_views.with_compute_line(b, {"c=4": 0.01})  # 9,250 -> 92.5 ms; 142k -> 1,420
    assert agentic_views.line_crossings(b) == [
        "c=4: TTFT p50 under the compute line from the 100k–150k tokens bucket on"]
    b = agentic_views.with_compute_line(b, {"c=4": 0.001})
    assert agentic_views.line_crossings(b) == [
        "c=4: TTFT p50 over the compute line at every context (turns computed again or "
        "waiting)"]


def test_the_compute_line_is_the_prefills_prefill_time_per_computed_token():
    def series(url, stats, **labels):
        return {"endpoint_url": url, "labels": labels, "stats": stats}

    server = {"metrics": {
        "vllm:request_prefill_time_seconds": {"series": [
            series("p0", {"sum": 2.0}), series("p1", {"sum": 1.0}), series("d0", {"sum": 9.0})]},
        "vllm:prompt_tokens_by_source": {"series": [
            series("p0", {"total": 1000.0}, source="local_compute"),
            series("p0", {"total": 5000.0}, source="local_cache_hit"),
            series("p1", {"total": 500.0}, source="local_compute"),
            series("d0", {"total": 1500.0}, source="external_kv_transfer")]}}}
    roles = {"p0": "prefill", "p1": "prefill", "d0": "decode"}
    assert agentic_views.prefill_ms_per_token(server, roles) == 2.0  # 3 s / 1,500 tokens
    assert agentic_views.prefill_ms_per_token({"metrics": {}}, roles) is None


def test_sessions_per_decode_from_the_engines_lines_logged_in_another_zone():
    """The engines logged in UTC+05:30 (no zone in vLLM's line), AIPerf's records are unix:
    each line is put on its point; a session with turns on two decodes is counted as split."""
    t0 = 1_796_553_000.0
    recs = pd.DataFrame([("c=2", 2, "profiling", "x", 0, t0, t0 + 10, 1.0, 1.0, False),
                         ("c=3", 3, "profiling", "y", 0, t0 + 60, t0 + 70, 1.0, 1.0, False)],
                        columns=agentic_views.RECORD_COLUMNS)
    ist = 19800.0
    line = agentic_views.RequestLine
    lines = [line("decode-0", t0 + ist + 1, "a", 10), line("decode-0", t0 + ist + 5, "a", 20),
             line("decode-1", t0 + ist + 2, "b", 10), line("decode-0", t0 + ist + 61, "c", 10),
             line("decode-1", t0 + ist + 65, "c", 20), line("decode-10", None, "d", 10)]
    t = agentic_views.sessions_per_endpoint(lines, agentic_views.point_spans(recs))
    assert t.to_dict("records") == [
        {"point": "c=2", "endpoint": "decode-0", "sessions": 1, "requests": 2, "split": 0},
        {"point": "c=2", "endpoint": "decode-1", "sessions": 1, "requests": 1, "split": 0},
        {"point": "c=3", "endpoint": "decode-0", "sessions": 1, "requests": 1, "split": 1},
        {"point": "c=3", "endpoint": "decode-1", "sessions": 1, "requests": 1, "split": 1},
        {"point": "outside the points", "endpoint": "decode-10", "sessions": 1,
         "requests": 1, "split": 0}]


def test_a_weka_corpus_offers_aiperfs_theoretical_rate_in_percent_and_gets_the_verdict():
    """A Weka corpus has no trace_hit_rate: the offered rate is AIPerf's
    theoretical_prefix_cache_hit, which it gives in percent (95.0 is 95 %)."""
    point = {"max_concurrency": 64, "status": "ok", "completed": 100, "failed": 0,
             "mean_ttft_ms": 900.0, "mean_tpot_ms": 20.0,
             "agentic": {"sessions": 64, "prefix_hit_rate": 0.40, "theoretical_prefix_hit": 95.0,
                         "kv_usage_max": {"prefill": 0.97, "decode": 0.5}}}
    row = derive.point_table([point], None, None).to_dict("records")[0]
    assert row["hit_theoretical"] == pytest.approx(0.95)
    (v,) = diagnose.diagnose([row])
    assert v.kind == diagnose.KV_CLIFF and v.evidence[0] == (
        "GPU prefix-cache hit rate 40% achieved vs 95% the trace offers (gap > 10%)"), v


def test_a_stores_hits_are_counted_beside_the_gpus_and_named_in_the_cliff():
    """On the engines that first see a prompt, external hits are a store's or CPU offload's
    (a decode's are the handoff, never counted as reuse); the cliff's evidence says how much
    of the GPU KV's loss a store recovered."""
    def series(url, total):
        return {"endpoint_url": url, "stats": {"total": total}}

    server = {"metrics": {
        "vllm:prefix_cache_queries": {"series": [series("p0", 1000.0), series("d0", 1000.0)]},
        "vllm:prefix_cache_hits": {"series": [series("p0", 200.0), series("d0", 200.0)]},
        "vllm:external_prefix_cache_hits": {"series": [series("p0", 300.0),
                                                       series("d0", 800.0)]}}}
    cache = agentic.prefix_cache(server, {"p0": "prefill", "d0": "decode"})
    assert cache["prefill"]["hit_rate"] == 0.2
    assert agentic.tier_hit_rate(server, cache) is None  # no store's or offload's metrics
    server["metrics"]["vllm:mooncake_store_operation_total"] = {"series": []}
    assert agentic.tier_hit_rate(server, cache) == 0.3
    assert agentic.tier_hit_rate(server, agentic.prefix_cache(server, {"d0": "decode"})) is None
    point = {"max_concurrency": 64, "status": "ok", "completed": 100, "failed": 0,
             "mean_ttft_ms": 900.0, "mean_tpot_ms": 20.0,
             "agentic": {"sessions": 64, "prefix_hit_rate": 0.2, "tier_hit_rate": 0.3,
                         "trace_hit_rate": 0.9, "kv_usage_max": {"prefill": 0.97}}}
    row = derive.point_table([point], None, None).to_dict("records")[0]
    (v,) = diagnose.diagnose([row])
    assert v.kind == diagnose.KV_CLIFF and v.evidence[-1] == (
        "a KV store or CPU offload served another 30% of the prompt tokens, not computed "
        "again (the KV tiers page)"), v
