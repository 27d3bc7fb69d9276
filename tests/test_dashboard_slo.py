"""A study under an SLO as the Study page, the report and `recommend` show it: the answer in
one sentence, each configuration's frontier with the limit's line and its passing and
failing points. On a real local study of simulated engines (tests/data/slo-knee.yaml,
searched from 4 to 16: decode DP1 fails at 16, DP2 passes there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from helpers import launcher, open_app  # noqa: E402

from launcher.run import listing, slo_answer  # noqa: E402

RECIPE = Path(__file__).resolve().parent / "data" / "slo-knee.yaml"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> listing.Study:
    tmp = tmp_path_factory.mktemp("slo-dash")
    code, out = launcher(tmp, "submit", str(RECIPE), "--sweep", "decode.data_parallel=1,2",
                         "--set", "benchmark.concurrency=[4]", "--set",
                         "benchmark.slo.max_concurrency=16", timeout=420)
    assert code == 0, out[-3000:]
    (s,) = [e for e in listing.entries(tmp / "runs") if isinstance(e, listing.Study)]
    return s


def test_the_study_records_its_answer(study):
    recorded = json.loads((study.path / slo_answer.SLO_FILE).read_text())
    fresh = slo_answer.answer(study.configurations())
    assert recorded == fresh.to_json()
    assert fresh.best == "decode.data_parallel=2"  # the model: 16 per DP2, 8 per DP1


def test_study_page_shows_the_answer_and_each_frontier_against_the_limit(study, monkeypatch):
    at = open_app(study.path.parent, monkeypatch, study=study.name)
    at.switch_page("app_pages/study.py").run()
    assert not at.exception, [e.value for e in at.exception]
    ans = slo_answer.answer(study.configurations())
    assert [s.value for s in at.success if s.value == ans.sentence] == [ans.sentence]
    assert any(h.value == "SLO: the best configuration under the limits" for h in at.subheader)
    charts = [c for c in at.get("vega_lite_chart")
              if "against its limit" in json.dumps(json.loads(c.proto.spec).get("title", ""))]
    assert len(charts) == 1  # one limit: one chart
    spec = json.loads(charts[0].proto.spec)
    marks = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
             for layer in spec["layer"]]
    assert marks == ["line", "point", "rule", "text"]
    rows = _rows(charts[0])
    limit = [r for r in rows if "label" in r and r.get("label")]
    assert limit and limit[0]["value"] == 42.0 and limit[0]["label"] == "SLO tpot_p50<=42ms"
    points = {(r["config"], r["concurrency"]): r["result"] for r in rows if "config" in r}
    for f in ans.frontiers:
        for p in f.points:
            assert points[(f.label, p.concurrency)] == ("passes" if p.passed else "fails")
    assert "fails" in points.values() and "passes" in points.values()


def _rows(chart) -> list[dict]:
    import pyarrow as pa

    rows = []
    for d in chart.proto.datasets:
        rows += pa.ipc.open_stream(d.data.data).read_all().to_pylist()
    return rows


def test_the_report_draws_the_answer_and_the_limit(study, tmp_path):
    from launcher import report

    out = report.write_report(study.path, tmp_path / "r.html")
    html = out.read_text()
    ans = slo_answer.answer(study.configurations())
    from launcher.report import esc

    assert f"<b>{esc(ans.sentence)}</b>" in html
    assert 'class="limit"' in html and "SLO tpot_p50&lt;=42ms" in html
    n_fail = sum(not p.passed for f in ans.frontiers for p in f.points)
    assert html.count('class="pt ref"') >= n_fail > 0  # failing points drawn hollow


def test_recommend_names_the_slo_answer(study):
    code, out = launcher(study.path.parent.parent, "recommend", study.name, "--runs-dir",
                         str(study.path.parent))
    ans = slo_answer.answer(study.configurations())
    assert code == 0, out
    assert out.startswith(f"Under the SLO: {ans.sentence}")
    best = next(f for f in ans.frontiers if f.label == ans.best)
    # read from the run the answer names, its TPOT limit as the tok/s per user target
    assert f"Recommendation from {best.run} " in out
    assert ">= 23.81 tok/s/user" in out and "targets taken from the SLO: 23.81 tok/s/user " \
        "from tpot_p50<=42ms" in out
    assert (f"the SLO search measured {best.passing} as this configuration's largest "
            "concurrency meeting tpot_p50<=42ms") in out


def test_status_of_the_study_says_the_answer(study):
    code, out = launcher(study.path.parent.parent, "status", study.name, "--runs-dir",
                         str(study.path.parent))
    assert code == 0, out
    assert f"SLO: {slo_answer.answer(study.configurations()).sentence}" in out.splitlines()


@pytest.mark.browser
def test_the_study_page_in_chromium_shows_the_answer_and_the_limit(study, tmp_path):
    """What a person sees: the sentence, and the limit's chart drawn with its rule."""
    import subprocess

    from helpers import stop, streamlit_healthy
    from playwright.sync_api import sync_playwright
    from test_dashboard_browser import free_port, visit

    import dashboard

    port = free_port()
    log = open(tmp_path / "streamlit.log", "wb")
    proc = dashboard.start(study.path.parent, host="127.0.0.1", port=port, stdout=log,
                           stderr=subprocess.STDOUT)
    base = dashboard.url("127.0.0.1", port)
    try:
        streamlit_healthy(base, proc, tmp_path / "streamlit.log")
        with sync_playwright() as p:
            import synth

            b = p.chromium.launch(executable_path=synth.CHROMIUM, args=synth.CHROMIUM_ARGS)
            try:
                got = visit(b.new_context(), f"{base}/study?study={study.name}", "Study", 3,
                            tmp_path / "study-slo.png", then=lambda page: page.evaluate(
                                """() => [...document.querySelectorAll(
                                '[data-testid="stVegaLiteChart"] svg.marks')].map(s =>
                                s.querySelectorAll('g.mark-rule path, g.mark-rule line')
                                .length)"""))
            finally:
                b.close()
    finally:
        stop(proc)
        log.close()
    ans = slo_answer.answer(study.configurations())
    assert "SLO: the best configuration under the limits" in got["text"]
    assert ans.sentence in " ".join(got["text"].split())
    assert "SLO tpot_p50<=42ms" in got["text"]  # the rule's label, drawn in the chart
    assert any(n >= 1 for n in got["then"]), got["then"]  # a chart with the limit's rule


def test_an_answer_while_a_configuration_still_runs_says_so(study, tmp_path):
    import shutil

    from launcher.run.rundir import RunDir
    from launcher.run.vocab import State

    copy = tmp_path / study.name
    shutil.copytree(study.path, copy)
    (label, path), *_ = listing.study_at(copy).configurations()
    rd = RunDir(path)
    rec = rd.read_record()
    rec.state, rec.ended = State.RUNNING, None
    rd.write_record(rec)
    ans = slo_answer.answer(listing.study_at(copy).configurations())
    assert ans.sentence.endswith("(so far: 1 configuration(s) still running).")
    assert [f.live for f in ans.frontiers] == [True, False]
