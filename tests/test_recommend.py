"""The prefill:decode recommendation (launcher.analysis.recommend).

Unit tests check each step of the method on hand-computed numbers; the acceptance test runs
a real simulated study on the local profile (1 decode endpoint, prefill endpoints 1..4,
prefill the bottleneck at low counts) and checks that the recommendation made from its
first run alone names the count the study itself measures best, within one endpoint.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import helpers
import pytest
import synth
import yaml
from helpers import launcher, leftovers, plan_doc

from launcher.analysis import recommend
from launcher.analysis.recommend import Point, Topology
from launcher.run import figures
from launcher.run.listing import entries
from launcher.run.rundir import RunDir, write_json

REPO = Path(__file__).resolve().parents[1]
KEYS = {"prefill_endpoints", "decode_endpoints", "ratio", "top_concurrency",
        "target_tokens_per_s_per_user", "capacities", "evidence", "next_command",
        "predicted", "assumptions"}


def _pt(c: float, **kw) -> Point:
    """A point of ISL/OSL 1000/100 with 100 requests in 10 s unless told otherwise."""
    base = dict(concurrency=c, prompts=100, duration_s=10.0, request_rate=10.0,
                input_tok_s=10_000.0, output_tok_s=1_000.0, isl=1000.0, osl=100.0,
                ttft_s=0.5, tpot_s=0.02, decode_tail_s=2.0, total_tok_s_gpu=1000.0,
                tok_s_user=50.0)
    base.update(kw)
    return Point(**base)


def _topo(**kw) -> Topology:
    base = dict(prefill_endpoints=2, prefill_gpus=2, prefill_shape="DEP2", decode_endpoints=1,
                decode_gpus=8, decode_shape="DEP8", prefill_dp=2, decode_engines=8)
    base.update(kw)
    return Topology(**base)


# --- prefill ---------------------------------------------------------------------------------


def test_prefill_capacity_is_the_rate_at_the_knee_without_the_decode_tail():
    pts = [
        _pt(4, input_tok_s=8_000, ttft_s=0.5, prefill_queue_s=0.01, prefill_compute_s=0.4),
        # queue 0.4 s = 40 % of TTFT 1.0 s and >= half the compute 0.45 s: the knee
        _pt(8, input_tok_s=14_000, ttft_s=1.0, prefill_queue_s=0.4, prefill_compute_s=0.45,
            duration_s=50.0, decode_tail_s=2.0),
        _pt(16, input_tok_s=14_500, ttft_s=2.0, prefill_queue_s=1.4, prefill_compute_s=0.45,
            duration_s=100.0, decode_tail_s=2.0),
    ]
    cap = recommend.prefill_capacity(pts, _topo(prefill_endpoints=2))
    assert cap["saturated"] and cap["knee"] == "c=8" and cap["knee_concurrency"] == 8
    # 14,500 tok/s over 2 endpoints = 7,250 per endpoint in the window; the prefill side was
    # busy for 100 - 2 s (the last requests' decode), so 7,250 x 100 / 98 = 7,397.96.
    assert cap["measured_tokens_per_s"] == pytest.approx(7250.0)
    assert cap["tokens_per_s"] == pytest.approx(7250.0 * 100 / 98)
    # c=8: 7,000 x 50 / 48 = 7,291.67 < c=16's 7,397.96: the most at or above the knee wins.
    assert [r["saturated"] for r in cap["per_point"]] == [False, True, True]


def test_a_full_decode_is_not_a_prefill_knee_and_no_knee_gives_an_estimate():
    pts = [
        _pt(4, input_tok_s=6_000, ttft_s=0.5, prefill_queue_s=0.01, prefill_compute_s=0.5),
        # a queue on prefill while the decode KV is full: backpressure, not prefill compute
        _pt(8, input_tok_s=7_000, ttft_s=2.0, prefill_queue_s=1.0, prefill_compute_s=0.5,
            decode_kv_max=0.97, decode_waiting_capacity=5.0),
    ]
    cap = recommend.prefill_capacity(pts, _topo(prefill_endpoints=1, prefill_dp=2))
    assert not cap["saturated"] and cap["knee"] is None
    assert cap["per_point"][1]["reason"].startswith("decode full")
    # No knee: 2 engines x 1,000 prompt tokens / 0.5 s compute at light load = 4,000 tok/s,
    # below the 7,000 delivered, so the delivered figure stands as the lower bound.
    assert cap["basis"] == "lower bound" and cap["tokens_per_s"] == pytest.approx(7000.0)
    slow = [_pt(4, input_tok_s=1_000, prefill_compute_s=0.1)]
    est = recommend.prefill_capacity(slow, _topo(prefill_endpoints=1, prefill_dp=2))
    assert est["basis"] == "estimate" and est["tokens_per_s"] == pytest.approx(20_000.0)


def test_plateau_of_prompt_throughput_is_a_knee_without_engine_parts():
    pts = [_pt(8, input_tok_s=9_000, ttft_s=0.4), _pt(16, input_tok_s=9_500, ttft_s=1.0)]
    cap = recommend.prefill_capacity(pts, _topo(prefill_endpoints=1))
    assert cap["saturated"] and cap["knee"] == "c=16"
    assert "+6%" in cap["why"] and "2.5x" in cap["why"]


# --- decode ----------------------------------------------------------------------------------


def test_tpot_fit_is_a_fixed_step_plus_a_cost_per_running_request():
    # TPOT = 10 ms + 0.5 ms x running, exactly
    pts = [_pt(c, decode_running=n, tpot_s=0.010 + 0.0005 * n) for c, n in
           ((4, 2.0), (8, 4.0), (16, 8.0))]
    fit = recommend.fit_tpot(pts)
    assert fit["a_s"] == pytest.approx(0.010) and fit["b_s"] == pytest.approx(0.0005)
    assert not fit["flat"]
    flat = recommend.fit_tpot([_pt(4, decode_running=2, tpot_s=0.021),
                               _pt(8, decode_running=4, tpot_s=0.020)])
    assert flat["flat"] and flat["b_s"] == 0 and flat["a_s"] == pytest.approx(0.0205)


def _model(a=0.010, b=0.0005, kv=None, fp=None, seqs=None, full=None, osl=100.0, xfer=0.0):
    n_kv = None
    if kv and fp:
        slack = 1000.0 / (1000.0 + osl / 2)
        n_kv = sum(c / fp - slack for c in kv)
    return {"tpot": {"a_s": a, "b_s": b, "flat": b == 0, "points": 3,
                     "running_range": (2.0, 8.0), "tpot_range_s": (a, a + 8 * b)},
            "kv_tokens_per_request": fp, "kv_footprint_basis": "measured",
            "kv_capacity_tokens": sum(kv) if kv else None, "running_at_kv_limit": n_kv,
            "running_limit_max_num_seqs": seqs, "running_measured_full": full,
            "measured_full_at": [], "kv_transfer_s": xfer, "isl": 1000.0, "osl": osl}


def test_decode_capacity_at_a_target_and_under_kv_capacity():
    # 50 tok/s/user = 20 ms TPOT = 10 ms + 0.5 ms x 20 running
    cap = recommend.decode_capacity(_model(), 50.0)
    assert cap["bound"] == "target" and cap["running"] == pytest.approx(20.0)
    assert cap["tpot_s"] == pytest.approx(0.020)
    # Little's law: 20 running / (100 tokens x 20 ms) = 10 req/s = 1,000 output tok/s
    assert cap["request_rate"] == pytest.approx(10.0)
    assert cap["output_tokens_per_s"] == pytest.approx(1000.0)
    # KV: 2 engines x 11,000 tokens, 1,000 per request, ~0.95 prompt per engine stays free:
    # 2 x (11 - 1000/1050) = 20.095 running < 30 allowed by 40 tok/s/user
    kv = recommend.decode_capacity(_model(kv=[11_000, 11_000], fp=1000.0), 40.0)
    assert kv["bound"] == "kv-capacity"
    assert kv["running"] == pytest.approx(2 * (11 - 1000 / 1050))
    assert kv["limits"]["target"] == pytest.approx(30.0)
    # a decode the run filled: what it held there wins over the estimate
    full = recommend.decode_capacity(_model(kv=[11_000, 11_000], fp=1000.0, full=18.0), None)
    assert full["bound"] == "kv-capacity" and full["running"] == pytest.approx(18.0)
    seqs = recommend.decode_capacity(_model(seqs=12), 40.0)
    assert seqs["bound"] == "max-num-seqs" and seqs["running"] == 12


def test_a_target_the_unloaded_decode_cannot_meet_is_a_reason():
    with pytest.raises(recommend.NoRecommendation, match="even unloaded"):
        recommend.decode_capacity(_model(a=0.030), 50.0)
    with pytest.raises(recommend.NoRecommendation, match="nothing bounds"):
        recommend.decode_capacity(_model(b=0.0), None)


def test_running_for_a_rate_below_capacity_solves_littles_law():
    # n = 2 req/s x 100 x (20 ms + 1 ms x n) -> n = 4 / 0.8 = 5; check: 2 x 100 x 25 ms = 5
    m = _model(a=0.020, b=0.001)
    assert recommend.running_for_rate(m, 2.0) == pytest.approx(5.0)
    assert recommend.running_for_rate(m, 10.0) == math.inf  # past what the decode can carry


# --- the ratio -------------------------------------------------------------------------------


def _ratio_case(prompts=("fixed", 1e12)):
    """Prefill DEP2 endpoints of 10,000 prompt tok/s; decode DEP8 carrying 50 running at a
    flat 20 ms TPOT = 50 / (100 x 0.02) = 25 req/s; ISL/OSL 1000/100."""
    topo = _topo(prefill_endpoints=1)
    model = _model(a=0.020, b=0.0)
    pre = {"tokens_per_s": 10_000.0}
    dcap = {"running": 50.0, "tpot_s": 0.020, "request_rate": 25.0, "bound": "kv-capacity"}
    return recommend.candidates(pre, model, dcap, topo, 0.5, prompts), topo


def test_balanced_ratio_maximises_tokens_per_gpu():
    cands, _ = _ratio_case()
    per_gpu = {c["prefill_endpoints"]: c["total_tokens_per_s_per_gpu"] for c in cands}
    # 25 req/s x 1000 / 10,000 = 2.5 endpoints' worth of prompts. Per GPU, 1100 tokens each:
    # P=1: 10 req/s / (2+8) GPUs; P=2: 20 / 12; P=3: 25 / 14 (decode-bound); P=4: 25 / 16
    assert per_gpu[1] == pytest.approx(10 * 1100 / 10, rel=1e-6)
    assert per_gpu[2] == pytest.approx(20 * 1100 / 12, rel=1e-6)
    assert per_gpu[3] == pytest.approx(25 * 1100 / 14, rel=1e-6)
    assert per_gpu[4] == pytest.approx(25 * 1100 / 16, rel=1e-6)
    assert [c["bound"] for c in cands[:4]] == ["prefill", "prefill", "decode", "decode"]
    best = recommend.choose(cands, 40.0)
    assert best["prefill_endpoints"] == 3
    # in flight at P=3: 25 req/s x (0.5 s TTFT + 100 x 20 ms) = 62.5; x 1.5 = 93.75 -> 96
    assert best["concurrency_at_capacity"] == pytest.approx(62.5)
    assert best["top_concurrency"] == 96


def test_a_short_sweep_point_measures_less_than_steady_state():
    cands, _ = _ratio_case(prompts=("fixed", 100))
    one, three = cands[0], cands[2]
    # prefill-bound P=1: 100 requests at 10 req/s + the last decode (100 x 20 ms) = 12 s
    assert one["request_rate"] == pytest.approx(100 / 12)
    # decode-bound P=3: TTFT0 0.5 s + half the fill (50 x 1000 / (2 x 30,000) = 0.833 s) +
    # half a decode lifetime (1 s) lost: 100 / (4 + 2.333) req/s
    assert three["request_rate"] == pytest.approx(100 / (4 + 0.5 + 50 * 1000 / 60_000 + 1))
    assert three["steady_total_tokens_per_s_per_gpu"] == pytest.approx(25 * 1100 / 14)


def test_nice_concurrency_and_the_next_sweep():
    assert [recommend.nice_up(x) for x in (5, 23, 100, 4500)] == [5, 24, 112, 5120]
    assert recommend.concurrency_list(4, 96) == [4, 8, 16, 32, 64, 96]
    assert recommend.concurrency_list(4, 18) == [4, 8, 18]
    assert recommend.concurrency_list(64, 40) == [5, 10, 20, 40]


def test_measured_tokens_per_gpu_at_a_target_interpolates_the_sweep_curve():
    pts = [{"status": "ok", "max_concurrency": 8, "total_tokens_per_s_per_gpu": 1000.0,
            "tokens_per_s_per_user": 100.0},
           {"status": "ok", "max_concurrency": 16, "total_tokens_per_s_per_gpu": 1600.0,
            "tokens_per_s_per_user": 80.0},
           {"status": "ok", "max_concurrency": 32, "total_tokens_per_s_per_gpu": 2000.0,
            "tokens_per_s_per_user": 40.0},
           {"status": "failed", "max_concurrency": 64, "total_tokens_per_s_per_gpu": 9e9,
            "tokens_per_s_per_user": 99.0}]
    at = recommend.tok_s_gpu_at_target
    assert at(pts, 60.0) == pytest.approx(1800.0)  # halfway from 80 to 40 tok/s/user
    assert at(pts, 90.0) == pytest.approx(1300.0)  # halfway from 100 to 80
    assert at(pts, 40.0) == pytest.approx(2000.0)
    assert at(pts, None) == pytest.approx(2000.0)
    assert at(pts, 120.0) is None


# --- run directories -------------------------------------------------------------------------


def test_topology_comes_from_the_plan():
    topo = recommend.topology_of(plan_doc(4))
    assert (topo.prefill_endpoints, topo.prefill_gpus, topo.prefill_shape) == (4, 2, "DEP2")
    assert (topo.decode_endpoints, topo.decode_gpus, topo.decode_shape) == (1, 8, "DEP8")
    assert topo.decode_engines == 8 and topo.gpus() == 16 and topo.gpus(6) == 20


def _bare_run(tmp_path: Path, plan, points: list[dict]) -> Path:
    run = tmp_path / plan.run_id
    run.mkdir()
    write_json(run / "plan.json", plan.to_json())
    for p in points:
        write_json(RunDir(run).bench_result(p["max_concurrency"]), p)
    return run


def _bench(c: int, status: str = "ok") -> dict:
    return {"num_prompts": 5 * c, "max_concurrency": c, "duration": 100.0,
            "completed": 5 * c, "failed": 0, "total_input_tokens": 5 * c * 8192,
            "total_output_tokens": 5 * c * 1024, "mean_ttft_ms": 900.0,
            "median_tpot_ms": 20.0, "p50_tpot_ms": 20.0, "mean_tpot_ms": 21.0,
            "status": status, "failure_reason": None if status == "ok" else "boom",
            "driver": "builtin", "window_start": 1000.0 + c, "window_end": 1100.0 + c}


def test_runs_that_cannot_support_a_recommendation_say_why(tmp_path):
    agg = _bare_run(tmp_path, plan_doc(agg=2, run_id="agg"), [_bench(8), _bench(16)])
    rec, why = recommend.analyse(agg)
    assert rec is None and "aggregated" in why
    assert recommend.recommend(agg) is None and recommend.why_not(agg) == why
    bare = _bare_run(tmp_path, plan_doc(4, run_id="bare"), [_bench(8), _bench(16)])
    assert "no vLLM telemetry" in recommend.why_not(bare)
    bad = _bare_run(tmp_path, plan_doc(4, run_id="bad"), [_bench(8, "failed")])
    assert "no sweep point of this run is ok" in recommend.why_not(bad)
    assert "not a run directory" in recommend.why_not(tmp_path / "nothing")
    assert "positive" in recommend.why_not(bare, -3.0)


def test_cli_prints_one_sentence_and_exits_2_on_bad_input(tmp_path, capsys):
    agg = _bare_run(tmp_path, plan_doc(agg=2, run_id="agg"), [_bench(8), _bench(16)])
    assert recommend.main([str(agg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "aggregated" in err
    assert recommend.main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == \
        f"error: {tmp_path / 'missing'} is not a run directory"


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("rec-synth")


def test_synthetic_runs_get_a_complete_recommendation(synth_root, capsys):
    pre = recommend.recommend(synth.prefill_bound(synth_root))
    assert pre is not None and KEYS <= set(pre)
    assert pre["capacities"]["prefill"]["knee"] is not None  # the queue grew into a knee
    assert pre["ratio"] == f"{pre['prefill_endpoints']}:1" and pre["decode_endpoints"] == 1
    assert pre["next_command"].startswith("python -m launcher submit ")
    assert "--sweep prefill.endpoints=" in pre["next_command"]
    assert all(isinstance(e, str) and any(ch.isdigit() for ch in e) for e in pre["evidence"])
    kv_run = synth.kv_capacity_bound(synth_root)
    kv = recommend.recommend(kv_run)
    assert kv["capacities"]["decode"]["bound"] == "kv-capacity"
    # the decode is the limit there: no more prefill endpoints than the run had
    assert kv["prefill_endpoints"] <= kv["capacities"]["prefill"]["endpoints_in_run"]
    assert recommend.main([str(kv_run), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ratio"] == kv["ratio"] and KEYS <= set(doc)
    assert recommend.main([str(kv_run), "--target-tok-s-user", "30"]) == 0
    text = capsys.readouterr().out
    assert ">= 30 tok/s/user" in text and "Next:" in text and "Evidence:" in text


# --- acceptance: a simulated study on the local profile --------------------------------------

TARGET = 45.0  # tok/s/user: the decode side reaches it near its KV capacity


def _study_recipe(tmp_path: Path) -> Path:
    """local-sim with a speed model where prefill is the bottleneck at low counts.

    One prefill endpoint (DP1) computes ~4,200 prompt tok/s (4,288 tok/s per GPU second,
    2,048-token chunks plus a 10 ms step): ~8 req/s of 512 tokens. The decode endpoint (DP2)
    holds ~15 requests in 2 x 288 blocks of 16 tokens at a TPOT of 16 ms + 0.4 ms per
    sequence on its rank (~19 ms there), so it serves ~24 req/s of 32 output tokens: about
    three prefill endpoints' worth. The simulator runs at speed 3 (every time above a third,
    the same bottlenecks, a third of the wall time). The cluster is the local profile with its own
    port range, so another local run on this host cannot collide with the study."""
    cluster = helpers.profile_copy(tmp_path / "local-recommend.yaml", "local",
                                   port_base=helpers.free_port_base(range(30000, 32500, 400), 200))
    r = yaml.safe_load((REPO / "launcher/recipes/local-sim.yaml").read_text())
    r.update(name="rec-study", cluster=str(cluster),
             description="recommendation acceptance: prefill-bound at low prefill counts")
    r["vllm_args"]["max-num-seqs"] = 64
    r["prefill"] = {"endpoints": 1, "data_parallel": 1,
                    "args": {"max-num-batched-tokens": 2048, "num-gpu-blocks-override": 2048},
                    "env": {"SIM_STEP_BASE_MS": "10"}}
    r["decode"] = {"endpoints": 1, "data_parallel": 2,
                   "args": {"num-gpu-blocks-override": 288},
                   "env": {"SIM_STEP_BASE_MS": "16", "SIM_DECODE_PER_SEQ_MS": "0.4"}}
    r["router"] = {"prefill_policy": "round_robin"}
    r["benchmark"] = {"input_len": 512, "output_len": 32, "range_ratio": 0.1, "length_rule": "vllm",
                      "concurrency": [2, 4, 8, 16, 32], "prompts_multiplier": 2, "warmup": 2}
    r["accuracy"] = {"enabled": False}
    r["telemetry"] = {"interval_s": 0.5}
    r["sim"] = {"speed": 3, "prefill_tokens_per_s": 4288}
    path = tmp_path / "rec-study.yaml"
    path.write_text(yaml.safe_dump(r, sort_keys=False))
    return path


def test_first_run_recommends_the_count_the_study_measures_best(tmp_path):
    recipe = _study_recipe(tmp_path)
    sweep = ["--sweep", "prefill.endpoints=1,2,3,4"]
    code, out = launcher(tmp_path, "submit", str(recipe), *sweep, "--dry-run")
    assert code == 0, out
    dry = [r for r in (tmp_path / "runs").glob("*-study/*") if (r / "plan.json").is_file()]
    assert len(dry) == 4
    for run in dry:  # fits the local profile: 4 nodes of 4 GPUs
        d = json.loads((run / "plan.json").read_text())
        assert d["cluster"] == "local" and d["engine"] == "sim"
        assert len(d["nodes"]) <= 4 and all(n["gpus"] <= 4 for n in d["nodes"])
        assert d["gpu_count"]["decode"] == 2 and d["gpu_count"]["total"] <= 16

    real = tmp_path / "real"
    real.mkdir()
    t0 = time.monotonic()
    code, out = launcher(real, "submit", str(recipe), *sweep, timeout=560)
    took = time.monotonic() - t0
    assert code == 0, out[-3000:]
    (study,) = entries(tmp_path / "real" / "runs")
    runs = sorted(study.runs, key=lambda r: study.values(r)["prefill.endpoints"])
    assert [study.values(r)["prefill.endpoints"] for r in runs] == [1, 2, 3, 4]

    measured: dict[int, float] = {}
    lines = []
    for run in runs:
        assert run.status().state == "succeeded", run.status().error
        assert leftovers(run.path) == []
        s = figures.summary(run.path)
        assert [p["status"] for p in s["points"]] == ["ok"] * 5
        n = study.values(run)["prefill.endpoints"]
        measured[n] = recommend.tok_s_gpu_at_target(s["points"], TARGET)
        lines.append(f"P={n}: {measured[n]:,.0f} tok/s/GPU at >= {TARGET:g} tok/s/user; " +
                     ", ".join(f"c={p['max_concurrency']} {p['total_tokens_per_s_per_gpu']:,.0f}"
                               f"@{p['tokens_per_s_per_user']:.1f}" for p in s["points"]))
    best = max(measured, key=measured.get)
    # Prefill is the bottleneck at low counts: a second prefill endpoint pays for its GPU.
    assert measured[2] > measured[1] * 1.15, lines

    rec = recommend.recommend(runs[0].path, TARGET)
    assert rec is not None, recommend.why_not(runs[0].path, TARGET)
    report = "\n".join(lines + [
        f"measured best: {best} prefill endpoints; study took {took:.0f} s",
        f"recommended from the first run: {rec['prefill_endpoints']} "
        f"(predicted " + ", ".join(f"{c['prefill_endpoints']}: "
                                   f"{c['total_tokens_per_s_per_gpu']:,.0f}"
                                   for c in rec["candidates"]) + ")"])
    print(report, file=sys.stderr)
    assert abs(rec["prefill_endpoints"] - best) <= 1, report
    assert rec["capacities"]["prefill"]["knee"] is not None, report  # run 1 is prefill-bound
    assert rec["ratio"] == f"{rec['prefill_endpoints']}:1"
    # the study measured 1..4 already: the next step is the pick, not the same study again
    P = rec["prefill_endpoints"]
    if P + 1 <= 4:
        assert f"--set prefill.endpoints={P}" in rec["next_command"], rec["next_command"]
        assert "--sweep" not in rec["next_command"]
        assert any(f"Study {study.name} already measured" in a for a in rec["assumptions"])
    else:
        assert "--sweep prefill.endpoints=" in rec["next_command"]
    assert str(runs[0].path / "recipe.yaml") in rec["next_command"]
    assert f"--runs-dir {study.path.parent}" in rec["next_command"]


def test_a_recommendation_says_its_ttft_and_why_its_confidence_is_not_high(synth_root):
    """Issue 28 item 10: a TTFT prediction with its basis, and the reasons behind a
    confidence below high."""
    for run in (synth.prefill_bound(synth_root), synth.kv_capacity_bound(synth_root)):
        rec = recommend.recommend(run)
        pr = rec["predicted"]
        assert 0 < pr["prefill_utilisation"]
        if pr["prefill_utilisation"] < 1:
            assert pr["ttft_s"] >= pr["ttft_floor_s"] > 0
        if rec["confidence"] != "high":
            assert rec["confidence_why"], rec
        text = recommend.render_text(rec)
        assert "  TTFT " in text and "M/D/1" in text, text
        if rec["confidence"] != "high":
            assert f"confidence {rec['confidence']} (" in text, text


# --- issue 41 item 3: an advice carries its caveats; every option says what it does --------


def test_every_option_of_every_command_says_what_it_does():
    import argparse

    from launcher import cli

    missing = []
    for action in cli._parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += [f"{name} {'/'.join(a.option_strings) or a.dest}"
                            for a in sub._actions
                            if not a.help and not isinstance(a, argparse._HelpAction)]
    assert not missing, missing


@pytest.fixture(scope="module")
def prefill_short(synth_root) -> Path:
    """One GB200-scale configuration (4 prefill DEP2 per decode DEP8) whose best count is
    prefill-bound, so its predicted TTFT is unbounded."""
    study = synth.study(synth_root, (4,), decode_dp=8, concurrencies=synth.PUBLISHED_CONCURRENCY,
                        gb200=True, duration_s=240.0, name="gb200-prefill-4")
    (run,) = [p for p in study.iterdir() if p.is_dir()]
    return run


def test_the_cli_prints_every_caveat_of_its_advice(prefill_short, capsys):
    rec = recommend.recommend(prefill_short)
    caveats = rec["caveats"]
    assert any(c.startswith("TTFT unbounded: ") and "% utilised" in c for c in caveats), caveats
    assert any(c.startswith(f"Confidence {rec['confidence']}: ") for c in caveats), caveats
    from launcher import cli

    assert cli.main(["recommend", str(prefill_short)]) == 0
    out = capsys.readouterr().out
    assert "Caveats:" in out
    for c in caveats:
        assert f"! {c}" in out, out


def test_a_diagnosis_that_disagrees_with_the_advice_is_a_caveat():
    from launcher.analysis.diagnose import TITLES, Verdict, VerdictKind

    kv = Verdict("c=64", 64, VerdictKind.KV_CAPACITY, TITLES[VerdictKind.KV_CAPACITY])
    # the demo: 2 prefill endpoints, decode KV full at c=64; the advice 1, prefill-bound
    said = recommend.diagnosis_caveat(kv, 2, "decode", 1, "prefill")
    assert said and "decode KV capacity at c=64" in said and "prefill-bound" in said
    assert recommend.diagnosis_caveat(kv, 2, "decode", 2, "decode") is None
    assert "as prefill-bound, but" in recommend.diagnosis_caveat(kv, 2, "prefill", 3, "prefill")
    xfer = Verdict("c=8", 8, VerdictKind.KV_TRANSFER, TITLES[VerdictKind.KV_TRANSFER])
    assert "not limits" in recommend.diagnosis_caveat(xfer, 2, "decode", 2, "decode")
    ok = Verdict("c=8", 8, VerdictKind.HEALTHY, TITLES[VerdictKind.HEALTHY])
    assert recommend.diagnosis_caveat(ok, 2, "decode", 1, "prefill") is None


def test_a_ttft_target_is_honoured(prefill_short, capsys):
    free = recommend.recommend(prefill_short)
    assert not math.isfinite(free["predicted"]["ttft_s"])
    rec = recommend.recommend(prefill_short, target_ttft_ms=3000)
    P = rec["prefill_endpoints"]
    assert P > free["prefill_endpoints"] and rec["target_ttft_ms"] == 3000
    assert rec["predicted"]["ttft_s"] <= 3.0
    assert not any(c.startswith("TTFT unbounded") for c in rec["caveats"])
    by_p = {c["prefill_endpoints"]: c for c in rec["candidates"]}
    assert by_p[P]["ttft_s"] == rec["predicted"]["ttft_s"]
    assert by_p[P - 1]["ttft_s"] > 3.0  # the next count down misses it
    from launcher import cli

    assert cli.main(["recommend", str(prefill_short), "--target-ttft-ms", "3000"]) == 0
    out = capsys.readouterr().out
    assert "TTFT <= 3,000 ms:" in out and f"  {P} prefill DEP2 per 1 decode DEP8" in out
    floor = free["predicted"]["ttft_floor_s"] * 1000
    why = recommend.why_not(prefill_short, target_ttft_ms=floor / 2)
    assert "below this run's lowest TTFT" in why, why
    assert "positive" in recommend.why_not(prefill_short, target_ttft_ms=-1)
