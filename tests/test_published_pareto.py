"""The published Pareto as reference data, throughput per working and per allocated GPU, and
the comparison of a run or study with the published curves (launcher.run.published).

Source of the reference points: the vLLM blog post "vLLM Reaches 25K Total TPS/GPU on
Qwen3.5" (2026-08-06; vllm-project/vllm-project.github.io, _posts/2026-08-06-qwen35-25k-tps.md),
Figure 1, read off the figure at about +-0.3k tok/s/GPU ("~": harder to read). Its y divides
by the working GPUs (srt-slurm PR #270). The table below is that reading, as text.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import synth
from browser.drawn import drawn, now, open_page
from helpers import stop, streamlit_healthy

from launcher.run import figures, listing, published
from launcher.run.plandoc import PlanDoc, read_plan

# config | working GPUs | allocated GPUs (4-GPU nodes) | points: cc<N> <tok/s/GPU>k@<tok/s/user>
READING = """
4xDEP2 | 16 | 16 | cc64 2.6k@77, cc128 4.6k@70, cc256 8.0k@62, cc512 13.3k@53, cc1024 20.4k@42, cc4096 21.9k@39, cc5120 21.7k@42
5xDEP2 | 18 | 20 | cc64 ~2.2k@76, cc128 ~4.0k@70, cc256 ~7.0k@61, cc512 11.9k@52, cc1024 18.7k@41, cc3072 24.0k@34, cc4096 23.7k@34
6xDEP2 | 20 | 20 | cc64 ~2.1k@77, cc128 ~3.8k@70, cc256 ~6.4k@62, cc512 ~10.9k@53, cc1024 16.9k@41, cc2048 23.8k@29, cc3072 25.2k@25, cc4096 24.9k@27, cc5120 25.8k@25.5
7xDEP2 | 22 | 24 | cc64 ~1.9k@77, cc256 ~5.9k@62, cc512 ~9.9k@52, cc1024 15.4k@41, cc2048 21.9k@29, cc3072 24.8k@22, cc4096 25.6k@17
8xDEP2 | 24 | 24 | cc64 ~1.8k@77, cc256 ~5.4k@62, cc512 ~9.1k@52, cc1024 14.2k@41, cc2048 20.2k@29, cc3072 22.7k@22, cc4096 23.6k@17
"""
POINT = re.compile(r"cc(\d+) (~?)([\d.]+)k@([\d.]+)")


def reading() -> dict[str, dict]:
    out = {}
    for line in READING.strip().splitlines():
        name, working, allocated, pts = (x.strip() for x in line.split("|"))
        out[name] = {"working": int(working), "allocated": int(allocated), "points": [
            (int(c), round(float(v) * 1000), float(u), bool(a))
            for c, a, v, u in POINT.findall(pts)]}
    return out


def test_reference_data_matches_the_reading_and_states_its_source():
    ref = published.reference()
    assert ref["source"]["repository"] == "vllm-project/vllm-project.github.io"
    assert ref["source"]["path"] == "_posts/2026-08-06-qwen35-25k-tps.md"
    assert "#270" in ref["source"]["denominator"]
    assert ref["precision"]["read_off_figure"] is True
    assert ref["precision"]["tokens_per_s_per_gpu_abs"] == 300
    assert (ref["workload"]["input_len"], ref["workload"]["output_len"]) == (8192, 1024)
    want = reading()
    got = {c["name"]: c for c in published.configurations()}
    assert list(got) == list(want)
    for name, w in want.items():
        c = got[name]
        assert (c["working_gpus"], c["allocated_gpus"]) == (w["working"], w["allocated"])
        assert c["working_gpus"] == c["prefill_endpoints"] * 2 + 8
        assert [(p["concurrency"], p["total_tokens_per_s_per_gpu"], p["tokens_per_s_per_user"],
                 p["approximate"]) for p in c["points"]] == w["points"], name
    assert "±0.3k" in published.precision_text()


def _plan(n_prefill: int, decode_dp: int = 8, **kw) -> PlanDoc:
    """plan.json of N prefill DEP2 + 1 decode DEP`decode_dp`, by the real planner on 4-GPU
    nodes (tests/synth.make_plan)."""
    sc = synth.Scenario("p", topology=synth.Topology(n_prefill=n_prefill, decode_dp=decode_dp),
                        concurrencies=(64, 3072), **kw)
    return PlanDoc.from_json(synth.make_plan(f"p{n_prefill}", sc))


@pytest.mark.parametrize("n", [4, 5, 6, 7, 8])
def test_working_and_allocated_gpus_of_each_published_configuration(n):
    plan = _plan(n)
    c = published.config_by_prefill(n)
    assert plan.gpus() == c["working_gpus"]
    assert figures.allocated_gpus(plan) == c["allocated_gpus"]
    assert len(plan.nodes) == c["prefill_nodes"] + c["decode_nodes"]
    match, why = published.comparable(plan)
    assert match is not None and match.name == f"{n}xDEP2" and match.simulated, why


def test_figures_give_both_per_gpu_numbers_for_5xdep2():
    """5 x DEP2 + DEP8 on 4-GPU nodes: 18 GPUs work, 20 are allocated (one prefill node
    runs one DEP2 and leaves 2 GPUs idle)."""
    plan = _plan(5)
    den = figures.gpu_denominators(plan)
    assert den["gpus_total"] == 18 and figures.allocated_gpus(plan) == 20
    p = {"max_concurrency": 3072, "duration": 100.0, "completed": 1000,
         "total_input_tokens": 1000 * 8192, "total_output_tokens": 1000 * 1024,
         "median_tpot_ms": 30.0, "status": "ok"}
    f = figures.point_figures(p, den, "disagg", figures.allocated_gpus(plan))
    # 9,216,000 tokens / 100 s = 92,160 tok/s; / 18 working = 5,120; / 20 allocated = 4,608
    assert f["total_tokens_per_s_per_gpu"] == pytest.approx(5120.0)
    assert f["total_tokens_per_s_per_allocated_gpu"] == pytest.approx(4608.0)
    assert f["gpus_allocated"] == 20 and f["denominators"]["gpus_total"] == 18
    assert "working" in figures.PER_GPU["total_tokens_per_s_per_gpu"]
    assert "allocated" in figures.PER_GPU["total_tokens_per_s_per_allocated_gpu"]
    # not given: None, never a guess; given as 0: None with the reason
    assert figures.point_figures(p, den)["total_tokens_per_s_per_allocated_gpu"] is None
    assert "no nodes" in figures.point_figures(p, den, "disagg", 0)["not_applicable"][
        "total_tokens_per_s_per_allocated_gpu"]


def test_comparable_only_for_the_published_workload():
    assert published.comparable(_plan(5, decode_dp=4))[1].startswith("decode is 1 x DEP4")
    assert "prefill endpoints" in published.comparable(_plan(3))[1]
    assert published.comparable(None)[0] is None
    doc = synth.make_plan("x", synth.Scenario("x", topology=synth.Topology(n_prefill=5,
                                                                            decode_dp=8)))
    doc["workload"]["input_len"] = 1024  # plan.json's record of what every point sends
    assert "ISL/OSL 1024/1024" in published.comparable(PlanDoc.from_json(doc))[1]
    doc["workload"].update(input_len=8192, length_rule="vllm")
    assert "vLLM's rule" in published.comparable(PlanDoc.from_json(doc))[1]
    doc["workload"].update(length_rule="sa-bench", chat_template=False)
    assert "without the chat template" in published.comparable(PlanDoc.from_json(doc))[1]
    del doc["workload"]  # a plan from before the rule was recorded: vLLM's rule then
    assert "vLLM's rule" in published.comparable(PlanDoc.from_json(doc))[1]
    doc = synth.make_plan("x", synth.Scenario("x", topology=synth.Topology(n_prefill=5,
                                                                            decode_dp=8)))
    doc["engine"], doc["engine_platform"] = "vllm", "cpu"
    assert "CPU" in published.comparable(PlanDoc.from_json(doc))[1]


def test_ratios_per_concurrency_without_interpolation():
    c = published.config_by_prefill(5)
    pts = [{"max_concurrency": 3072, "status": "ok", "total_tokens_per_s_per_gpu": 12000.0,
            "total_tokens_per_s_per_allocated_gpu": 10800.0, "tokens_per_s_per_user": 30.0},
           {"max_concurrency": 2048, "status": "ok", "total_tokens_per_s_per_gpu": 9000.0},
           {"max_concurrency": 1024, "status": "failed", "failure_reason": "HTTP 503",
            "total_tokens_per_s_per_gpu": None}]
    rows = {r["concurrency"]: r for r in published.ratios(c, pts)}
    assert rows[3072]["ratio"] == pytest.approx(0.5)  # 12,000 / 24,000
    assert rows[3072]["ratio_low"] == pytest.approx(12000 / 24300)
    assert rows[3072]["ratio_high"] == pytest.approx(12000 / 23700)
    assert rows[3072]["measured_per_allocated_gpu"] == 10800.0
    assert rows[2048]["ratio"] is None and "no published point at c=2048" in rows[2048]["note"]
    assert "not interpolated" in rows[2048]["note"]
    assert rows[1024]["ratio"] is None and "HTTP 503" in rows[1024]["note"]
    assert rows[4096]["note"] == "not measured in this run"
    assert rows[64]["approximate"] and "hard to read" in rows[64]["note"] or \
        rows[64]["note"] == "not measured in this run"


# --- a simulated study of the five configurations --------------------------------------------


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("published")
    return synth.published_study(root)


@pytest.fixture(scope="module")
def study(study_dir) -> listing.Study:
    (s,) = [e for e in listing.entries(study_dir.parent) if isinstance(e, listing.Study)]
    return s


def _summaries(study) -> dict[int, dict]:
    out = {}
    for r in study.runs:
        n = study.values(r)["prefill.endpoints"]
        out[n] = figures.summary(r.path)
    return out


def test_summary_of_the_simulated_5xdep2_run_names_both(study):
    s = _summaries(study)[5]
    assert s["denominators"]["gpus_total"] == 18 and s["gpus_allocated"] == 20
    assert set(s["per_gpu"]) >= {"total_tokens_per_s_per_gpu",
                                 "total_tokens_per_s_per_allocated_gpu"}
    for p in s["points"]:
        assert p["total_tokens_per_s_per_allocated_gpu"] == pytest.approx(
            p["total_tokens_per_s_per_gpu"] * 18 / 20)
    assert figures.summary_problem(s) is None
    text = figures.summary_table(s, width=200)
    assert "(working)" in text and "(allocated)" in text and "allocated 20" in text
    six = figures.summary_table(_summaries(study)[6], width=200)
    assert "(working)" in six and "(allocated)" not in six  # 20 = 20: one figure


def test_study_page_draws_the_published_curves_and_ratios(study, monkeypatch):
    pytest.importorskip("streamlit")
    import pyarrow as pa
    from streamlit.testing.v1 import AppTest

    from dashboard import ui

    app = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
    monkeypatch.setenv(ui.RUNS_ENV, str(study.path.parent))
    at = AppTest.from_file(app, default_timeout=180)
    at.query_params["study"] = study.name
    at.run()
    at.switch_page("app_pages/study.py").run()
    assert not at.exception, [e.value for e in at.exception]
    chart = at.get("vega_lite_chart")[0]
    # the chart's title stays short enough not to be cut; its precision is in the captions
    assert json.loads(chart.proto.spec)["title"].endswith("and the published Pareto")
    rows = []
    for d in chart.proto.datasets:
        rows += pa.ipc.open_stream(d.data.data).read_all().to_pylist()
    ref = [r for r in rows if r.get("published")]
    assert {r["published"].split()[0] for r in ref} == {f"{n}xDEP2" for n in range(4, 9)}
    assert len(ref) == sum(len(c["points"]) for c in published.configurations())
    warnings = " ".join(str(w.value) for w in at.warning)
    assert "SIMULATION" in warnings and "ratios" in warnings
    captions = " ".join(str(c.value) for c in at.caption)
    assert "read off Figure 1" in captions and "±0.3k" in captions
    assert "nothing is interpolated" in captions
    table = next(d.value for d in at.dataframe
                 if "ratio measured ÷ published" in d.value.columns)
    s5 = _summaries(study)[5]
    measured = next(p for p in s5["points"] if p["max_concurrency"] == 3072)
    row = table[(table["published as"] == "5xDEP2") & (table["max concurrency"] == 3072)].iloc[0]
    assert row["ratio measured ÷ published"] == pytest.approx(
        measured["total_tokens_per_s_per_gpu"] / 24000)
    assert row["measured tok/s per allocated GPU"] == pytest.approx(
        measured["total_tokens_per_s_per_allocated_gpu"])
    grid = next(d.value for d in at.dataframe if "published as" in d.value.columns
                and "c=3072" in d.value.columns)
    g5 = grid[grid["published as"] == "5xDEP2"].iloc[0]
    assert g5["c=3072"] == f"{measured['total_tokens_per_s_per_gpu'] / 24000:.2f}"
    assert g5["c=2048"] == "no published point"
    assert grid[grid["published as"] == "4xDEP2"].iloc[0]["c=5120"] == "not measured"
    gap = table[(table["published as"] == "5xDEP2") & (table["max concurrency"] == 2048)]
    assert "no published point at c=2048" in gap.iloc[0]["note"]
    # the Configurations table's GPUs column: working / allocated
    cfg = next(d.value for d in at.dataframe if "GPUs" in d.value.columns
               and "topology" in d.value.columns)
    assert list(cfg["GPUs"]) == ["16 / 16", "18 / 20", "20 / 20", "22 / 24", "24 / 24"]


def test_study_page_says_why_a_study_is_not_compared(tmp_path, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from dashboard import ui

    sdir = synth.study(tmp_path, duration_s=120.0)
    app = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
    monkeypatch.setenv(ui.RUNS_ENV, str(tmp_path))
    at = AppTest.from_file(app, default_timeout=180)
    at.query_params["study"] = sdir.name
    at.run()
    at.switch_page("app_pages/study.py").run()
    assert not at.exception
    captions = " ".join(str(c.value) for c in at.caption)
    assert "is not drawn" in captions and "the published decode is 1 x DEP8" in captions
    assert not any("ratio measured ÷ published" in d.value.columns for d in at.dataframe)


def test_report_holds_the_published_curves_and_ratios(study):
    from launcher import report

    text = report.write_report(study.path).read_text()
    assert "Against the published Pareto" in text and "SIMULATION" in text
    assert "read off Figure 1" in text and "±0.3k" in text
    assert text.count('class="pt ref"') == sum(len(c["points"])
                                               for c in published.configurations())
    assert "published 5xDEP2" in text and "GPUs working / allocated" in text
    assert "<td>18 / 20</td>" in text
    measured = next(p for p in _summaries(study)[5]["points"] if p["max_concurrency"] == 3072)
    ratio = measured["total_tokens_per_s_per_gpu"] / 24000
    assert f'data-key="published.ratio" data-value="{ratio!r}">{ratio:,.2f}<' in text
    assert "no published point at c=2048 for 5xDEP2" in text
    run5 = next(r for r in study.runs if study.values(r)["prefill.endpoints"] == 5)
    rtext = report.write_report(run5.path).read_text()
    assert "Against the published Pareto" in rtext and "tok/s per allocated GPU" in rtext
    assert 'data-key="total_tokens_per_s_per_allocated_gpu"' in rtext
    assert read_plan(run5.path).gpus() == 18


@pytest.mark.browser
def test_study_page_in_chromium(study, tmp_path_factory):
    """The Study page as a person sees it: the measured and published curves on one chart
    and the ratio table; a screenshot to look at."""
    if not os.path.exists(synth.CHROMIUM):
        pytest.fail("needs Debian's chromium: run `bash tests/browser/setup.sh` (as root)")
    from playwright.sync_api import sync_playwright

    import dashboard

    shots = synth.screenshot_dir(tmp_path_factory.getbasetemp())
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = study.path.parent / "streamlit.log"
    with open(log_path, "wb") as log:
        proc = dashboard.start(study.path.parent, host="127.0.0.1", port=port, stdout=log,
                               stderr=subprocess.STDOUT)
        try:
            base = dashboard.url("127.0.0.1", port)
            streamlit_healthy(base, proc, log_path)
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=synth.CHROMIUM, args=synth.CHROMIUM_ARGS)
                try:
                    page = open_page(b, f"{base}/study?study={study.name}",
                                     {"width": 1440, "height": 1000})
                    page.get_by_role("heading", name="Against the published Pareto").wait_for(
                        timeout=120_000)
                    page.wait_for_function(
                        "document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] "
                        "svg.marks, [data-testid=\"stVegaLiteChart\"] canvas').length >= 1",
                        timeout=120_000)
                    page.wait_for_function(
                        "!document.querySelector('[data-testid=\"stStatusWidget\"]')",
                        timeout=120_000)
                    drawn(page)  # vega finishes painting
                    h = page.evaluate(
                        "document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
                    t = now(page)
                    page.set_viewport_size({"width": 1440, "height": min(max(int(h), 1000),
                                                                          9000)})
                    drawn(page, since=t, timeout_ms=10_000)  # and again, as tall as the page
                    shot = shots / "published-study.png"
                    page.screenshot(path=str(shot), full_page=True)
                    print(f"screenshot: {shot}")
                    text = page.inner_text("body")
                    # the published curves: diamond symbols in the chart's svg
                    diamonds = page.evaluate("""() => [...document.querySelectorAll(
                        '[data-testid="stVegaLiteChart"] svg.marks path')].filter(
                        p => (p.getAttribute('aria-roledescription') || '') === 'point'
                        && (p.getAttribute('fill') === 'transparent'
                            || p.getAttribute('fill') === 'none')).length""")
                    assert page.locator('[data-testid="stException"]').count() == 0
                finally:
                    b.close()
        finally:
            stop(proc)
    assert "SIMULATION" in text and "Against the published Pareto" in text
    assert "read off Figure 1" in text
    assert diamonds == sum(len(c["points"]) for c in published.configurations()), diamonds
