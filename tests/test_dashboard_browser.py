"""The dashboard as a person sees it: a real Streamlit server on 127.0.0.1 and Debian's
headless Chromium (tests/browser/setup.sh installs it; never `playwright install`).

Visits every page of the local demo run (`launcher submit local-sim`, really run), of a
synthetic 3-configuration study and of synthetic healthy, failed, live and 72-GPU runs;
saves full-page screenshots at 1440 px (the directory is printed: $PD_SCREENSHOTS or
pytest's basetemp/screenshots) and checks what is on the page: titles, the SIMULATION
label, drawn charts, no exception box, no developer toolbar, no empty filler rows in tables, and every
axis's tick labels (no bare fraction, no label repeated, time axes in the server's zone
whatever the browser's zone is); at 1440 and at 1280 px, no text cut (a table cell, header
or table too wide, a chart's ellipsis or overflow, an element hiding its overflow), no chart
without a plot area, and no "None", "nan" or raw float (issue 41). The server runs in Asia/Kolkata, the browser in
America/New_York: a time axis must show the server's wall clock, as the logs do.
Every check waits for the page to have finished drawing (tests/browser/drawn.py), not for a
fixed time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import synth
from browser.drawn import drawn, now, open_page
from helpers import free_port_base, launcher, profile_copy, stop, streamlit_healthy

import dashboard
from dashboard import ui
from launcher.analysis import studies
from launcher.run import figures, listing

pytestmark = pytest.mark.browser
SERVER_TZ, BROWSER_TZ = "Asia/Kolkata", "America/New_York"


@pytest.fixture(scope="module", autouse=True)
def chromium_installed():
    # A missing browser fails these tests (like a missing dev cluster): a skip would pass
    # CI without ever looking at the pages.
    if not os.path.exists(synth.CHROMIUM):
        pytest.fail("needs Debian's chromium: run `bash tests/browser/setup.sh` (as root)")


CHART = '[data-testid="stVegaLiteChart"]'
DRAWN = f"{CHART} canvas, {CHART} svg.marks"
# (url path, title on the page, minimum charts drawn, text that must be there) for the
# demo run. Tables are drawn on a canvas (glide grid), so the checked text is titles,
# metrics, captions, tabs and static tables.
PAGES = [
    # "/runs" (not "/"): the default page's own path must open it too, with no "Page not
    # found" (the root is visited by the other browser tests)
    ("runs", "Runs", 0, ["SIMULATION", "Simulated", "Failed", "Studies"]),
    ("overview", "Run overview", 2, ["tok/s per working GPU, best", "GSM8K accuracy",
                                     "Bottleneck per sweep point", "Report to share"]),
    ("sweep", "Sweep", 3, ["x = 1000 ÷ median TPOT", "Throughput measure"]),
    ("kv", "KV cache", 6, ["KV cache usage", "NIXL KV transfer (decode side)",
                           "KV capacity: predicted vs observed",
                           "concurrent requests, predicted (plan.json)",
                           "Prompt tokens by source, decode"]),
    ("kv-tiers", "KV tiers", 3, ["Where each prompt token came from",
                                 "Hits against the trace's theoretical hit rate",
                                 "No KV store or CPU offload in this run"]),
    ("ttft", "TTFT breakdown", 1, ["Diagnosis per sweep point"]),
    ("gpus", "GPUs and hosts", 0, ["GPUs (NVML)", "Hosts"]),
    ("logs", "Logs", 0, ["Processes with logs", "Tail"]),
]
RUN_PAGES = [p for p in PAGES if p[0] != "runs"]
AXES_JS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks')]
  .map(s => [...s.querySelectorAll('g.role-axis')].map(ax => ({
    title: [...ax.querySelectorAll('.role-axis-title text')].map(t => t.textContent).join(' '),
    labels: [...ax.querySelectorAll('.role-axis-label text')]
      .filter(t => t.getAttribute('opacity') !== '0' && getComputedStyle(t).opacity !== '0')
      .map(t => t.textContent)})))"""
# Every chart's title, axis titles and legend titles inside its SVG: nothing cut off.
CLIPPED_JS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')]
  .flatMap(c => { const svg = c.querySelector('svg.marks'); if (!svg) return [];
    const b = svg.getBoundingClientRect();
    return [...svg.querySelectorAll('.role-title-text, .role-axis-title text, .role-legend-title text')]
      .map(t => [t.textContent, t.getBoundingClientRect()])
      .filter(([_, r]) => r.width > 0 && (r.left < b.left - 1 || r.top < b.top - 1 ||
                                          r.right > b.right + 1 || r.bottom > b.bottom + 1))
      .map(([text, r]) => text + ' @ ' + [r.left - b.left, r.top - b.top, b.right - r.right,
                                           b.bottom - r.bottom].map(Math.round).join(',')) })"""
# Charts whose plot area collapsed (a legend or axes took all the height): a title with
# nothing drawn under it.
EMPTY_JS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg.marks')]
  .map(s => [(s.querySelector('.role-title-text') || {}).textContent,
             s.querySelector('g.mark-group.role-frame.root > g > path.background')])
  .filter(([_, bg]) => bg).map(([t, bg]) => [t, bg.getBoundingClientRect()])
  .filter(([_, r]) => r.height < 10 || r.width < 10)
  .map(([t, r]) => t + ' @ ' + Math.round(r.width) + 'x' + Math.round(r.height))"""
# Tables (st.dataframe) are drawn on a canvas: every text they draw is recorded with the clip
# of its cell, so a cut cell can be told from the page (issue 41 item 10).
CANVAS_TEXT_JS = """(() => {
  const P = CanvasRenderingContext2D.prototype, st = new WeakMap();
  const S = c => { let s = st.get(c); if (!s) { s = {path: [], clip: null, stack: []};
                                               st.set(c, s); } return s; };
  const wrap = (name, f) => { const orig = P[name];
    P[name] = function (...a) { f(S(this), ...a); return orig.apply(this, a); }; };
  wrap('beginPath', s => { s.path = []; });
  wrap('rect', (s, x, y, w, h) => { s.path.push([x, y, w, h]); });
  wrap('clip', s => { if (s.path.length) s.clip = s.path[s.path.length - 1]; });
  wrap('save', s => { s.stack.push(s.clip); });
  wrap('restore', s => { s.clip = s.stack.length ? s.stack.pop() : null; });
  window.__texts = [];
  const fill = P.fillText;
  P.fillText = function (t, x, y, ...rest) {
    const w = this.measureText(String(t)).width, a = this.textAlign;
    const x0 = a === 'right' || a === 'end' ? x - w : a === 'center' ? x - w / 2 : x;
    window.__texts.push({t: String(t), x0, x1: x0 + w, clip: S(this).clip, canvas: this.canvas});
    return fill.call(this, t, x, y, ...rest);
  };
})()"""
# Text a person cannot read whole: a table cell or header wider than its column, a table
# wider than the page (columns past the right edge), Vega's ellipsis in a chart, a chart
# wider than its frame, an element that hides its own overflow, anything past the page.
CUT_JS = """() => { const out = [], seen = new Set();
  const say = s => { if (!seen.has(s)) { seen.add(s); out.push(s); } };
  const main = document.querySelector('[data-testid="stMain"] [data-testid="stMainBlockContainer"]') || document.querySelector('[data-testid="stMain"]');
  const mb = main.getBoundingClientRect();
  // tables drawn on a canvas (glide): a cell or header whose text is wider than its clip
  for (const e of window.__texts || []) {
    if (!e.canvas.isConnected || !e.clip || !e.canvas.closest('[data-testid="stDataFrame"]')) continue;
    const [cx, , cw] = e.clip;
    if (e.x1 > cx + cw + 0.5 || e.x0 < cx - 0.5) say(`table cell ${JSON.stringify(e.t)} needs ${Math.round(e.x1 - e.x0)} px, has ${Math.round(cw)}`);
  }
  // ... or wider than the page: columns past the right edge
  for (const d of document.querySelectorAll('[data-testid="stDataFrame"]')) {
    const sc = d.querySelector('.dvn-scroller');
    const head = [...d.querySelectorAll('[role="columnheader"]')].map(h => h.innerText).slice(0, 3).join(', ');
    if (sc && sc.scrollWidth > sc.clientWidth + 1) say(`table (${head}, ...) is ${sc.scrollWidth} px wide in ${sc.clientWidth}`);
  }
  // charts: Vega's ellipsis, and SVG text outside its chart's frame
  for (const c of document.querySelectorAll('[data-testid="stVegaLiteChart"]')) {
    const svg = c.querySelector('svg.marks'); if (!svg) continue;
    const title = (svg.querySelector('.role-title-text') || {}).textContent || '';
    for (const t of svg.querySelectorAll('text')) if (t.textContent.includes('…')) say(`chart "${title}": ${JSON.stringify(t.textContent)}`);
    const b = svg.getBoundingClientRect(), cb = c.getBoundingClientRect();
    if (b.right > cb.right + 1 || b.left < cb.left - 1) say(`chart "${title}" is ${Math.round(b.width)} px wide in ${Math.round(cb.width)}`);
  }
  // HTML: anything that hides its own overflow (ellipsis, clipped) while its text is wider
  for (const el of main.querySelectorAll('*')) {
    if (el.closest('[data-testid="stDataFrame"], [data-testid="stVegaLiteChart"], [data-testid="stCode"], pre, textarea, input')) continue;
    const cs = getComputedStyle(el);
    if (cs.display === 'none' || cs.visibility === 'hidden') continue;
    const clips = cs.textOverflow === 'ellipsis' || ['hidden', 'clip'].includes(cs.overflowX) || ['auto', 'scroll'].includes(cs.overflowX);
    if (!clips || !el.innerText || !el.innerText.trim()) continue;
    if (el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0) say(`${el.tagName.toLowerCase()}[${el.getAttribute('data-testid') || el.className.toString().slice(0, 30)}] ${JSON.stringify(el.innerText.trim().slice(0, 60))}: ${el.scrollWidth} px in ${el.clientWidth}`);
  }
  // ... and anything that reaches past the page's content column
  for (const el of main.querySelectorAll('table, [data-testid="stMetric"], [data-testid="stExpander"]')) {
    const r = el.getBoundingClientRect();
    if (r.width && r.right > mb.right + 1) say(`${el.tagName.toLowerCase()} ${JSON.stringify((el.innerText || '').trim().slice(0, 40))} ends ${Math.round(r.right - mb.right)} px past the page`);
  }
  return out; }"""
# What a person should never read: "None", "nan" or a raw float, in a table or in the text.
RAW_JS = """() => {
  // a raw float: four decimals or more on a whole part, five significant ones below 1
  const bad = t => /^(None|nan|NaN|null|undefined)$/.test(t) ||
      /^-?[1-9][\\d,]*\\.\\d{4,}$/.test(t) || /^-?0\\.0*[1-9]\\d{4,}$/.test(t);
  const drawn = (window.__texts || []).filter(e => e.canvas.isConnected &&
      e.canvas.closest('[data-testid="stDataFrame"]')).map(e => e.t.trim());
  const words = [];
  const main = document.querySelector('[data-testid="stMain"]');
  const walk = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    if (n.parentElement.closest('[data-testid="stDataFrame"], [data-testid="stCode"], pre, code'))
      continue;
    if (!n.parentElement.checkVisibility()) continue;
    words.push(...n.textContent.split(/[\\s(),;:]+/));
  }
  return [...new Set([...drawn, ...words].filter(bad))]; }"""
WIDTHS = (1440, 1280)  # a page must read whole at both (the laptop and desktop)
WIDER_THAN_FRAME_JS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')]
  .some(c => { const s = c.querySelector('svg.marks');
               return s && s.getBoundingClientRect().width > c.getBoundingClientRect().width + 1; })"""
TABLES_JS = """() => [...document.querySelectorAll('[data-testid="stDataFrame"]')]
  .map(d => { const g = d.querySelector('[role="grid"][aria-rowcount]');
              return g ? {h: d.getBoundingClientRect().height,
                          rows: +g.getAttribute('aria-rowcount')} : null })
  .filter(x => x)"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    demo_src = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    demo = root / demo_src.name
    shutil.copytree(demo_src, demo)
    runs = {"demo": demo, "healthy": synth.healthy(root), "failed": synth.failed(root),
            "large": synth.large(root, duration_s=1800.0), "study": synth.study(root),
            "study_one": synth.in_one_allocation(root, synth.study(root / "one")),
            "live": synth.live(root / "live-runs", index=1, total=4),
            "kv_store": synth.kv_store(root)}
    # the live run sits in a runs dir of its own: a second server below serves it
    port = free_port()
    log = open(root / "streamlit.log", "wb")
    env_tz = os.environ.get("TZ")
    os.environ["TZ"] = SERVER_TZ  # the server's zone (the cluster's, the logs')
    try:
        proc = dashboard.start(root, host="127.0.0.1", port=port, stdout=log,
                               stderr=subprocess.STDOUT)
    finally:
        if env_tz is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = env_tz
    base = dashboard.url("127.0.0.1", port)
    streamlit_healthy(base, proc, root / "streamlit.log")
    yield base, runs
    stop(proc)
    log.close()


@pytest.fixture(scope="module")
def browser():
    """One browser context: its pages share the HTTP cache (Streamlit's scripts load once);
    each page is a Streamlit session of its own."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=synth.CHROMIUM, args=synth.CHROMIUM_ARGS,
                              env={**os.environ, "TZ": BROWSER_TZ})
        context = b.new_context()
        yield context
        context.close()
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = synth.screenshot_dir(tmp_path_factory.getbasetemp())
    print(f"screenshots in {d}")
    return d


def settle(page, title: str, min_charts: int) -> None:
    page.get_by_role("heading", name=title).first.wait_for(timeout=90_000)
    if min_charts:
        page.wait_for_function(
            f"document.querySelectorAll('{DRAWN}').length >= {min_charts}", timeout=120_000)
    # Let the script finish: the status widget shows while Streamlit is running it.
    page.wait_for_function(
        "!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
    drawn(page)  # vega and the tables finish painting


def check_axes(axes: list[list[dict]], where: str) -> int:
    """Every axis: no bare fraction ('.500', ':30'), no label twice in a row, and time axes
    in whole seconds or minutes. Returns how many time axes were seen."""
    n_time = 0
    for chart in axes:
        for ax in chart:
            labels = [x for x in ax["labels"] if x]
            for lab in labels:
                assert not re.fullmatch(r"[.:]\d+", lab), f"{where}: bare fraction {lab!r}"
            repeats = [a for a, b in zip(labels, labels[1:], strict=False) if a == b]
            assert not repeats, f"{where}: {ax['title']!r} repeats {repeats} in {labels}"
            if ax["title"].startswith("time ("):
                n_time += 1
                for lab in labels:
                    assert re.fullmatch(r"(\w{3} \d\d )?\d\d:\d\d(:\d\d)?|\w{3} \d\d", lab), \
                        f"{where}: time label {lab!r}"
            if ax["title"] == "seconds since job start":
                n_time += 1
                assert all(re.fullmatch(r"-?[\d,]+", lab) for lab in labels), labels
    return n_time


def at_width(page, width: int) -> None:
    """The page laid out `width` px wide and as tall as its content (Streamlit scrolls
    inside its main block, so "full page" is the viewport), every table drawn afresh."""
    height = "document.querySelector('[data-testid=\"stMain\"]').scrollHeight"
    h = page.evaluate(height)
    page.evaluate("window.__texts = []")
    t = now(page)
    page.set_viewport_size({"width": width, "height": min(max(int(h), 1000), 14000)})
    drawn(page, since=t, timeout_ms=10_000)  # vega and the tables redraw at the new width
    # narrower is taller: a chart pushed below the viewport is not redrawn until it is in view
    # (as when a person scrolls to it), so the viewport grows to the new height too
    h2 = page.evaluate(height)
    if min(h2, 14000) > min(max(int(h), 1000), 14000):
        t = now(page)
        page.set_viewport_size({"width": width, "height": min(int(h2), 14000)})
        drawn(page, since=t, timeout_ms=10_000)
    # Vega, resized, sometimes sets a chart's plot to its frame's whole width and its axis
    # outside it (the real vLLM run's NIXL charts: 482 px in 402); the page as it opens at
    # this width is what a person at this width sees, so it is read afresh then
    if page.evaluate(WIDER_THAN_FRAME_JS):
        page.evaluate("window.__texts = []")
        page.reload(wait_until="domcontentloaded")
        drawn(page, timeout_ms=30_000)


def visit(browser, url: str, title: str, min_charts: int, shot: Path, then=None,
          row_px: int = ui.ROW_PX) -> dict:
    """Every check at both widths; the text, charts, axes and table texts at 1440 px, and
    there `then(page)` as got["then"] (what a test reads besides, on the same visit).
    `row_px`: the row height the page's tables are expected to draw."""
    page = open_page(browser, url, {"width": WIDTHS[0], "height": 1000}, CANVAS_TEXT_JS,
                     wait_until="domcontentloaded")
    try:
        settle(page, title, min_charts)
        exc = page.locator('[data-testid="stException"]')
        assert exc.count() == 0, exc.first.inner_text()
        assert page.get_by_text("Page not found").count() == 0, url
        assert page.locator('[data-testid="stAppDeployButton"]').count() == 0
        assert page.get_by_text("Deploy", exact=True).count() == 0  # no developer toolbar
        got = {}
        for width in WIDTHS:
            at_width(page, width)
            where = f"{url} at {width} px"
            if width == WIDTHS[0]:  # one to look at: the checks at 1280 read the page
                page.screenshot(path=str(shot), full_page=True)
                print(f"screenshot: {shot}")
            clipped = page.evaluate(CLIPPED_JS)  # (left, top, right, bottom) room, px
            assert not clipped, (where, clipped)
            empty = page.evaluate(EMPTY_JS)
            assert not empty, (where, "charts with no plot area", empty)
            cut = page.evaluate(CUT_JS)
            assert not cut, (where, "text cut off", cut)
            raw = page.evaluate(RAW_JS)
            assert not raw, (where, "raw values shown", raw)
            for t in page.evaluate(TABLES_JS):  # as tall as their rows: no empty filler rows
                assert t["h"] <= ui.HEADER_PX + row_px * max(t["rows"] - 1, 1) + 4, (where, t)
            axes = page.evaluate(AXES_JS)
            n_time = check_axes(axes, where)
            if width == WIDTHS[0]:
                got = {"text": page.inner_text("body"), "drawn": page.locator(DRAWN).count(),
                       "axes": axes, "time_axes": n_time,
                       "canvas": page.evaluate("(window.__texts || []).map(e => e.t)")}
                if then:
                    got["then"] = then(page)
        return got
    finally:
        page.close()


@pytest.mark.parametrize("path, title, min_charts, wanted", PAGES,
                         ids=[p[0] for p in PAGES])
def test_every_page_of_the_demo_run(server, browser, shots, path, title, min_charts,
                                    wanted):
    base, runs = server
    run = runs["demo"]
    got = visit(browser, f"{base}/{path}?run={run.name}", title, min_charts,
                shots / f"demo-{path}.png")
    assert got["drawn"] >= min_charts
    for w in wanted:
        assert w in got["text"], f"{w!r} missing on {path}"
    if path != "runs":
        assert run.name in got["text"] and "SIMULATION" in got["text"]
    if path in ("overview", "kv"):
        assert got["time_axes"] >= 1
    if path == "kv":  # the demo's plan predicts its KV capacity (issue 41 item 6)
        assert "No prediction" not in got["text"]


def test_time_axes_show_the_servers_wall_clock(server, browser, shots):
    """Server in IST, browser in New York: the stage timeline of the synthetic run (events
    from 07:04:30 to 07:14:40 UTC) reads 12:34..12:45, as fmt_time and the logs do."""
    base, runs = server
    run = runs["healthy"]
    got = visit(browser, f"{base}/overview?run={run.name}", "Run overview", 2,
                shots / "healthy-overview.png")
    axes = [ax for chart in got["axes"] for ax in chart if ax["title"].startswith("time (")]
    assert axes and axes[0]["title"] == "time (IST, UTC+05:30)"
    for lab in axes[0]["labels"]:
        assert "12:30" <= lab <= "12:50", axes[0]["labels"]
    got = visit(browser, f"{base}/kv?run={run.name}", "KV cache", 6, shots / "healthy-kv.png")
    assert got["time_axes"] >= 6


def test_seconds_since_job_start(server, browser, shots):
    base, runs = server
    run = runs["healthy"]
    page = open_page(browser, f"{base}/kv?run={run.name}", {"width": 1440, "height": 1200})
    try:
        settle(page, "KV cache", 6)
        page.get_by_text("seconds since job start", exact=True).click()
        # every chart redrawn on the new axis (they repaint one after another)
        page.wait_for_function(
            "(() => { const t = [...document.querySelectorAll('.role-axis-title text')]"
            ".map(x => x.textContent); return t.filter(x => x === 'seconds since job start')"
            ".length >= 6 && !t.some(x => x.startsWith('time (')); })()", timeout=60_000)
        settle(page, "KV cache", 6)
        axes = page.evaluate(AXES_JS)
        page.screenshot(path=str(shots / "healthy-kv-elapsed.png"), full_page=True)
    finally:
        page.close()
    assert check_axes(axes, "kv elapsed") >= 6
    titles = {ax["title"] for chart in axes for ax in chart}
    assert "seconds since job start" in titles and not any(t.startswith("time (")
                                                           for t in titles)


def test_the_study_page(server, browser, shots):
    """3 configurations: 3 curves on the Pareto chart, the best configuration named."""
    base, runs = server
    study = next(e for e in listing.entries(runs["study"].parent)
                 if isinstance(e, listing.Study))

    def curves_and_legend(page):
        # one path per configuration in the curves layer (layer 0), each its own colour
        curves = page.evaluate(f"""() => [...document.querySelector('{CHART} svg.marks')
            .querySelectorAll('g.mark-line.role-mark.layer_0_marks path')]
            .map(p => p.getAttribute('stroke'))""")
        legend = page.evaluate(f"""() => [...document.querySelector('{CHART} svg.marks')
            .querySelectorAll('.role-legend-label text')].map(t => t.textContent)""")
        return curves, legend

    got = visit(browser, f"{base}/study?study={study.name}", "Study", 2,
                shots / "study-study.png", then=curves_and_legend)
    page_text = got["text"]
    best = ("", -1.0)
    for label, path in studies.configs(study):
        for p in figures.summary(path)["points"]:
            if p["status"] == "ok" and p["total_tokens_per_s_per_gpu"] > best[1]:
                best = (label, p["total_tokens_per_s_per_gpu"])
    assert f"Best configuration: {best[0]}" in page_text
    assert "Best configuration per interactivity band" in page_text
    assert "Verdict per sweep point" in page_text and "prefill-bound" in page_text
    assert "P:D recommendation" in page_text
    curves, legend = got["then"]
    assert len(curves) == 3 and len(set(curves)) == 3, curves
    assert {"prefill.endpoints=1", "prefill.endpoints=2", "prefill.endpoints=3"} <= set(legend)


def _study_text(page) -> str:
    """The Study page's text once its last section, after the recommendation (the slowest
    part), is drawn."""
    page.get_by_role("button", name="Write report.html").wait_for(timeout=60_000)
    settle(page, "Study", 2)
    return page.inner_text('[data-testid="stMain"]')


def _main_text(browser, url: str) -> str:
    """As `visit` reads it at 1440 px, with no checks."""
    page = open_page(browser, url, {"width": WIDTHS[0], "height": 1000}, CANVAS_TEXT_JS)
    try:
        settle(page, "Study", 2)
        at_width(page, WIDTHS[0])
        return _study_text(page)
    finally:
        page.close()


def test_a_study_in_one_allocation_shows_as_the_same_study_run_as_jobs(server, browser,
                                                                        shots):
    """The same runs, once as jobs of their own and once as one allocation: the Study page
    and the report are the same but for the allocation's facts."""
    base, runs = server
    jobs, one = (listing.entries(p)[0] for p in (runs["study"], runs["study_one"]))
    got = visit(browser, f"{base}/study?study={one.name}", "Study", 2,
                shots / "study-one-allocation.png", then=_study_text)
    assert "Allocation: one allocation for every configuration, engines loaded once" in (
        got["text"])

    def same_part(text: str, name: str) -> str:
        # the allocation's own line (an expander, with its icon, or a caption) left out
        text = re.sub(r"\n(keyboard_arrow_right\n\n?)?Allocation: [^\n]*", "", text)
        text = re.sub(re.escape(name) + r"(?![-\w])", "STUDY", text)  # not its runs' names
        lines = [ln for ln in text.splitlines() if not ln.startswith("Ran as ")]
        return "\n".join(lines)

    a = same_part(_main_text(browser, f"{base}/study?study={jobs.name}"), jobs.name)
    b = same_part(got["then"], one.name)
    import difflib

    assert a == b, "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm=""))
    from launcher import report

    texts = []
    for st in (jobs, one):
        html = report.render_study(st.path)
        i, j = html.index("<h2>Allocation</h2>"), html.index("<h2>Pareto")
        assert "engines loaded once" in html[i:j] if st is one else (
            "one job per configuration" in html[i:j])
        html = re.sub(r"\d\d:\d\d:\d\d UTC", "HH:MM:SS UTC", html[:i] + html[j:])  # written at
        texts.append(re.sub(re.escape(st.name) + r"(?![-\w])", "STUDY", html))
    assert texts[0] == texts[1]


def test_the_compare_page_of_two_configurations_of_a_study(server, browser, shots):
    """Two configurations of the synthetic study (made without recipe.yaml): both curves on
    one chart, the figures from their bench/ results with the spread unknown (no repeats),
    and no claim that the comparison is single-variable."""
    base, runs = server
    study = next(e for e in listing.entries(runs["study"].parent)
                 if isinstance(e, listing.Study))
    one, two = sorted(study.runs, key=lambda r: r.run_id)[:2]
    url = f"{base}/compare?a={one.run_id}&b={two.run_id}"
    got = visit(browser, url, "Compare", 1, shots / "compare-study.png",
                then=lambda page: page.evaluate(f"""() => [...document.querySelector(
                    '{CHART} svg.marks').querySelectorAll(
                    'g.mark-line.role-mark.layer_0_marks path')]
                    .map(p => p.getAttribute('stroke'))"""))
    text = got["text"]
    assert "NOT known to be single-variable: a recipe.yaml is missing" in text
    assert "SIMULATION" in text and "Figures, B against A" in text
    assert "Run-to-run spread unknown" in text
    curves = got["then"]
    assert len(curves) == 2 and len(set(curves)) == 2, curves


# A study run's pages are the demo's pages on another run; these three carry what is its
# own (its study, its configuration's charts).
STUDY_RUN_PAGES = [p for p in RUN_PAGES if p[0] in ("overview", "sweep", "kv")]


@pytest.mark.parametrize("path, title, min_charts, wanted", STUDY_RUN_PAGES,
                         ids=[p[0] for p in STUDY_RUN_PAGES])
def test_every_page_of_a_study_run(server, browser, shots, path, title, min_charts, wanted):
    base, runs = server
    study = next(e for e in listing.entries(runs["study"].parent)
                 if isinstance(e, listing.Study))
    run = sorted(study.runs, key=lambda r: r.run_id)[1]  # prefill.endpoints=2
    got = visit(browser, f"{base}/{path}?run={run.run_id}", title, min_charts,
                shots / f"study-p2-{path}.png")
    assert run.run_id in got["text"]
    if path in ("overview", "sweep"):
        assert f"This run is one configuration of study {study.name}" in got["text"]


def test_runs_page_lists_the_study_as_one_item(server, browser, shots):
    base, runs = server
    page = open_page(browser, f"{base}/", {"width": 1440, "height": 1000})
    try:
        settle(page, "Runs", 0)
        page.screenshot(path=str(shots / "runs-list.png"), full_page=True)
        # the table is a canvas; its accessible copy is a grid of cells, filled in a moment
        # after the canvas is drawn: wait for it, not for a fixed time
        page.wait_for_function("""() => [...document.querySelectorAll(
            '[data-testid="stDataFrame"] [role="gridcell"]')].some(c => c.innerText.trim())""",
                               timeout=60_000)
        cells = page.evaluate("""() => [...document.querySelectorAll(
            '[data-testid="stDataFrame"] [role="gridcell"]')].map(c => c.innerText.trim())""")
    finally:
        page.close()
    study_name = runs["study"].name
    assert f"▾ {study_name}" in cells, cells[:40]


def test_live_run_shows_sweep_progress_that_advances(tmp_path_factory, browser, shots,
                                                     server):
    base, runs = server
    live = runs["live"]
    synth.set_progress(live, 1, 4, loading={"decode-0@node01": 0.4, "prefill-0@node02": 1.0,
                                            "prefill-1@node02": 0.0})
    port = free_port()
    log_path = live.parent / "streamlit.log"
    with open(log_path, "wb") as log:
        proc = dashboard.start(live.parent, host="127.0.0.1", port=port, stdout=log,
                               stderr=subprocess.STDOUT)
        try:
            url = dashboard.url("127.0.0.1", port)
            streamlit_healthy(url, proc, log_path)
            page = open_page(browser, f"{url}/overview?run={live.name}",
                             {"width": 1440, "height": 1400})
            try:
                settle(page, "Run overview", 1)
                bar = page.get_by_text(re.compile(r"^Sweep point 1 of 4"))
                bar.wait_for(timeout=30_000)
                assert page.get_by_text("decode-0@node01: 40%").count() == 1
                page.screenshot(path=str(shots / "live-overview-1.png"), full_page=True)
                # the orchestrator moves on: point 2 of 4, engines loaded
                synth.set_progress(live, 2, 4, seconds_left=300,
                                   loading={"decode-0@node01": 1.0, "prefill-0@node02": 1.0,
                                            "prefill-1@node02": 1.0})
                page.get_by_text(re.compile(r"^Sweep point 2 of 4")).wait_for(timeout=30_000)
                # the panel's bar is redrawn first and the engines' line after it, in one rerun
                page.get_by_text("All 3 engines finished loading").wait_for(timeout=30_000)
                text = page.inner_text("body")
                assert re.search(r"about \dm \d\ds left in the sweep", text), text
                assert "All 3 engines finished loading" in text
                page.screenshot(path=str(shots / "live-overview-2.png"), full_page=True)
                values = page.evaluate("""() => [...document.querySelectorAll(
                    '[data-testid="stProgress"] [role="progressbar"]')]
                    .map(p => +p.getAttribute('aria-valuenow'))""")
                assert values and values[0] == 25, values  # 1 of 4 points done
            finally:
                page.close()
        finally:
            stop(proc)


def test_kv_and_ttft_pages_of_the_72_gpu_run(server, browser, shots):
    base, runs = server
    run = runs["large"]
    got = visit(browser, f"{base}/kv?run={run.name}", "KV cache", 7, shots / "large-kv.png")
    assert "decode-1/e15" not in got["text"]  # engine labels live in the chart
    assert "KV capacity" in got["text"] and got["drawn"] >= 7
    got = visit(browser, f"{base}/ttft?run={run.name}", "TTFT breakdown", 1,
                shots / "large-ttft.png")
    assert "decode KV capacity" in got["text"]
    # two DEP16 decodes: the split per decode endpoint, each one's own row
    assert "Decode admission per endpoint" in got["text"]
    assert {"decode-0", "decode-1", "D admission ms"} <= set(got["canvas"]), got["canvas"]


def test_the_mtp_acceptance_per_point_of_the_72_gpu_run(server, browser, shots):
    base, runs = server
    run = runs["large"]
    got = visit(browser, f"{base}/sweep?run={run.name}", "Sweep", 3, shots / "large-sweep.png")
    assert "Speculative decoding" in got["text"] and "accepted ÷ drafted" in got["text"]
    drawn = set(got["canvas"])
    assert {"acceptance %", "mean acceptance length", "per position"} <= drawn, drawn
    assert any(t.startswith("0.75") and ", 0.56" in t for t in drawn), drawn


def test_the_kv_tiers_page_of_a_run_with_a_store(server, browser, shots):
    """Tokens by source per role, hits against the trace's theoretical rate, the store's and
    master's health and the verdicts naming the store full, evicting and slow, as drawn."""
    base, runs = server
    run = runs["kv_store"]
    got = visit(browser, f"{base}/kv-tiers?run={run.name}", "KV tiers", 3,
                shots / "kv-store-tiers.png")
    text = got["text"]
    for want in ("Prompt tokens by source, prefill", "Prompt tokens by source, decode",
                 "Hits against the trace's theoretical hit rate (black tick)",
                 "KV store and master health", "c=32 · KV store evicting",
                 "c=64 · KV store full: puts refused", "c=64 · KV store slower than recomputing",
                 "130 of 1,042 puts refused for space"):
        assert want in text, want
    drawn = set(got["canvas"])  # the tables are canvases: their texts as drawn
    assert {"master used (peak)", "evicted keys", "KV store hit", "P→D handoff"} <= drawn, drawn


def test_failed_run_shows_the_error(server, browser, shots):
    base, runs = server
    run = runs["failed"]
    got = visit(browser, f"{base}/overview?run={run.name}", "Run overview", 1,
                shots / "failed-overview.png")
    assert "This run failed during stage" in got["text"]
    assert "illegal memory access" in got["text"]


def test_pages_listed_in_navigation(server, browser):
    base, runs = server
    page = browser.new_page()
    try:
        page.goto(f"{base}/?run={runs['healthy'].name}", timeout=60_000)
        nav = page.locator('[data-testid="stSidebarNav"]')
        nav.wait_for(timeout=60_000)
        listed = nav.inner_text()
        for _, title, _, _ in ui.PAGES:
            assert title in listed
        # every page is visited (the study's and the comparison's by their own tests)
        assert len(ui.PAGES) == len(PAGES) + 2
    finally:
        page.close()


@pytest.fixture(scope="module")
def agentic_run(server, tmp_path_factory) -> Path:
    """One local agentic run shared by the agentic page tests (docs/agentic.md): simulated
    engines behind the real router, the real AIPerf replaying 3 sessions of 3 turns at 3 live
    sessions; one prefill of 80 KV blocks (the sessions' prefixes do not fit: the capacity
    cliff) and two decodes logging each request. Copied where the server reads runs."""
    from agentic_trace import agentic_recipe, aiperf_or_fail, write_tokenizer, write_trace

    aiperf_or_fail()
    tmp = tmp_path_factory.mktemp("agentic")
    write_tokenizer(tmp / "tok")
    trace = write_trace(tmp / "trace.jsonl", 3, 3)
    prof = profile_copy(tmp / "local.yaml", "local",
                        port_base=free_port_base(range(29400, 31400, 200), 200))
    code, out = launcher(tmp, "submit", str(agentic_recipe(tmp, trace, decodes=2)),
                         "--set", f"cluster={prof}", "--set", "prefill.endpoints=1",
                         "--set", "prefill.args={num-gpu-blocks-override: 80}",
                         "--set", "prefill.env.SIM_PREFILL_TOKENS_PER_S=2000",
                         "--set", "benchmark.concurrency=[3]")
    assert code == 0, out
    (run,) = [p.parent for p in (tmp / "runs").glob("*/plan.json")]
    _, runs = server
    dest = runs["demo"].parent / run.name
    shutil.copytree(run, dest)
    return dest


CHART_TITLES_JS = f"""() => [...document.querySelectorAll('{CHART} svg.marks')].map(s => [
  (s.querySelector('.role-title-text') || {{}}).textContent,
  [...s.querySelectorAll('.role-legend-label text, .role-axis-title text')]
    .map(t => t.textContent),
  s.querySelectorAll('g.mark-rect path').length])"""
# (page, title, charts, texts on the page, (chart title starts with, a legend or axis text
# in it, its rects: the shaded KV-full spans on the timeline)) for the agentic run
AGENTIC_PAGES = [
    ("sweep", "Sweep", 5, ["Agentic sessions", "Sessions per decode endpoint"],
     ("Sessions per decode endpoint", "sessions", 1)),
    ("kv", "KV cache", 6, ["Agentic point: KV use, prefix hits and queue",
                           "c=3: KV capacity cliff. prefill KV at or above 90%"],
     ("c=3: KV use, prefix hits and queue", "prefix-cache hit rate, prefill", 1)),
    ("ttft", "TTFT breakdown", 2, ["TTFT against the turn's context (agentic)",
                                   "The prefill compute line is the turn's whole context",
                                   "c=3: TTFT p50 "],
     ("TTFT against the turn's context", "prefill compute line", 0)),
]


@pytest.mark.parametrize("path, title, min_charts, wanted, figure", AGENTIC_PAGES,
                         ids=[p[0] for p in AGENTIC_PAGES])
def test_the_agentic_pages(server, browser, shots, agentic_run, path, title, min_charts,
                           wanted, figure):
    """An agentic run's pages at 1440 and 1280 px, every check of the other pages, with
    their figures drawn: sessions per decode, the point's KV, hits and queue with the KV-full
    spans shaded, TTFT against the turn's context with the compute line."""
    base, _ = server
    got = visit(browser, f"{base}/{path}?run={agentic_run.name}", title, min_charts,
                shots / f"agentic-{path}.png", then=lambda page: page.evaluate(CHART_TITLES_JS))
    for w in wanted:
        assert w in got["text"], f"{w!r} missing on {path}"
    start, inside, rects = figure
    charts_ = [c for c in got["then"] if (c[0] or "").startswith(start)]
    assert charts_, [c[0] for c in got["then"]]
    (_, texts, n_rects), = charts_
    assert inside in texts and n_rects >= rects, (texts, n_rects)


def test_screenshots_were_written(shots):
    names = sorted(p.name for p in shots.glob("*.png"))
    print("screenshots:\n" + "\n".join(f"  {shots / n}" for n in names))
    for want in ("demo-overview.png", "demo-kv.png", "study-study.png", "compare-study.png",
                 "live-overview-2.png",
                 "study-p2-overview.png", "runs-list.png", "agentic-kv.png"):
        assert want in names


LONG = "20261206-043049-deepseek-v4-pro-gb200-8k1k-mid-curve-megamoe-mtp2"


@pytest.mark.parametrize("path, title, min_charts", [
    ("runs", "Runs", 0),
    ("sweep", "Sweep", 3), ("kv", "KV cache", 6)])
def test_a_run_of_a_long_srt_slurm_name_reads_whole(server, browser, shots, path, title,
                                                    min_charts):
    """A run of an imported srt-slurm recipe has a long name: the Runs, Sweep and KV cache
    pages show it, and every other text, whole at 1440 and 1280 px."""
    base, runs = server
    long = runs["demo"].parent / LONG
    if not long.exists():
        shutil.copytree(runs["demo"], long)
        recipe = long / "recipe.yaml"
        recipe.write_text(recipe.read_text().replace("name: local-sim",
                                                     "name: " + LONG.split("-", 2)[2], 1))
    # the Runs table's columns outgrow a 1280 px page with this name: its run column wraps
    wraps = path == "runs"
    got = visit(browser, f"{base}/{path}?run={LONG}", title, min_charts,
                shots / f"long-{path}.png", row_px=ui.WRAP_ROW_PX if wraps else ui.ROW_PX)
    if wraps:  # the name in the table's cells, drawn on lines that each fit its column
        assert LONG in "".join(got["canvas"]), got["canvas"][:40]
    else:
        assert LONG in got["text"] or LONG.split("-", 2)[2] in got["text"], got["text"][:400]
