"""Loaders and derived metrics on data written through the real telemetry store."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import plan_doc

from launcher.analysis import derive, load
from launcher.telemetry.store import ChangeFilter, SampleWriter

# decode-0 DEP4 on node n1 (one prefill DP1 on n2), as the planner makes it.
PLAN = plan_doc(1, decode_dp=4, prefill_dp=1, nodes=["n1", "n2"])


def write_series(run: Path, t: np.ndarray, series: dict[tuple[str, str], np.ndarray]) -> None:
    """Dense per-second series -> the store, through the agent's change-point filter."""
    f = ChangeFilter()
    w = SampleWriter(run / "telemetry" / "n1")
    for k, ts in enumerate(t):
        items = [((name, labels), float(v[k])) for (name, labels), v in series.items()]
        for ts_w, (name, labels), value in f.step(float(ts), items):
            w.write([(ts_w, "n1", "decode-0@n1", "0", name, labels, value)])
    for ts_w, (name, labels), value in f.pending():
        w.write([(ts_w, "n1", "decode-0@n1", "0", name, labels, value)])
    w.close()


@pytest.fixture
def run(tmp_path) -> tuple[Path, np.ndarray, dict]:
    t = 1_000_000.0 + np.arange(600.0)
    rng = np.random.default_rng(1)
    # A gauge that is flat for long stretches (few rows stored) and then moves.
    kv = np.where(t < t[0] + 200, 0.25, 0.25 + 0.5 * (t - t[0] - 200) / 400)
    kv = np.round(kv, 3)
    # A counter that restarts at t0+400 (the engine was restarted).
    inc = rng.integers(0, 5, len(t)).astype(float)
    c = np.cumsum(inc)
    c[400:] = np.cumsum(inc[400:])
    dense = {("vllm:kv_cache_usage_perc", "{}"): kv, ("vllm:generation_tokens_total", "{}"): c}
    write_series(tmp_path, t, dense)
    return tmp_path, t, {"kv": kv, "c": c, "inc": inc}


def test_change_points_interpolate_back_to_every_sample(run):
    path, t, d = run
    df = load.read_telemetry(path)
    assert len(df) < 2 * len(t)  # the flat stretch is stored as a few rows, not 200
    ss = derive.SeriesSet(df, PLAN)
    kv = ss.select("vllm:kv_cache_usage_perc", "decode").index
    assert list(ss.meta.loc[kv, "endpoint"]) == ["decode-0"]
    got = ss.values_at(kv, t)[0]
    np.testing.assert_allclose(got, d["kv"], atol=1e-9)
    # Before the first row and after the last row + HOLD_S: no data, not a made-up value.
    out = ss.values_at(kv, np.array([t[0] - 10, t[-1] + derive.HOLD_S + 5]))[0]
    assert np.isnan(out).all()


def test_counter_increase_counts_across_a_restart(run):
    path, t, d = run
    ss = derive.SeriesSet(load.read_telemetry(path), PLAN)
    ids = ss.select("vllm:generation_tokens_total").index
    # Over a window without the restart: exact.
    assert ss.increase(ids, t[10], t[300])[0] == pytest.approx(d["inc"][11:301].sum())
    # Across the restart: the drop is added back, never negative.
    total = ss.increase(ids, t[300], t[500])[0]
    assert total == pytest.approx(d["inc"][301:501].sum(), abs=5)


def test_binned_gauge_means_and_counter_rates(run):
    path, t, d = run
    ss = derive.SeriesSet(load.read_telemetry(path), PLAN)
    bins = derive.Bins.over(t[0], t[-1], 60)
    assert bins.n <= 60 and bins.width == 10
    kv = ss.select("vllm:kv_cache_usage_perc").index
    m = derive.gauge_bins(ss, kv, bins)[0]
    i = int((t[0] + 100 - bins.t0) // bins.width)
    assert m[i] == pytest.approx(0.25)  # a flat stretch averages to its value
    rates = derive.counter_bins(ss, ss.select("vllm:generation_tokens_total").index, bins)[0]
    k = int((t[100] - bins.t0) // bins.width)
    lo = int(bins.edges[k] - t[0])
    assert rates[k] == pytest.approx(d["inc"][lo + 1:lo + 11].sum() / 10, rel=1e-6)


def test_gap_in_the_store_is_no_data(tmp_path):
    w = SampleWriter(tmp_path / "telemetry" / "n1")
    w.write([(1000.0, "n1", "decode-0@n1", "0", "vllm:num_requests_running", "{}", 5.0),
             (1010.0, "n1", "decode-0@n1", "0", "vllm:num_requests_running", "{}", 5.0),
             (1300.0, "n1", "decode-0@n1", "0", "vllm:num_requests_running", "{}", 7.0)])
    w.close()
    ss = derive.SeriesSet(load.read_telemetry(tmp_path), PLAN)
    v = ss.values_at([0], np.array([1005.0, 1150.0, 1300.0]))[0]
    assert v[0] == 5.0 and math.isnan(v[1]) and v[2] == 7.0


def test_hist_quantile_interpolates_like_prometheus():
    les = ["1.0", "2.0", "4.0", "+Inf"]
    cum = np.array([10.0, 30.0, 40.0, 40.0])
    assert derive.hist_quantile(les, cum, 0.5) == pytest.approx(1.5)
    assert derive.hist_quantile(les, cum, 0.375) == pytest.approx(1.0 + 5 / 20)
    assert derive.hist_quantile(les, cum, 0.05) == pytest.approx(0.2)  # 0 + 1 × 2/10
    # All mass above the last finite bound: that bound, as Prometheus does.
    assert derive.hist_quantile(les, np.array([0, 0, 0, 5.0]), 0.99) == 4.0
    assert math.isnan(derive.hist_quantile(les, np.zeros(4), 0.5))


def test_pareto_frontier_keeps_unbeaten_points():
    df = pd.DataFrame({"x": [10, 20, 30, 40, 25, 5], "y": [100, 90, 60, 20, 50, 80]})
    f = derive.pareto_frontier(df, "x", "y")
    assert list(zip(f["x"], f["y"], strict=True)) == [(10, 100), (20, 90), (30, 60), (40, 20)]


def test_fingerprint_changes_only_when_files_change(tmp_path):
    (tmp_path / "a.log").write_text("one\n")
    fp = load.fingerprint(tmp_path)
    assert load.fingerprint(tmp_path) == fp
    time.sleep(0.01)
    with open(tmp_path / "a.log", "a") as f:
        f.write("two\n")
    assert load.fingerprint(tmp_path) != fp


def test_tail_reads_the_end_of_a_big_log(tmp_path):
    p = tmp_path / "x.log"
    p.write_text("".join(f"line {i}\n" for i in range(200_000)))
    assert load.tail(p, 3, max_bytes=4096) == ["line 199997", "line 199998", "line 199999"]


def test_torn_plan_is_explained_not_raised(tmp_path):
    run = tmp_path / "20250101-000000-x"
    run.mkdir()
    (run / "plan.json").write_text('{"schema_version": 1, "endpo')
    info = load.run_info(run)
    assert info.topology == "—" and info.plan_error and "plan.json" in info.plan_error
    assert load.list_run_dirs(tmp_path) == [run]


def test_topology_text_names_the_shape(tmp_path):
    from launcher.control import prepare
    from launcher.run.plandoc import read_plan
    from launcher.schema import recipe

    p = prepare.prepare(recipe.load("qwen3.5-397b-gb200-disagg"), tmp_path)
    assert read_plan(p.run.plan).topology() == "1 decode DEP8 + 4 prefill DEP2 (16 GPUs)"


def test_incremental_reader_matches_a_full_read(tmp_path):
    """A live run: rows keep arriving; the reader re-reads only the recent part and ends
    up with exactly what a full read gives."""
    w = SampleWriter(tmp_path / "telemetry" / "n1", rotate_bytes=2000)
    reader = load.TelemetryReader(tmp_path, names=("vllm:num_requests_running",))

    def rows(a: int, b: int) -> list[tuple]:
        return [(1000.0 + t, "n1", "decode-0@n1", e, "vllm:num_requests_running", "{}",
                 float(t % 7)) for t in range(a, b) for e in ("0", "1")]

    w.write(rows(0, 400))
    w.flush()
    first = reader.read()
    assert len(first) == 800
    w.write(rows(400, 700))
    w.flush()
    again = reader.read()
    full = load.read_telemetry(tmp_path, names=("vllm:num_requests_running",))
    w.close()
    assert reader.reads == 2
    cols = ["ts", "process", "engine", "value"]
    pd.testing.assert_frame_equal(
        again[cols].astype({"process": str, "engine": str}).reset_index(drop=True),
        full[cols].astype({"process": str, "engine": str}).reset_index(drop=True))
    ss = derive.SeriesSet(again, PLAN)
    assert len(ss) == 2 and ss.t_range == (1000.0, 1699.0)


def test_energy_per_token_comes_from_the_energy_counter_of_the_working_gpus():
    """Two decode GPUs at 500 W and an idle GPU of the allocation at 100 W, sampled every 5 s
    as the agent does: the window's energy counts the working GPUs for J per token and all
    three for the allocation; without the counter the figures are absent (NaN), not 0."""
    t = 1_000_000.0 + np.arange(0.0, 121.0, 5.0)
    rows = []
    for idx, (proc, watts) in enumerate((("decode-0@n1", 500.0), ("decode-0@n1", 500.0),
                                         ("", 100.0))):
        labels = f'{{"index":"{idx}","uuid":"GPU-{idx}"}}'
        for ts in t:
            rows.append((ts, "n1", proc, "", "gpu:energy_mj", labels,
                         7e9 + watts * (ts - t[0]) * 1000.0))
    df = pd.DataFrame(rows, columns=["ts", "node", "process", "engine", "name", "labels", "value"])
    ss = derive.SeriesSet(df, PLAN)
    point = {"max_concurrency": 8, "window_start": t[0] + 12.5, "window_end": t[0] + 102.5,
             "completed": 450, "total_output_tokens": 90_000}
    row = derive.point_table([point], PLAN, ss).iloc[0]
    assert row["energy_decode_j"] == pytest.approx(2 * 500 * 90.0)
    assert row["energy_j"] == pytest.approx(90_000.0) and math.isnan(row["energy_prefill_j"])
    assert row["energy_allocated_j"] == pytest.approx(99_000.0)
    assert row["joules_per_output_token"] == pytest.approx(1.0)
    assert row["joules_per_request"] == pytest.approx(200.0)
    bare = derive.point_table([point], PLAN, derive.SeriesSet(df.iloc[0:0], PLAN)).iloc[0]
    assert math.isnan(bare["joules_per_output_token"]) and math.isnan(bare["energy_j"])


def test_a_selection_asked_again_is_the_same_and_others_are_their_own():
    """select() keeps what it found per set: asked again it gives the same series; a
    different name, role or label gives that one's, as a set asked first would."""
    rows = []
    for proc, name, labels in (("decode-0@n1", "vllm:kv_cache_usage_perc", "{}"),
                               ("prefill-0@n2", "vllm:kv_cache_usage_perc", "{}"),
                               ("decode-0@n1", "vllm:num_requests_waiting_by_reason",
                                '{"reason":"capacity"}'),
                               ("decode-0@n1", "vllm:num_requests_waiting_by_reason",
                                '{"reason":"deferred"}')):
        rows.append((1.0, proc.split("@")[1], proc, "0", name, labels, 1.0))
    df = pd.DataFrame(rows, columns=["ts", "node", "process", "engine", "name", "labels", "value"])

    def asked(ss, *args, **labels):
        return [(r.process, r.labels) for r in ss.select(*args, **labels).itertuples()]

    queries = [(("vllm:kv_cache_usage_perc",), {}),
               (("vllm:kv_cache_usage_perc", "decode"), {}),
               (("vllm:kv_cache_usage_perc", "prefill"), {}),
               (("vllm:num_requests_waiting_by_reason",), {"reason": "capacity"}),
               (("vllm:num_requests_waiting_by_reason",), {"reason": "deferred"}),
               ((("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting_by_reason"),), {})]
    kept = derive.SeriesSet(df, PLAN)
    for args, labels in queries * 2:
        assert asked(kept, *args, **labels) == asked(derive.SeriesSet(df, PLAN), *args,
                                                     **labels), (args, labels)
    assert asked(kept, "vllm:kv_cache_usage_perc", "prefill") == [("prefill-0@n2", "{}")]
    assert asked(kept, "vllm:num_requests_waiting_by_reason", reason="deferred") == [
        ("decode-0@n1", '{"reason":"deferred"}')]
