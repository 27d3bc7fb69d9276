"""`python -m launcher report`: one self-contained HTML file of a run or a study, with the
same numbers as summary.json, the Pareto chart as inline SVG, verdicts and the run's
identity; it opens in Chromium from disk with no server and no network."""

from __future__ import annotations

import html.parser
import json
import os
import re
from pathlib import Path

import pytest
import synth

from launcher import report
from launcher.analysis import studies
from launcher.run import figures, listing, numbers
from launcher.run.rundir import RunDir

SUMMARY_KEYS = ("total_tokens_per_s_per_gpu", "output_tokens_per_s_per_decode_gpu",
                "input_tokens_per_s_per_prefill_gpu", "tokens_per_s_per_user",
                "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms",
                "tpot_p99_ms", "request_throughput")


class Cells(html.parser.HTMLParser):
    """Rows of the per-point summary tables: [{key: (data-value, text)}], plus tags seen."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[dict]] = []
        self.tags: set[str] = set()
        self.attrs_seen: list[dict] = []
        self._in_summary = False
        self._cell: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        self.attrs_seen.append(a)
        if tag == "table" and "summary" in (a.get("class") or ""):
            self._in_summary = True
            self.tables.append([])
        elif self._in_summary and tag == "tr":
            self.tables[-1].append({})
        elif self._in_summary and tag == "td" and "data-key" in a:
            self._cell = {"key": a["data-key"], "value": a.get("data-value"), "text": ""}

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.tables[-1][-1][self._cell["key"]] = (self._cell["value"], self._cell["text"])
            self._cell = None
        elif tag == "table":
            self._in_summary = False


def parse(path: Path) -> Cells:
    c = Cells()
    c.feed(path.read_text(encoding="utf-8"))
    return c


def check_numbers(rows: list[dict], points: list[dict]) -> None:
    rows = [r for r in rows if r]
    assert [int(r["max_concurrency"][0]) for r in rows] == [p["max_concurrency"]
                                                             for p in points]
    for r, p in zip(rows, points, strict=True):
        for k in SUMMARY_KEYS:
            if k in r:
                if p[k] is None:
                    assert r[k] == (None, numbers.MISSING)
                else:
                    assert float(r[k][0]) == p[k], (k, r[k], p[k])  # the exact value
                    digits = 1 if k in ("tokens_per_s_per_user",) or k.startswith("tpot") \
                        else 2 if k == "request_throughput" else 0
                    assert r[k][1] == f"{p[k]:,.{digits}f}"


def self_contained(c: Cells, text: str) -> None:
    assert "script" not in c.tags and "link" not in c.tags and "img" not in c.tags
    assert "iframe" not in c.tags
    assert not any(k in a for a in c.attrs_seen for k in ("src", "href"))
    assert "svg" in c.tags and "<polyline" in text


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    synth.healthy(root)
    synth.failed(root)
    synth.study(root)
    return root


def test_run_report(root):
    run = next(p for p in root.iterdir() if p.name.endswith("-healthy"))
    out = report.write_report(run)
    assert out == RunDir(run).report and out.is_file()
    text = out.read_text()
    c = parse(out)
    self_contained(c, text)
    s = figures.summary(run)  # no summary.json in a synthetic run: computed the same way
    check_numbers(c.tables[0], s["points"])
    assert "SIMULATION" in text and run.name in text and "synthetic-healthy" in text
    assert "1 decode DEP4 + 2 prefill DEP2 (8 GPUs)" in text
    assert "Bottleneck per sweep point" in text and "healthy" in text
    assert 'data-key="verdict">incomplete' in text or 'data-key="verdict">passed' in text


def test_a_store_runs_report_says_where_prompt_tokens_came_from_and_names_the_store(
        tmp_path, root):
    run = synth.kv_store(tmp_path)
    text = report.write_report(run).read_text()
    assert "KV tiers: where each prompt token came from" in text
    words = " ".join(re.sub(r"<[^>]+>", " ", text).split())
    # columns: local hit, handoff, store, offload, unsplit, computed (%). c=8's prefill found
    # 16.4 % in the store (synth.STORE_SHARE's 0.2 beside its computed and local tokens);
    # the decode's prompt was all handed off
    assert re.search(r"c=8 prefill [\d,]+ 1\.\d 0\.0 16\.4 0\.0 0\.0 8\d\.\d", words), words
    assert re.search(r"c=8 decode [\d,]+ 0\.0 100\.0 0\.0 0\.0 0\.0 0\.0", words)
    assert "the trace offers %" in text and "KV store and master health" in text
    # volumes under a GiB keep three figures (0.130 GiB got, 0.521 put), never 0.00
    assert re.search(r"c=8 0\.130 [\d.]+ 0\.521 ", words), words
    assert "KV store full: puts refused" in text and "KV store evicting" in text
    assert "master_put_start_alloc_failures_total" in text
    healthy = report.render_run(next(p for p in root.iterdir() if p.name.endswith("-healthy")))
    assert "KV tiers: where each prompt token came from" in healthy  # a handoff is a source
    assert "KV store and master health" not in healthy


def test_failed_run_report_says_so(root):
    run = next(p for p in root.iterdir() if p.name.endswith("-failed"))
    text = report.write_report(run).read_text()
    assert "FAILED" in text and "illegal memory access" in text
    assert 'data-key="verdict">failed' in text


def test_study_report(root):
    (study,) = [e for e in listing.entries(root) if isinstance(e, listing.Study)]
    out = report.write_report(study.path)
    assert out == study.path / "report.html"
    text = out.read_text()
    c = parse(out)
    self_contained(c, text)
    for r in study.runs:
        assert r.run_id in text
    assert text.count('class="curve"') == 3  # one curve per configuration
    assert "Best configuration per interactivity band" in text and "≥ " in text
    assert "P:D recommendation" in text
    for k, r in enumerate(sorted(study.runs, key=lambda r: r.run_id)):
        check_numbers(c.tables[k], figures.summary(r.path)["points"])


def test_study_report_carries_every_caveat_of_the_advice(root):
    """Issue 41 item 3: the report's P:D recommendation says its confidence, TTFT and every
    caveat, in a warning box, not as good news."""
    import html as html_mod
    import re

    from launcher.analysis import recommend

    (study,) = [e for e in listing.entries(root) if isinstance(e, listing.Study)]
    text = report.render_study(study.path)
    part = text[text.index("<h2>P:D recommendation</h2>"):text.index("<h2>Each configuration")]
    label = html_mod.unescape(re.search(r"From the run of <b>(.*?)</b>", part).group(1))
    rec = recommend.recommend(dict(studies.configs(study))[label])
    assert rec["caveats"]
    assert '<div class="warn">' in part and 'class="good"' not in part
    assert f"confidence <b>{rec['confidence']}</b>" in part
    for c in rec["caveats"]:
        assert html_mod.escape(c, quote=True) in part, part
    assert html_mod.escape(recommend.ttft_text(rec["predicted"]), quote=True) in part


def test_cli_main(root, capsys, tmp_path):
    run = next(p for p in root.iterdir() if p.name.endswith("-healthy"))
    assert report.main([str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "report.html")
    assert report.main([str(tmp_path)]) == 2
    assert "neither a run directory" in capsys.readouterr().err


def test_launcher_import_stays_light():
    import subprocess
    import sys

    code = ("import sys, launcher.report; heavy = [m for m in ('pandas', 'streamlit', "
            "'altair', 'numpy') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_dashboard_writes_and_offers_the_report(root, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from dashboard import ui

    run = next(p for p in root.iterdir() if p.name.endswith("-failed"))
    (run / "report.html").unlink(missing_ok=True)
    monkeypatch.setenv(ui.RUNS_ENV, str(root))
    app = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
    at = AppTest.from_file(app, default_timeout=180)
    at.query_params["run"] = run.name
    at.run()
    at.switch_page("app_pages/overview.py").run()
    assert not at.exception
    at.button(key="write_report_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert (run / "report.html").is_file()
    assert at.get("download_button")


# --- in a real browser -----------------------------------------------------------------


@pytest.mark.browser
def test_demo_report_opens_offline_in_chromium(tmp_path_factory):
    if not os.path.exists(synth.CHROMIUM):
        pytest.fail("needs Debian's chromium: run `bash tests/browser/setup.sh` (as root)")
    from playwright.sync_api import sync_playwright

    demo = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    summary = json.loads((demo / "summary.json").read_text())
    out = report.write_report(demo)
    shots = synth.screenshot_dir(tmp_path_factory.getbasetemp())
    requests = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=synth.CHROMIUM, args=synth.CHROMIUM_ARGS)
        try:
            ctx = b.new_context(offline=True, viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.goto(out.as_uri(), wait_until="load", timeout=30_000)
            cells = page.evaluate("""() => [...document.querySelectorAll(
                'table.summary tbody tr')].map(tr => Object.fromEntries([...tr.querySelectorAll(
                'td[data-key]')].map(td => [td.dataset.key, [td.dataset.value ?? null,
                td.innerText.trim()]])))""")
            tiles = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll(
                '.tile .v[data-key]')].map(e => [e.dataset.key, e.dataset.value]))""")
            svg_points = page.locator("svg.chart circle.pt").count()
            page.screenshot(path=str(shots / "demo-report.png"), full_page=True)
            print(f"screenshot: {shots / 'demo-report.png'}")
        finally:
            b.close()
    assert requests == [out.as_uri()]  # the file itself, nothing else
    check_numbers([{k: tuple(v) for k, v in r.items()} for r in cells], summary["points"])
    h = summary["headline"]
    assert float(tiles["headline.total_tokens_per_s_per_gpu"]) == h["total_tokens_per_s_per_gpu"]
    assert float(tiles["accuracy.accuracy"]) == summary["accuracy"]["accuracy"]
    assert svg_points >= 2 * len(summary["points"])  # Pareto + TTFT charts drawn


def test_the_report_says_what_was_measured_marks_its_charts_and_writes_where_asked(
        tmp_path, tmp_path_factory):
    """Issue 28 item 13, on the shared demo run: the settings the figures come from, a
    SIMULATION mark inside every chart (a chart copied out still says it), and -o."""
    import re
    import subprocess
    import sys

    from launcher.schema import recipe as recipe_mod

    demo = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    out = tmp_path / "elsewhere" / "demo.html"
    out.parent.mkdir()
    p = subprocess.run([sys.executable, "-m", "launcher", "report", str(demo), "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == str(out), p
    html = out.read_text()
    i = html.index("<h2>What was measured</h2>")
    section = re.sub(r"<[^>]+>", " ", html[i:html.index("<h2>", i + 10)])
    b = recipe_mod.load(str(demo / "recipe.yaml")).benchmark
    assert f"ISL/OSL {b.input_len}/{b.output_len}" in section
    assert f"range ratio {b.range_ratio:g}" in section
    assert ", ".join(map(str, b.concurrency)) in section
    assert all(f"{c}: {b.prompts(c):,}" in section for c in b.concurrency), section
    assert "decode engine flags" in section and "prefill engine flags" in section
    assert "--kv-transfer-config" in section and "time limit" in section
    charts = html.count('<svg class="chart"')
    assert charts >= 2 and html.count('class="mark">SIMULATION</text>') == charts
