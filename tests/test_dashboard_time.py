"""Time axes a person reads, live progress and predicted-vs-observed KV capacity.

Time axes: wall-clock time of this host's zone (what events.jsonl, the tables and the logs
say), ticks at round steps listed explicitly, a format with no fraction of a second and no
label twice on one axis, whatever the span; or seconds since the job started."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("streamlit")
import synth  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard import charts, ui  # noqa: E402
from launcher.analysis import derive, load  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
T0 = 1_764_400_000.0
SPANS = (3, 12, 45, 90, 400, 1800, 7200, 30000, 200000)


def x_axes(spec: dict) -> list[dict]:
    """Every x encoding of a (layered) Vega-Lite spec."""
    out = []

    def walk(s):
        if isinstance(s, dict):
            enc = s.get("encoding")
            if isinstance(enc, dict) and "x" in enc:
                out.append(enc["x"])
            for k in ("layer", "hconcat", "vconcat", "concat"):
                for sub in s.get(k, []) or []:
                    walk(sub)

    walk(spec)
    return out


def wall_labels(x: dict) -> list[str]:
    """The tick labels Vega-Lite prints for an x axis with explicit DateTime values."""
    fmt = x["axis"]["format"]
    vals = x["axis"]["values"]
    py = fmt.replace("%b", "%b").replace("%d", "%d")
    return [time.strftime(py, (v["year"], v["month"], v["date"], v["hours"], v["minutes"],
                               v["seconds"], 0, 1, 0)) for v in vals]


@pytest.mark.parametrize("span", SPANS)
def test_wall_clock_ticks_are_round_distinct_and_whole_seconds(span):
    ts = T0 + np.linspace(0, span, 60)
    df = pd.DataFrame({"t": pd.to_datetime(ts, unit="s", utc=True), "value": 1.0,
                       "group": "a"})
    spec = charts.line(df, title="x", y_title="y").to_dict()
    (x,) = {json.dumps(a, sort_keys=True) for a in x_axes(spec)}  # one axis for all layers
    x = json.loads(x)
    assert x["type"] == "temporal" and x["scale"]["type"] == "utc"
    assert "%L" not in x["axis"]["format"] and "." not in x["axis"]["format"]
    labels = wall_labels(x)
    assert 2 <= len(labels) <= charts.MAX_TICKS + 1
    assert len(set(labels)) == len(labels), labels  # nothing repeated
    assert not any(re.fullmatch(r"[.:]?\d{1,3}", lab) for lab in labels), labels
    step = charts.tick_step(span)
    secs = [time.mktime((v["year"], v["month"], v["date"], v["hours"], v["minutes"],
                         v["seconds"], 0, 1, 0)) for v in x["axis"]["values"]]
    assert all(s % step == 0 for s in secs)  # on round clock times of the local wall clock


def test_wall_clock_is_this_hosts_local_time(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        df = pd.DataFrame({"t": pd.to_datetime([T0, T0 + 600], unit="s", utc=True),
                           "value": [1.0, 2.0], "group": "a"})
        chart = charts.line(df, title="x", y_title="y")
        d = chart.to_dict()
        (x,) = x_axes(d)
        assert x["axis"]["title"] == "time (IST, UTC+05:30)"
        # T0 is 07:06:40 UTC: drawn at 12:36:40, as fmt_time prints it on this host
        drawn = chart.data["t"].iloc[0]
        assert time.strftime("%H:%M:%S", time.gmtime(drawn / 1000)) == "12:36:40"
        assert ui.fmt_time(T0).endswith("12:36:40")
        assert chart.data["when"].iloc[0] == "12:36:40"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_seconds_since_job_start():
    clock = charts.Clock(origin=T0 - 100)
    df = pd.DataFrame({"t": pd.to_datetime(T0 + np.arange(0, 300, 5), unit="s", utc=True),
                       "value": 1.0, "group": "a"})
    w = pd.DataFrame({"label": ["c=8"], "start": pd.to_datetime([T0 + 20], unit="s", utc=True),
                      "end": pd.to_datetime([T0 + 80], unit="s", utc=True)})
    spec = charts.line(df, title="x", y_title="y", windows=w, clock=clock).to_dict()
    xs = x_axes(spec)
    assert {x["type"] for x in xs} == {"quantitative"}
    x = xs[-1]
    assert x["axis"]["title"] == "seconds since job start"
    vals = x["axis"]["values"]
    assert vals[0] >= 100 and all(v % charts.tick_step(295) == 0 for v in vals)
    assert x["axis"]["format"] == ",d"


def test_heatmap_and_timeline_use_the_same_clock():
    h = pd.DataFrame({"t": pd.to_datetime(T0 + np.arange(0, 60, 5), unit="s", utc=True),
                      "value": 0.5, "e": "x"})
    (x,) = x_axes(charts.heatmap(h, title="h", y="e", color_title="v", bin_s=5).to_dict())
    assert x["axis"]["format"] == "%H:%M:%S" and len(x["axis"]["values"]) >= 2
    tl = pd.DataFrame({"stage": ["a", "b"], "start": [T0, T0 + 100], "end": [T0 + 100, T0 + 900],
                       "seconds": [100, 800]})
    (x,) = x_axes(charts.timeline(tl).to_dict())
    assert x["axis"]["format"] == "%H:%M"


def open_page(root: Path, run: str, page: str, monkeypatch) -> AppTest:
    monkeypatch.setenv(ui.RUNS_ENV, str(root))
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["run"] = run
    at.run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("time")
    return {"healthy": synth.healthy(root), "live": synth.live(root / "live", index=2)}


def test_every_time_axis_of_the_kv_page(runs, monkeypatch):
    at = open_page(runs["healthy"].parent, runs["healthy"].name, "app_pages/kv_cache.py",
                   monkeypatch)
    n = 0
    for c in at.get("vega_lite_chart"):
        for x in x_axes(json.loads(c.proto.spec)):
            if x.get("type") == "temporal":
                n += 1
                labels = wall_labels(x)
                assert len(set(labels)) == len(labels) and len(labels) >= 2, labels
                assert x["axis"]["title"].startswith("time (")
    assert n >= 6
    # the sidebar switch: seconds since the job started (run.json's `started`)
    at.radio(key="time_axis").set_value(charts.ELAPSED).run()
    assert not at.exception
    xs = [x for c in at.get("vega_lite_chart") for x in x_axes(json.loads(c.proto.spec))
          if x.get("axis", {}).get("title") == "seconds since job start"]
    assert len(xs) >= 6
    # the synthetic run's telemetry starts 130 s after its orchestrator (run.json started)
    assert min(v for x in xs for v in x["axis"]["values"]) >= 120


def test_progress_view_counts_down():
    now = 1000.0
    p = {"sweep": {"index": 3, "total": 5, "concurrency": 64, "started": 940.0,
                   "seconds_left": 300}, "loading": {"decode-0@n1": 1.0, "prefill-0@n2": 0.25}}
    v = load.progress_view(p, now)
    assert v["sweep"]["index"] == 3 and v["sweep"]["running_s"] == 60.0
    assert v["sweep"]["left_s"] == 240.0 and v["sweep"]["fraction"] == 0.4
    assert v["loading"] == [("decode-0@n1", 1.0), ("prefill-0@n2", 0.25)] and v["loaded"] == 1
    first = load.progress_view({"sweep": {"index": 1, "total": 4, "started": 990.0,
                                          "seconds_left": None}}, now)
    assert first["sweep"]["left_s"] is None and not first["sweep"]["estimated"]
    assert load.progress_view({}, now) == {} and load.progress_view(None, now) == {}
    assert load.progress_view({"sweep": {"index": 1}}, now) == {}  # no total: nothing to say


def test_live_run_shows_sweep_and_loading_progress(runs, monkeypatch):
    live = runs["live"]
    synth.set_progress(live, 2, 4, seconds_left=200,
                       loading={"decode-0@node01": 1.0, "prefill-0@node02": 0.5,
                                "prefill-1@node02": 0.0})
    at = open_page(live.parent, live.name, "app_pages/overview.py", monkeypatch)
    assert any("refreshes every" in i.value for i in at.info)
    bars = at.get("progress")
    texts = [b.proto.text for b in bars]
    assert any(t.startswith("Sweep point 2 of 4 (max concurrency 16)") and "left" in t
               for t in texts), texts
    assert "prefill-0@node02: 50%" in texts and "prefill-1@node02: 0%" in texts
    synth.set_progress(live, 3, 4, loading={"decode-0@node01": 1.0})
    at = open_page(live.parent, live.name, "app_pages/overview.py", monkeypatch)
    assert any(b.proto.text.startswith("Sweep point 3 of 4") for b in at.get("progress"))
    # the other pages say it in one line above their content
    at = open_page(live.parent, live.name, "app_pages/kv_cache.py", monkeypatch)
    assert any("sweep point 3 of 4 (c=32)" in c.value for c in at.caption)


def test_predicted_capacity_reads_old_and_new_keys():
    from launcher.run.plandoc import PlanDoc

    plan = PlanDoc.from_json(synth.make_plan("r1", synth.Scenario("p", topology=synth.Topology(
        n_prefill=1, prefill_dp=1, decode_dp=4))))
    new = derive.predicted_capacity([{
        "name": "decode-0", "dp": 4, "per_rank_at_mean_length": 12,
        "endpoint_at_mean_length": 48, "endpoint_at_max_length": 40, "num_gpu_blocks": 900,
        "block_size": 16, "lengths": {"mean_total": 1200}, "assumptions": ["a", "b"]}], plan)
    assert new == [{"endpoint": "decode-0", "per_endpoint": 48.0,
                    "per_endpoint_at_max_length": 40.0, "per_rank": 12.0,
                    "tokens_per_request": 1200.0, "blocks_per_rank": 900.0, "block_size": 16.0,
                    "dp": 4.0, "assumptions": ["a", "b"]}]
    old = derive.predicted_capacity([{"endpoint": "decode-0", "gpus": 4, "max_concurrency": 40,
                                      "tokens_per_request": 9216, "assumptions": "8 GiB reserve",
                                      "facts_from": "config.json"}], plan)
    assert old[0]["per_rank"] == 10.0 and old[0]["per_rank_derived"]
    assert old[0]["assumptions"] == ["8 GiB reserve", "facts from config.json"]
    assert derive.predicted_capacity([{"unknown": 1}, "junk", {"name": "x"}], plan) == \
        [{"endpoint": "x"}]


def test_kv_page_compares_predicted_and_observed_capacity(runs, monkeypatch):
    at = open_page(runs["healthy"].parent, runs["healthy"].name, "app_pages/kv_cache.py",
                   monkeypatch)
    cap = next(t.value for t in at.table if "" in t.value.columns
               and "decode-0" in t.value.columns)
    rows = dict(zip(cap[""], cap["decode-0"], strict=True))
    per_rank = synth.PREDICTED_BLOCKS * synth.BLOCK_SIZE // (synth.ISL + synth.OSL)
    assert rows["per DP rank, predicted"] == f"{per_rank:,.1f}"
    assert rows["KV blocks per DP rank, vLLM (num_gpu_blocks)"] == f"{synth.DECODE_BLOCKS:,}"
    observed = float(rows["per DP rank, observed"].replace(",", ""))
    assert 10 < observed < 60  # ~16 requests per rank at ~70 % KV at the top point
    # the endpoint's figure is its ranks' sum, the rank's figure its share (they agree)
    plan = json.loads((runs["healthy"] / "plan.json").read_text())
    dp = next(e["dp_size"] for e in plan["endpoints"] if e["name"] == "decode-0")
    endpoint = float(rows["concurrent requests, observed (top sweep point)"].replace(",", ""))
    assert abs(endpoint - observed * dp) <= 1, (endpoint, observed, dp)
    body = "\n".join(m.value for m in at.markdown)
    assert "extrapolated: running ÷ KV usage" in body
    assert "prediction assumes: every request reaches ISL + OSL tokens" in body


def test_a_legend_of_long_endpoint_names_fits_a_half_page_column_at_1280_px():
    """Half of the 818 px main column at 1280 px is 402 px: a legend of 'decode-0@local-1'
    names gets the columns that fit there (3 of them made the chart 426 px wide)."""
    from dashboard.charts import legend_columns

    labels = pd.Series([f"{r}-{i}@local-1" for r in ("decode", "prefill") for i in range(3)])
    n = legend_columns(labels)
    assert n >= 1 and n * (labels.str.len().max() * 7 + 30) <= 402 - 40, n
