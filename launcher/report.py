"""One self-contained HTML report of a run or a study, to attach to a pull request or send
to a colleague: it opens from disk in any browser, offline, with no server and no script.

    python -m launcher report RUN_OR_STUDY      # writes <dir>/report.html, prints its path

A run's report: its identity (recipe, model, topology, GPUs, times, state, verdict), the
headline figures and the per-point summary table exactly as summary.json holds them (the
file the orchestrator wrote, or `launcher.run.figures.summary` when there is none yet), the
GSM8K gate, the Pareto chart (tok/s per GPU vs tok/s per user) and TTFT percentiles as
inline SVG, and each point's bottleneck verdict with its evidence (`launcher.analysis.diagnose`,
the dashboard's rules on the same telemetry). A study's report: the same per
configuration, all configurations on one Pareto chart, the best configuration per
interactivity band and the P:D recommendation when `launcher.analysis.recommend` gives one.

Charts are drawn here as SVG (no Vega, no JavaScript): nothing to fetch, nothing that a
mail client or an HTML sanitiser strips. Every number cell carries its exact value in
`data-value` and its summary.json key in `data-key`, so a test can compare them.
"""

from __future__ import annotations

import contextvars
import html
import math
import sys
import time
from pathlib import Path
from typing import Any

from launcher.run import listing, numbers
from launcher.run.figures import realized_lengths
from launcher.run.plandoc import PlanError, read_plan
from launcher.run.results import load_results
from launcher.run.rundir import REPORT, RunDir, read_json
from launcher.run.vocab import Kind

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
MEASURE = "total_tokens_per_s_per_gpu"
MEASURE_TITLE = "Total tok/s per working GPU (input+output ÷ P+D GPUs)"
ALLOCATED = "total_tokens_per_s_per_allocated_gpu"
X_TITLE = "tok/s per user (1000 ÷ median TPOT ms)"


# --- small formatting helpers ----------------------------------------------------------------


def _three_figures(v: float) -> int:
    """Decimals that keep three significant figures of a value under 100 (30 MiB reads
    0.0293 GiB, not 0.00), two at least."""
    if not isinstance(v, (int, float)) or v != v or v == 0 or abs(v) >= 100:
        return 2
    return max(2, 2 - math.floor(math.log10(abs(v))))


def esc(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def num(v: Any, digits: int = 0) -> str:
    return numbers.number(v, digits)  # the one formatter (CLI, dashboard, report)


def when(ts: Any) -> str:
    if not isinstance(ts, (int, float)) or not ts:
        return "–"
    try:
        t = time.localtime(ts)
    except (OverflowError, OSError, ValueError):  # no date of this calendar
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S ", t) + (t.tm_zone or "")


def duration(a: Any, b: Any) -> str:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or b < a:
        return "–"
    s = int(b - a)
    return f"{s // 3600}h {s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def cell(v: Any, key: str | None = None, digits: int = 0) -> str:
    """A number cell: the shown text plus the exact value and its summary.json key."""
    attrs = ' class="n"'
    if key:
        attrs += f' data-key="{esc(key)}"'
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        attrs += f' data-value="{v!r}"'
    return f"<td{attrs}>{num(v, digits)}</td>"


def table(head: list[str], rows: list[str], cls: str = "") -> str:
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    return (f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>'
            + "".join(f"<tr>{r}</tr>" for r in rows) + "</tbody></table>")


def kv_table(pairs: list[tuple[str, str]]) -> str:
    return ('<table class="kv"><tbody>' + "".join(
        f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in pairs) + "</tbody></table>")


# --- SVG charts --------------------------------------------------------------------------------


def nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k apart) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0, 1.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    k = 0
    while True:
        v = start + k * step
        ticks.append(round(v, 10))
        if v >= hi - 1e-9 * step:
            break
        k += 1
    return ticks


def tick_text(v: float, ticks: list[float]) -> str:
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    digits = 0 if step >= 1 else min(6, int(math.ceil(-math.log10(step))) + 1)
    s = f"{v:,.{digits}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


# What every chart of the page being rendered says of itself (SIMULATION, vLLM (CPU)).
CHART_MARK: contextvars.ContextVar[str] = contextvars.ContextVar("chart_mark", default="")


def svg_chart(series: list[dict], *, x_title: str, y_title: str, frontier: list | None = None,
              log2_x: bool = False, y_from_zero: bool = True, width: int = 860,
              height: int = 400, title: str = "", mark: str = "",
              hline: tuple[float, str] | None = None, rules: tuple = (),
              spans: tuple = (), x_range: tuple[float, float] | None = None) -> str:
    """A scatter/line chart as inline SVG. `series`: [{"name", "color", "points": [(x, y,
    label, tooltip)], "line": bool, "dash": bool, "hollow": bool}]. `frontier`: [(x, y)]
    drawn dashed. `hline`: (y, label) a horizontal line across it (an SLO's limit); `rules`
    more of them. `spans`: (x0, x1, label) shaded. `x_range`: the x axis's ends (charts
    stacked on one time axis)."""
    rules = ((hline,) if hline is not None else ()) + tuple(rules)
    pts = [(x, y) for s in series for x, y, *_ in s["points"]
           if math.isfinite(x) and math.isfinite(y) and (x > 0 or not log2_x)]
    if not pts:
        return '<p class="note">No ok sweep point to draw.</p>'
    ml, mr, mt, mb = 78, 24, 16, 52
    pw, ph = width - ml - mr, height - mt - mb

    def fx(x: float) -> float:
        return math.log2(x) if log2_x else x

    xs = [fx(x) for x, _ in pts] + (list(x_range) if x_range else [])
    ys = [y for _, y in pts]
    if log2_x:
        values = sorted({x for x, _ in pts})
        xt = [fx(v) for v in values]
        xlabels = [num(v) for v in values]
        x0, x1 = min(xt), max(xt)
        pad = max((x1 - x0) * 0.05, 0.25)
        x0, x1 = x0 - pad, x1 + pad
    else:
        xt = nice_ticks(min(xs), max(xs))
        xlabels = [tick_text(v, xt) for v in xt]
        x0, x1 = xt[0], xt[-1]
    yt = nice_ticks(0.0 if y_from_zero else min(ys), max(ys + [r[0] for r in rules]))
    y0, y1 = yt[0], yt[-1]

    def px(x: float) -> float:
        return ml + (fx(x) - x0) / ((x1 - x0) or 1.0) * pw

    def py(y: float) -> float:
        return mt + ph - (y - y0) / ((y1 - y0) or 1.0) * ph

    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} '
           f'{height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{esc(title or y_title)}">']
    mark = mark or CHART_MARK.get()
    if mark:  # a chart copied out of the page still says what it measured
        out.append(f'<text x="{ml + pw - 6}" y="{mt + 18}" text-anchor="end" class="mark">'
                   f"{esc(mark)}</text>")
    for v in yt:  # horizontal grid and y labels
        y = py(v)
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{ml - 8}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
                   f"{esc(tick_text(v, yt))}</text>")
    for v, lab in zip(xt, xlabels, strict=True):
        x = ml + (v - x0) / ((x1 - x0) or 1.0) * pw
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{mt + ph}" class="grid"/>')
        out.append(f'<text x="{x:.1f}" y="{mt + ph + 18}" text-anchor="middle" class="tick">'
                   f"{esc(lab)}</text>")
    out.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" class="frame"/>')
    out.append(f'<text x="{ml + pw / 2:.1f}" y="{height - 10}" text-anchor="middle" '
               f'class="axis-title">{esc(x_title)}</text>')
    out.append(f'<text transform="translate(16 {mt + ph / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle" class="axis-title">{esc(y_title)}</text>')
    for a, b, lab in spans:
        x0_, x1_ = max(px(a), ml), min(px(b), ml + pw)
        out.append(f'<rect x="{x0_:.1f}" y="{mt}" width="{max(x1_ - x0_, 1):.1f}" '
                   f'height="{ph}" class="span"><title>{esc(lab)}</title></rect>')
    for y_, lab in rules:
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{py(y_):.1f}" '
                   f'y2="{py(y_):.1f}" class="limit"><title>{esc(lab)}</title>'
                   f'</line><text x="{ml + 6}" y="{py(y_) - 6:.1f}" class="limit-lab">'
                   f"{esc(lab)}</text>")
    if frontier:
        fr = sorted(frontier)
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in fr)
        out.append(f'<polyline points="{path}" class="frontier"><title>Pareto frontier'
                   "</title></polyline>")
    for s in series:
        good = [p for p in s["points"] if math.isfinite(p[0]) and math.isfinite(p[1])
                and (p[0] > 0 or not log2_x)]
        if s.get("line") and len(good) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, *_ in good)
            dash = ' stroke-dasharray="5 3"' if s.get("dash") else ""
            out.append(f'<polyline points="{path}" class="curve" stroke="{s["color"]}"{dash}>'
                       f"<title>{esc(s['name'])}</title></polyline>")
        for x, y, label, tip in good:
            fill = (f'fill="#fff" stroke="{s["color"]}" stroke-width="2" class="pt ref"'
                    if s.get("hollow") else f'fill="{s["color"]}" class="pt"')
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4.5" {fill}>'
                       f"<title>{esc(tip)}</title></circle>")
            if label:
                out.append(f'<text x="{px(x) + 7:.1f}" y="{py(y) - 7:.1f}" class="lab">'
                           f"{esc(label)}</text>")
    out.append("</svg>")
    legend = "".join(
        f'<span class="key"><i class="dash" style="border-color:{s["color"]}"></i>'
        f"{esc(s['name'])} (dashed)</span>" if s.get("dash") else
        f'<span class="key"><i style="border:2px solid {s["color"]};background:#fff;'
        f'width:8px;height:8px;border-radius:6px"></i>{esc(s["name"])}</span>'
        if s.get("hollow") else
        f'<span class="key"><i style="background:{s["color"]}"></i>{esc(s["name"])}</span>'
        for s in series if s.get("name"))
    if frontier:
        legend += '<span class="key"><i class="dash"></i>Pareto frontier</span>'
    return "".join(out) + (f'<div class="legend">{legend}</div>' if legend else "")


# --- data ------------------------------------------------------------------------------------


def run_summary(rd: RunDir) -> tuple[dict, str]:
    """summary.json as written (the record), else computed now by the same function."""
    from launcher.run import figures

    doc = read_json(rd.summary)
    why = figures.summary_problem(doc) if doc is not None else None
    if why is None and doc is not None and not isinstance(doc.get("points"), list):
        why = "it has no points"
    if doc is not None and why is None:
        return doc, "summary.json"
    if doc is None and rd.summary.exists():
        why = "not valid JSON"
    # a damaged summary.json costs nothing but itself: the figures are computed again
    had = f"summary.json is damaged ({why})" if why else "no summary.json"
    from launcher.analysis import load

    return (figures.summary(rd.path, log_signals=load.log_signals(rd.path)),
            f"computed now by launcher.run.figures ({had})")


def verdicts(rd: RunDir) -> tuple[dict[Any, dict], str | None]:
    """Per concurrency: the dashboard's verdict (short, title, evidence), or why none."""
    try:
        from launcher.analysis import studies
    except ImportError as e:  # the dashboard's pandas stack is not installed
        return {}, f"verdicts need the dashboard's dependencies ({e})"
    try:
        t = studies.run_table(rd.path)
    except Exception as e:  # noqa: BLE001 - a report without verdicts beats no report
        return {}, f"verdicts could not be computed: {type(e).__name__}: {e}"
    out = {}
    for r in t.to_dict("records"):
        c = r.get("concurrency")
        key = int(c) if isinstance(c, (int, float)) and math.isfinite(c) else r.get("point")
        out[key] = {"short": r.get("verdict"), "title": r.get("verdict_title"),
                    "evidence": r.get("evidence") or "", "kind": r.get("verdict_kind"),
                    "spec": [r.get(k) for k in SPEC_KEYS]}
    return out, None


def decode_endpoints(rd: RunDir) -> str:
    """Each decode endpoint per sweep point ('' with fewer than two): its admission wait,
    its own TTFT and its peak KV use, which the point's means hide."""
    try:
        from launcher.analysis import derive, load
    except ImportError:  # the dashboard's pandas stack is not installed
        return ""
    try:
        info = load.run_info(rd.path)
        if not info.has_telemetry:
            return ""
        plan = load.read_plan_safe(rd.path)[0]
        ss = derive.SeriesSet(load.read_telemetry(rd.path, names=load.TTFT_NAMES), plan)
        t = derive.decode_endpoints(load.load_bench(rd.path), ss)
    except Exception:  # noqa: BLE001 - a report without this table beats no report
        return ""
    if t.empty or t["endpoint"].nunique() < 2:
        return ""
    rows = [f"<td>{esc(r['point'])}</td><td>{esc(r['endpoint'])}</td>"
            + cell(round(r["requests"]), None) + cell(r["admission_s"] * 1000.0, None)
            + cell(r["engine_ttft_s"] * 1000.0, None) + cell(r["kv_max"] * 100.0, None, 1)
            for r in t.to_dict("records")]
    return ("<h2>Decode admission per endpoint</h2>"
            + table(["point", "decode endpoint", "requests", "admission ms", "its TTFT ms",
                     "KV max %"], rows)
            + '<p class="note">Over each point\'s window: the requests each decode endpoint '
            "admitted, their mean wait for admission, the endpoint's own mean TTFT and its "
            "peak KV use (its most used engine).</p>")


def kv_tiers(rd: RunDir) -> str:
    """Where each sweep point's prompt tokens came from (per role), the hits against the
    trace's theoretical rate, the KV store's and its master's health and the store's
    verdicts ('' without telemetry of prompt tokens; docs/kv-store.md)."""
    try:
        from launcher.analysis import derive, kv_tiers, load
    except ImportError:  # the dashboard's pandas stack is not installed
        return ""
    try:
        if not load.run_info(rd.path).has_telemetry:
            return ""
        plan = load.read_plan_safe(rd.path)[0]
        ss = derive.SeriesSet(load.read_telemetry(rd.path, names=load.TIER_NAMES), plan)
        points = load.load_bench(rd.path)
        health = kv_tiers.point_health(points, ss, plan)
        long = kv_tiers.sources_long(health)
        reuse = kv_tiers.reuse(points, ss, plan)
        rows_h = kv_tiers.health_rows(health)
    except Exception:  # noqa: BLE001 - a report without this section beats no report
        return ""
    if long.empty:
        return ""
    titles = [kv_tiers.SOURCE_TITLES[s] for s in kv_tiers.SOURCES]
    rows = []
    for (point, role), g in long.groupby(["point", "role"], sort=False):
        share = dict(zip(g["source"], g["share"], strict=True))
        rows.append(f"<td>{esc(point)}</td><td>{esc(role)}</td>"
                    + cell(float(g["tokens"].sum()), None)
                    + "".join(cell(share.get(t, 0.0) * 100.0, None, 1) for t in titles))
    out = ["<h2>KV tiers: where each prompt token came from</h2>",
           table(["point", "role", "prompt tokens", *(f"{t} %" for t in titles)], rows),
           '<p class="note">Over each point\'s window, from vllm:prompt_tokens_by_source with '
           "the external tokens split by vllm:prompt_tokens_cached_by_source (p2p = the P→D "
           "handoff, external_unspecified = the Mooncake store, host/disk = CPU offload; "
           "docs/kv-store.md).</p>"]
    if len(reuse) and reuse["theoretical"].notna().any():
        rr = [f"<td>{esc(r['point'])}</td><td>{esc(r['role'])}</td>"
              + cell(r["local_hit_share"] * 100.0, None, 1)
              + cell(r["store_hit_share"] * 100.0, None, 1)
              + cell(r["offload_hit_share"] * 100.0, None, 1)
              + cell(r["achieved"] * 100.0, None, 1) + cell(r["theoretical"] * 100.0, None, 1)
              for r in reuse.to_dict("records")]
        out += ["<h3>Hits against the trace's theoretical hit rate</h3>",
                table(["point", "on", "local hit %", "store hit %", "offload hit %",
                       "all hits %", "the trace offers %"], rr)]
    if kv_tiers.any_tier_data(health):
        shown = rows_h.dropna(axis=1, how="all")
        cols = [c for c in shown.columns if c != "point"]
        pct = {"used_max", "watermark"}
        hr = [f"<td>{esc(r['point'])}</td>"
              + "".join(cell(r[c] * 100.0, None, 1) if c in pct else
                        cell(r[c], None, 3 if c.endswith("_per_token") else
                             _three_figures(r[c]) if c.endswith("_gib") else 2
                             if c.endswith("_ms") else 0)
                        for c in cols) for r in shown.to_dict("records")]
        out += ["<h3>KV store and master health</h3>",
                table(["point", *(kv_tiers.HEALTH_TITLES.get(c, c) + (" %" if c in pct else "")
                                  for c in cols)], hr)]
        items = [(h["point"], title, ev) for h in health for _, title, ev in h["verdicts"]]
        out.append("<h3>Store verdicts</h3>")
        out.append("<ul>" + "".join(
            f"<li><b>{esc(p)}</b> · {esc(t)}<ul>" + "".join(f"<li>{esc(e)}</li>" for e in ev)
            + "</ul></li>" for p, t, ev in items) + "</ul>" if items else
            f'<p class="note">{esc(kv_tiers.healthy_sentence(health))}</p>')
    return "".join(out)


SPEC_KEYS = ("spec_acceptance_rate", "spec_mean_acceptance_length", "spec_per_position")


def prefix_reuse(s: dict, vmap: dict) -> str:
    """An agentic run's prefix-cache hit rate per point, achieved beside what the trace
    offers, and the point's verdict ('' for other runs; docs/agentic.md)."""
    rows = []
    for p in s.get("points") or []:
        ag = p.get("agentic")
        if not isinstance(ag, dict):
            continue
        c = p.get("max_concurrency")
        hit = ag.get("prefix_hit_rate")
        tiers = ag.get("tier_hit_rate")
        offered = ag.get("offered_hit_rate", ag.get("trace_hit_rate"))  # older summaries
        v = vmap.get(c) or {}
        rows.append(f'<td class="n">{esc(c)}</td>'
                    + cell(None if hit is None else hit * 100.0, None, 1)
                    + cell(None if tiers is None else tiers * 100.0, None, 1)
                    + cell(None if offered is None else offered * 100.0, None, 1)
                    + f"<td>{esc(v.get('short') or '–')}</td>")
    if not rows:
        return ""
    return ("<h3>Prefix reuse (agentic)</h3>"
            + table(["live sessions", "GPU prefix hit % achieved", "store/offload hit %",
                     "the trace offers %", "verdict"], rows)
            + '<p class="note">Achieved: the prefills\' vllm:prefix_cache_hits ÷ queries over '
              "the point (their own GPU KV); store/offload: vllm:external_prefix_cache_hits "
              "÷ queries on the same engines (a KV store or CPU offload; — without one); "
              "offered: each turn's resent session context over all prompt "
              "tokens of the trace (an unbounded cache). A gap with the KV full is the "
              "capacity cliff.</p>")


def agentic_views(rd: RunDir, vmap: dict) -> str:
    """An agentic run ('' for others; docs/agentic.md): TTFT against the turn's context per
    point, sessions per decode endpoint, and one point's KV use, prefix hits and queue on one
    time axis with the capacity cliff's evidence shaded."""
    try:
        from launcher.analysis import agentic, load

        points = load.load_bench(rd.path)
        plan = load.read_plan_safe(rd.path)[0]
        ag = agentic.load_run(rd.path, points, plan)
        if ag is None:
            return ""
        return (ttft_by_context(ag) + sessions_per_decode(ag)
                + point_timeline(rd, ag, points, plan, vmap))
    except Exception:  # noqa: BLE001 - a report without these beats no report
        return ""


def ttft_by_context(ag) -> str:
    b = ag.buckets
    if b.empty:
        return ""
    series = []
    for k, (point, g) in enumerate(b.groupby("point", sort=False)):
        color = PALETTE[k % len(PALETTE)]
        for stat, col, extra in (("p50", "ttft_p50_ms", {"line": True}),
                                 ("p90", "ttft_p90_ms", {"line": True, "hollow": True})):
            series.append({"name": f"{point} TTFT {stat}", "color": color, **extra,
                           "points": [(r.context_mean, getattr(r, col), "",
                                       f"{point} {r.bucket} tokens: TTFT {stat} "
                                       f"{getattr(r, col):,.0f} ms ({r.requests} requests)")
                                      for r in g.itertuples()]})
        slope = ag.ms_per_token.get(point)
        if slope:
            lo, hi = float(g["context_mean"].min()), float(g["context_mean"].max())
            series.append({"name": f"{point} prefill compute line", "color": color,
                           "line": True, "dash": True,
                           "points": [(x, x * slope, "", f"{point}: {x:,.0f} tokens computed "
                                       f"at {slope:.3f} ms each") for x in (lo, hi)]})
    from launcher.analysis import agentic

    said = "".join(f"<li>{esc(c)}</li>" for c in agentic.line_crossings(b))
    rows = [f"<td>{esc(r.point)}</td><td>{esc(r.bucket)}</td>" + cell(int(r.requests))
            + cell(r.context_mean, None) + cell(r.ttft_p50_ms, None)
            + cell(r.ttft_p90_ms, None) + cell(r.compute_ms, None)
            + cell(r.over_line, None, 2) for r in b.itertuples()]
    return ("<h3>TTFT against the turn's context (agentic)</h3>"
            + svg_chart(series, x_title="the turn's context (prompt tokens)",
                        y_title="TTFT (ms)", height=340, title="TTFT against context")
            + (f"<ul>{said}</ul>" if said else "")
            + table(["point", "context tokens", "requests", "mean context", "TTFT p50 ms",
                     "TTFT p90 ms", "compute line ms", "p50 ÷ line"], rows)
            + '<p class="note">From AIPerf\'s own per-request records (profile_export.jsonl: '
              "each request's TTFT and the server's prompt-token count, the session's history "
              "and the turn), profiling phase. The prefill compute line (dashed) is the whole "
              "context computed at the rate the prefills measured over the point "
              "(vllm:request_prefill_time_seconds ÷ computed prompt tokens, as AIPerf scraped "
              "them): TTFT under it is the prefix cache saving work; at or over it, a turn "
              "computed again or waiting.</p>")


def sessions_per_decode(ag) -> str:
    t = ag.sessions
    if t.empty:
        return ('<h3>Sessions per decode endpoint</h3><p class="note">The decodes logged no '
                "per-request line (the simulator logs one with --enable-log-requests; real "
                "vLLM's line does not name the conversation), so how the sessions spread is "
                "not known.</p>")
    rows = [f"<td>{esc(r.point)}</td><td>{esc(r.endpoint)}</td>" + cell(int(r.sessions))
            + cell(int(r.requests)) + cell(int(r.split)) for r in t.itertuples()]
    split = int(t["split"].sum())
    return ("<h3>Sessions per decode endpoint</h3>"
            + table(["point", "decode endpoint", "sessions", "requests",
                     "also on another decode"], rows)
            + '<p class="note">From the decodes\' own per-request lines (a session is its '
              "conversation). "
            + (f"{split} session(s) had turns on more than one decode." if split else
               "Every session's turns reached one decode endpoint.") + "</p>")


def point_timeline(rd: RunDir, ag, points: list[dict], plan, vmap: dict) -> str:
    """The point with the capacity-cliff verdict (else the top one) on one time axis."""
    from launcher.analysis import agentic, derive, diagnose, load

    if not load.run_info(rd.path).has_telemetry:
        return ""
    cands = [p for p in points if isinstance(p.get("agentic"), dict) and derive.window_of(p)]
    if not cands:
        return ""
    cliff = [p for p in cands
             if (vmap.get(p.get("max_concurrency")) or {}).get("kind") == diagnose.KV_CLIFF]
    p = (cliff or cands)[-1]
    w = derive.window_of(p)
    from launcher.run.figures import offered_hit_rate

    offered = offered_hit_rate(p["agentic"])
    th = diagnose.Thresholds()
    ss = derive.SeriesSet(load.read_telemetry(rd.path, names=load.KV_NAMES), plan)
    tl = agentic.point_timeline(ss, w, sorted(set(ag.roles.values())), ag.holder, offered,
                                th.kv_full, plan.telemetry_interval_s if plan else 1.0)
    f = tl["frame"]
    if f.empty:
        return ""
    span = (0.0, w.end - w.start)
    pct, wait = [], []
    for k, (name, g) in enumerate(f.groupby("series", sort=False)):
        scale = 1.0 if g["measure"].iloc[0] == "waiting" else 100.0
        mid = [t - w.start for t in g["t"]]  # bins' middles
        pts = [(x, v * scale, "", f"{name}, bin at +{x:,.1f} s: {v * scale:,.1f}")
               for x, v in zip(mid, g["value"], strict=True)]
        s_ = {"name": name, "color": PALETTE[k % len(PALETTE)], "line": True, "points": pts}
        (wait if g["measure"].iloc[0] == "waiting" else pct).append(s_)
    rules = [(th.kv_full * 100.0, f"KV {th.kv_full:.0%}")]
    if offered is not None:
        rules.append((offered * 100.0, f"the trace offers {offered:.0%}"))
    spans = [(a - w.start, b - w.start, f"{tl['holder']} KV ≥ {th.kv_full:.0%}")
             for a, b in tl["full_spans"]]
    said = agentic.timeline_evidence(tl)
    label = derive.point_label(p)
    return (f"<h3>{esc(label)}: KV use, prefix hits and queue on one time axis</h3>"
            + svg_chart(pct, x_title="seconds into the point", y_title="percent",
                        height=300, rules=tuple(rules), spans=tuple(spans), x_range=span,
                        title="KV use and prefix-cache hit rate")
            + (svg_chart(wait, x_title="seconds into the point", y_title="requests waiting",
                         height=200, spans=tuple(spans), x_range=span,
                         title="requests waiting") if wait else "")
            + '<p class="note">Over the point\'s measured window in '
              f"{tl['bin_s']:g} s bins of the run's telemetry: KV use of the fullest engine "
              f"per role, the prefix-cache hit rate of the {esc(tl['holder'])} engines "
              "(Δvllm:prefix_cache_hits ÷ Δqueries), requests waiting per role; shaded: "
              f"{esc(tl['holder'])} KV at or above {th.kv_full:.0%}. "
            + esc("; ".join(said) + "." if said else "The KV stayed under the line.")
            + "</p>")


def speculative(vmap: dict) -> str:
    """Speculative decoding per sweep point ('' when no point drafted)."""
    rows = []
    for c, v in vmap.items():
        rate, length, per_pos = v.get("spec") or (None, None, None)
        if not (isinstance(rate, float) and math.isfinite(rate)):
            continue
        rows.append(f'<td class="n">{esc(c)}</td>' + cell(rate * 100.0, None, 1)
                    + cell(length, None, 2) + f"<td>{esc(per_pos or '–')}</td>")
    if not rows:
        return ""
    return ("<h2>Speculative decoding per sweep point</h2>"
            + table(["conc", "acceptance %", "mean acceptance length", "per position"], rows)
            + '<p class="note">Over each point\'s window, from vLLM\'s vllm:spec_decode_* '
            "counters of every engine: accepted ÷ drafted tokens; mean acceptance length = 1 + "
            "accepted ÷ drafts.</p>")


def _plan(rd: RunDir):
    try:
        return read_plan(rd.plan)
    except PlanError:
        return None


def _plan_problem(rd: RunDir) -> str | None:
    """Why an existing plan.json cannot be read (the report goes on without it)."""
    try:
        read_plan(rd.plan)
    except PlanError as e:
        return str(e).replace(f"{rd.plan}: ", "") if rd.plan.exists() else None
    return None


# --- sections ----------------------------------------------------------------------------------


def _on_cpu(rd: RunDir, s: dict) -> bool:
    """Real vLLM on a host CPU: the summary says so, or (an older summary) plan.json does."""
    if s.get("vllm_cpu"):
        return True
    plan = _plan(rd)
    return bool(plan and plan.engine_kind.on_host_cpu)  # an older summary has no vllm_cpu


def identity(rd: RunDir, s: dict, source: str) -> str:
    plan = _plan(rd)
    st = rd.status()
    rec = st.record
    den = s.get("denominators") or {}
    gpus = ", ".join(f"{k.removeprefix('gpus_')} {v}" for k, v in den.items())
    if isinstance(s.get("gpus_allocated"), int) and s["gpus_allocated"] > 0:
        gpus += (f"; working = total (the endpoints' GPUs); allocated {s['gpus_allocated']} "
                 "(nodes × GPUs per node)")
    pairs = [
        ("run", f"<code>{esc(s.get('run_id') or rd.run_id)}</code>"),
        ("recipe", esc(s.get("recipe") or (plan.recipe if plan else "–"))),
        ("cluster", esc(plan.cluster if plan else "–")),
        ("model", esc(plan.model_path if plan else s.get("model") or "–")
         + (f" (served as <code>{esc(plan.served_name)}</code>)" if plan else "")),
        ("engine", esc(s.get("engine") or "–") + (" — <b>SIMULATION</b>"
                                                  if s.get("simulated") else "")
         + (" — <b>vLLM (CPU)</b>: real vLLM on a host CPU, not a GPU measurement"
            if _on_cpu(rd, s) else "")),
        ("mode", esc(s.get("mode") or "–")),
        ("topology", esc(plan.topology() if plan else "–")),
        ("GPUs (denominators)", esc(gpus or "–")),
        ("state", esc(st.state) + (f" — {esc(st.error)}" if st.error else "")),
        *[("damaged", esc(f"{why}: left out")) for why in st.damaged.values()],
        *([("damaged", esc(f"{why}: left out"))] if plan is None and (
            why := _plan_problem(rd)) else []),
        ("started", esc(when(rec.started if rec else None))),
        ("ended", esc(when(rec.ended if rec else None))),
        ("duration", esc(duration(rec.started if rec else None, rec.ended if rec else None))),
        ("Slurm job", esc(st.slurm_job_id or "–")),
        ("figures from", esc(source)),
    ]
    return kv_table(pairs)


def workload_sent(rd: RunDir, b) -> str:
    """plan.json's account of the workload; a plan from before it recorded the rule drew
    by vLLM's."""
    plan = _plan(rd)
    if plan is not None and plan.workload.get("text"):
        return f"random, {plan.workload['text']}"
    return (f"random ISL/OSL {b.input_len}/{b.output_len}, range ratio {b.range_ratio:g} by "
            "vLLM's rule [L(1-r), L(1+r)] (the plan predates the recorded length rule)")


def realized_text(rd: RunDir) -> str:
    """What the requests really were, over every point that kept its lengths."""
    got = [x for x in (realized_lengths(p) for p in load_results(rd.path)) if x]
    if not got:
        return ""
    n = sum(x["requests"] for x in got)

    def side(k: str) -> str:
        mean = sum(x[k]["mean"] * x["requests"] for x in got) / n
        return (f"{k}s {min(x[k]['min'] for x in got):,}-{max(x[k]['max'] for x in got):,} "
                f"(mean {mean:,.1f})")

    return f"{side('input')}, {side('output')} tokens over {n:,} requests"


def measured(rd: RunDir) -> str:
    """The workload and settings the figures come from, from the run's own recipe.yaml,
    plan.json and run.json: lengths, concurrencies, requests per point, the gate, the image
    and engine version, each role's engine flags, the time limit."""
    from launcher.schema import recipe as recipe_mod

    try:
        r = recipe_mod.load(str(rd.recipe))
    except Exception as e:  # noqa: BLE001 - a damaged recipe.yaml costs only this table
        return f'<p class="note">recipe.yaml cannot be read ({esc(e)}): settings not shown.</p>'
    b, a = r.benchmark, r.accuracy
    rec = rd.status().record
    ident = rec.identity if rec else {}
    pairs = []
    if b.enabled and b.custom is not None:
        from launcher.run.figures import custom_outcome

        code = custom_outcome(rd).get("exit_code")
        pairs += [("benchmark", esc(f"custom command (benchmark.custom), in place of the sweep: "
                                    f"{b.custom.command}")),
                  ("its exit status", esc("it did not end" if code is None else str(code))
                   + " (its output: logs/bench.log)")]
    elif b.enabled and b.agentic is not None:
        ag = b.agentic
        pairs += [
            ("benchmark", esc("agentic session replay (benchmark.agentic) with AIPerf, in "
                              f"place of the fixed-length sweep: {ag.trace}"
                              + ("" if ag.corpus else f" ({ag.trace_format})"))),
            ("live sessions", esc(", ".join(map(str, b.concurrency)))),
            ("per point", esc(f"{ag.duration_s:g} s" if ag.duration_s else
                              "every session of the trace once")),
            ("its files", esc("bench/aiperf-cNNNNN/ (AIPerf's own export, kept whole)")),
        ]
    elif b.enabled:
        pairs += [
            ("workload", esc(workload_sent(rd, b))),
            *(("lengths sent", esc(sent)) for sent in [realized_text(rd)] if sent),
            ("concurrencies", esc(", ".join(map(str, b.concurrency)))),
            ("requests per point", esc(", ".join(
                f"{c}: {b.prompts(c):,}" + (f" + {b.warmups(c)} warm-up" if b.warmups(c) else "")
                for c in b.concurrency))),
            ("benchmark client", esc(b.driver)),
        ]
    else:
        pairs.append(("sweep", "not run (benchmark.enabled: false)"))
    if a.enabled:
        pairs.append(("accuracy gate", esc(
            f"{a.task} {a.num_shots}-shot, {a.harness} harness, "
            f"{a.num_questions or 'all'} questions" + (f" x {a.repeat}" if a.repeat > 1 else "")
            + f", pass at >= {a.threshold:g}")))
    from launcher.run.figures import fingerprint_lines

    found = fingerprint_lines(ident, rd.read_submission().launcher)
    if not any(k == "image" for k, _ in found):
        image = r.container.image if r.container else None
        found.insert(0, ("image", image or "none (the engines' environment is the host's)"))
    if not any(k == "engine" for k, _ in found):
        found.insert(1, ("engine", r.engine_version or "–"))
    pairs += [(k, esc(v)) for k, v in found]
    plan = _plan(rd)
    seen: set[str] = set()
    for p in (plan.processes_of_kind(Kind.ENGINE) if plan else []):
        if p.headless or p.role in seen:
            continue
        seen.add(p.role)
        flags = p.argv[p.argv.index("serve") + 1:] if "serve" in p.argv else p.argv
        pairs.append((f"{p.role} engine flags", f"<code>{esc(' '.join(flags))}</code>"))
    cluster_kind = plan.cluster if plan else r.cluster
    pairs.append(("time limit", esc(f"{r.slurm.time_limit} (Slurm)" if rd.sbatch.exists()
                                    else f"none ({cluster_kind}: a local run)")))
    return kv_table(pairs)


def both_per_gpu(s: dict) -> bool:
    """Whether the allocation has GPUs that do not work (per working ≠ per allocated)."""
    alloc = s.get("gpus_allocated")
    return isinstance(alloc, int) and alloc > 0 and \
        alloc != (s.get("denominators") or {}).get("gpus_total")


def summary_table(s: dict, vmap: dict) -> str:
    agg = s.get("mode") == "agg"
    both = both_per_gpu(s)
    head = ["conc", "status", "tok/s per working GPU"]
    if both:
        head.append("tok/s per allocated GPU")
    if not agg:
        head += ["out tok/s / decode GPU", "in tok/s / prefill GPU"]
    head += ["tok/s/user", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p90",
             "TPOT p99", "req/s", "verdict"]
    rows = []
    for p in s.get("points") or []:
        c = p.get("max_concurrency")
        ok = p.get("status") == "ok"
        r = [f'<td class="n" data-key="max_concurrency" data-value="{esc(c)}">{esc(c)}</td>',
             f'<td class="{"ok" if ok else "bad"}">{"ok" if ok else "FAILED"}</td>',
             cell(p.get("total_tokens_per_s_per_gpu"), "total_tokens_per_s_per_gpu")]
        if both:
            r.append(cell(p.get(ALLOCATED), ALLOCATED))
        if not agg:
            r += [cell(p.get("output_tokens_per_s_per_decode_gpu"),
                       "output_tokens_per_s_per_decode_gpu"),
                  cell(p.get("input_tokens_per_s_per_prefill_gpu"),
                       "input_tokens_per_s_per_prefill_gpu")]
        r.append(cell(p.get("tokens_per_s_per_user"), "tokens_per_s_per_user", 1))
        for m in ("ttft", "tpot"):
            for q in (50, 90, 99):
                r.append(cell(p.get(f"{m}_p{q}_ms"), f"{m}_p{q}_ms", 0 if m == "ttft" else 1))
        r.append(cell(p.get("request_throughput"), "request_throughput", 2))
        v = vmap.get(c) or {}
        r.append(f"<td>{esc(v.get('short') or ('failed' if not ok else '–'))}</td>")
        rows.append("".join(r))
    alloc = (f"; per allocated GPU: ÷ the {s.get('gpus_allocated')} GPUs of the allocation's "
             "nodes, idle ones included" if both else "")
    return table(head, rows, "summary") + ('<p class="note">TTFT and TPOT in ms; per-GPU '
                                           "figures name their denominator (plan.json's "
                                           "gpu_count): per working GPU ÷ the GPUs of the "
                                           f"prefill and decode endpoints{esc(alloc)}.</p>")


def headline(s: dict) -> str:
    h = s.get("headline") or {}
    if not h:
        return '<p class="note">No ok sweep point: no headline figure.</p>'
    tiles = [("tok/s per working GPU (best point)", h.get("total_tokens_per_s_per_gpu"), 0,
              "total_tokens_per_s_per_gpu"),
             *([("tok/s per allocated GPU there", h.get(ALLOCATED), 0, ALLOCATED)]
               if both_per_gpu(s) else []),
             ("out tok/s per decode GPU", h.get("output_tokens_per_s_per_decode_gpu"), 0,
              "output_tokens_per_s_per_decode_gpu"),
             ("tok/s per user there", h.get("tokens_per_s_per_user"), 1,
              "tokens_per_s_per_user"),
             ("at concurrency", h.get("max_concurrency"), 0, "max_concurrency"),
             ("TTFT p99 (ms)", h.get("ttft_p99_ms"), 0, "ttft_p99_ms")]
    acc = s.get("accuracy") or {}
    out = []
    for title, v, d, key in tiles:
        val = f' data-value="{v!r}"' if isinstance(v, (int, float)) else ""
        out.append(f'<div class="tile"><div class="t">{esc(title)}</div><div class="v" '
                   f'data-key="headline.{key}"{val}>{num(v, d)}</div></div>')
    if acc:
        from launcher.run.figures import harness_of

        ok = acc.get("passed")
        out.append(f'<div class="tile"><div class="t">GSM8K, {esc(harness_of(acc))} harness '
                   f'({esc(acc.get("num_questions"))} questions)</div>'
                   f'<div class="v {"ok" if ok else "bad"}" '
                   f'data-key="accuracy.accuracy" data-value="{acc.get("accuracy")!r}">'
                   f'{num((acc.get("accuracy") or 0) * 100, 1)}%</div><div class="t">'
                   f'{"pass" if ok else "FAIL"} at ≥ {esc(acc.get("threshold"))}</div></div>')
    tiles_html = '<div class="tiles">' + "".join(out) + "</div>"
    if acc:
        from launcher.run.figures import accuracy_line

        tiles_html += f'<p class="accuracy">{esc(accuracy_line(acc))}</p>'
    from launcher.run.figures import signals_line

    sig = signals_line(s.get("log_signals"))
    return tiles_html + cost_line(s) + (
        f'<p class="signals">Log signals (docs/log-signals.md): {esc(sig)}</p>' if sig else "")


def cost_line(s: dict) -> str:
    """Where the allocation's time and GPU-hours went (summary.json's lifecycle)."""
    from launcher.run.figures import lifecycle_line

    line = lifecycle_line(s.get("lifecycle"))
    hours = (s.get("lifecycle") or {}).get("gpu_hours")
    val = f' data-value="{hours!r}"' if isinstance(hours, (int, float)) else ""
    return (f'<p class="cost" data-key="lifecycle.gpu_hours"{val}>Cost: {esc(line)}</p>'
            if line else "")


def planned_table(rd: RunDir) -> str:
    """Each point's time as the plan had it (the dry-run's model, docs/duration.md) beside
    the time it took (warm-up and measured requests, events.jsonl's sweep_point), so the
    model can be judged."""
    events = rd.events()
    planned = next((e.get("points") for e in events if e.get("event") == "sweep_planned"), None)
    source = {p.get("concurrency"): p.get("source") for p in planned or []
              if isinstance(p, dict)}
    rows, total = [], [0.0, 0.0]
    for e in events:
        if e.get("event") != "sweep_point":
            continue
        c, took, plan = e.get("concurrency"), e.get("seconds"), e.get("planned_s")
        ok = isinstance(took, (int, float)) and isinstance(plan, (int, float)) and plan > 0
        if ok:
            total[0] += plan
            total[1] += took
        rows.append(cell(c) + cell(plan, "sweep_point.planned_s", 1)
                    + cell(took, "sweep_point.seconds", 1)
                    + cell(took / plan if ok else None, None, 2)
                    + f"<td>{esc(source.get(c) or '–')}</td>")
    if not rows:
        return ('<p class="note">No sweep point was timed (events.jsonl has no sweep_point '
                "with a planned time).</p>")
    if total[0]:
        rows.append("<td><b>sweep</b></td>" + cell(total[0], None, 1)
                    + cell(total[1], None, 1) + cell(total[1] / total[0], None, 2)
                    + "<td></td>")
    return (table(["concurrency", "planned s", "measured s", "measured / planned", "planned "
                   "from"], rows)
            + '<p class="note">Planned: the dry-run\'s model of a point\'s time (its warm-up '
            "and measured requests; docs/duration.md), the one the Cost line, the time-limit "
            "check and the live ETA use. Measured: the point's client from start to end.</p>")


def verdict_block(s: dict) -> str:
    v = s.get("verdict") or "–"
    cls = "ok" if v == "passed" else "bad"
    reasons = "".join(f"<li>{esc(r)}</li>" for r in s.get("verdict_reasons") or [])
    notes = "".join(f"<li>{esc(r)}</li>" for r in s.get("notes") or [])
    return (f'<p>Run verdict: <b class="{cls}" data-key="verdict">{esc(v)}</b></p>'
            + (f"<ul>{reasons}</ul>" if reasons else "")
            + (f'<ul class="note">{notes}</ul>' if notes else ""))


def bottlenecks(vmap: dict, why: str | None) -> str:
    if why:
        return f'<p class="note">{esc(why)}</p>'
    if not vmap:
        return '<p class="note">No sweep point to diagnose.</p>'
    rows = [f"<td>{esc(f'c={k}' if isinstance(k, int) else k)}</td><td>{esc(v['title'])}</td>"
            f"<td>{esc(v['evidence'])}</td>" for k, v in vmap.items()]
    return table(["point", "verdict", "evidence"], rows, "wrap")


def pareto_series(points: list[dict], name: str, color: str, vmap: dict,
                  line: bool = True) -> dict:
    pts = []
    for p in sorted(points, key=lambda p: _conc(p.get("max_concurrency"))):
        x, y = p.get("tokens_per_s_per_user"), p.get(MEASURE)
        if p.get("status") != "ok" or not isinstance(x, (int, float)) or \
                not isinstance(y, (int, float)):
            continue
        c = p.get("max_concurrency")
        v = (vmap.get(c) or {}).get("short") or "–"
        tip = (f"{name} c={c}: {y:,.0f} tok/s/GPU at {x:,.1f} tok/s/user; TTFT p99 "
               f"{num(p.get('ttft_p99_ms'))} ms; verdict {v}")
        pts.append((float(x), float(y), f"c={c}", tip))
    return {"name": name, "color": color, "points": pts, "line": line}


def _conc(c: Any) -> float:
    return float(c) if isinstance(c, (int, float)) and not isinstance(c, bool) else 0.0


def frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not beaten on both larger x and larger y."""
    keep, best = [], -math.inf
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best:
            keep.append((x, y))
            best = y
    return sorted(keep)


def ttft_chart(series_points: list[tuple[str, str, list[dict]]]) -> str:
    series = []
    for name, color, points in series_points:
        for q, dash in (("p50", False), ("p99", True)):
            pts = [(float(p["max_concurrency"]), float(p[f"ttft_{q}_ms"]), "",
                    f"{name} c={p['max_concurrency']}: TTFT {q} {p[f'ttft_{q}_ms']:,.0f} ms")
                   for p in points if p.get("status") == "ok"
                   and isinstance(p.get(f"ttft_{q}_ms"), (int, float))
                   and isinstance(p.get("max_concurrency"), (int, float))]
            series.append({"name": f"{name} {q}" if name else q, "color": color,
                           "points": sorted(pts), "line": True, "dash": dash})
    return svg_chart(series, x_title="max concurrency (log scale)", y_title="TTFT (ms)",
                     log2_x=True, height=320, title="TTFT p50 and p99 vs concurrency")


# --- documents -----------------------------------------------------------------------------------


CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#222;
max-width:1180px;margin:24px auto;padding:0 20px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid
#ddd;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.sim{background:#fff4d6;border:1px solid #f0c36d;padding:8px 12px;border-radius:6px}
.warn{background:#fff4d6;border:1px solid #f0c36d;padding:2px 12px;border-radius:6px}
.good{background:#e8f5ec;border:1px solid #9fd3ae;padding:2px 12px;border-radius:6px}
table{border-collapse:collapse;margin:6px 0;font-size:13px}th,td{border:1px solid #ddd;
padding:4px 8px;vertical-align:top;text-align:left}thead th{background:#f4f5f7}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.kv th{background:#f7f7f9;white-space:nowrap;font-weight:600}
table.wrap td{white-space:normal}.ok{color:#17803d}.bad{color:#c0262d}
.note{color:#666;font-size:12.5px}code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
.tiles{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}.tile{border:1px solid #e3e3e3;
border-radius:6px;padding:8px 12px;min-width:150px}.tile .t{color:#666;font-size:12px}
.tile .v{font-size:24px;font-variant-numeric:tabular-nums}
svg.chart{max-width:100%;height:auto;font-family:inherit}.grid{stroke:#eee}
.frame{fill:none;stroke:#ccc}.tick{font-size:11px;fill:#555}.axis-title{font-size:12px;
fill:#333}.lab{font-size:10px;fill:#444}.curve{fill:none;stroke-width:2;opacity:.8}
.frontier{fill:none;stroke:#333;stroke-width:1.5;stroke-dasharray:6 4}
.limit{stroke:#c0262d;stroke-width:1.5;stroke-dasharray:3 3}.span{fill:#e45756;opacity:.12}.limit-lab{font-size:11px;
fill:#c0262d}
.mark{font-size:13px;font-weight:700;fill:#b45309;opacity:.75;letter-spacing:.5px}
.legend{margin:2px 0 8px}.key{display:inline-block;margin-right:16px;font-size:12.5px}
.key i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px;
border-radius:2px}.key i.dash{height:0;border-top:2px dashed #333;border-radius:0}
details{margin:6px 0}summary{cursor:pointer;font-weight:600}
"""


def page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{body}"
            f'<hr><p class="note">Written {esc(when(time.time()))} by <code>python -m '
            "launcher report</code> (pd-launcher). Self-contained: no script, no server, "
            "nothing fetched.</p></body></html>\n")


def render_run(path: Path) -> str:
    rd = RunDir(Path(path))
    s, source = run_summary(rd)
    vmap, why = verdicts(rd)
    name = s.get("run_id") or rd.run_id
    sim = ('<p class="sim"><b>SIMULATION</b>: the engines of this run are the launcher\'s '
           "simulator; its speed is a model, not a GPU measurement.</p>"
           if s.get("simulated") else "")
    if _on_cpu(rd, s):
        sim = ('<p class="sim"><b>vLLM (CPU)</b>: the engines of this run are real vLLM built '
               "for CPU (vllm-cpu) on a host CPU; its metrics and request flow are vLLM's, its "
               "speed is not a GPU measurement (per-GPU figures are per CPU engine).</p>")
    CHART_MARK.set("SIMULATION" if s.get("simulated") else
                   "vLLM (CPU): not a GPU measurement" if _on_cpu(rd, s) else "")
    body = [f"<h1>Run {esc(name)}</h1>", sim,
            "<h2>Identity</h2>", identity(rd, s, source),
            "<h2>What was measured</h2>", measured(rd),
            "<h2>Headline</h2>", headline(s), verdict_block(s),
            "<h2>Summary per sweep point</h2>", summary_table(s, vmap), prefix_reuse(s, vmap),
            agentic_views(rd, vmap), speculative(vmap),
            "<h2>Pareto: throughput per GPU vs interactivity</h2>",
            svg_chart([pareto_series(s.get("points") or [], "", PALETTE[0], vmap)],
                      x_title=X_TITLE, y_title=MEASURE_TITLE,
                      frontier=frontier([(x, y) for x, y, *_ in pareto_series(
                          s.get("points") or [], "", PALETTE[0], vmap)["points"]]),
                      title="Pareto"),
            '<p class="note">Points labelled with max concurrency; dashed: the Pareto '
            "frontier (no other point has both more tok/s per user and more tok/s per "
            "GPU).</p>",
            "<h2>TTFT vs concurrency</h2>",
            ttft_chart([("", PALETTE[0], s.get("points") or [])]),
            "<h2>Bottleneck per sweep point</h2>", bottlenecks(vmap, why),
            decode_endpoints(rd), kv_tiers(rd),
            "<h2>Planned against measured, per sweep point</h2>", planned_table(rd)]
    cmp = comparison([(name, _plan(rd), s.get("points") or [])])
    if cmp is not None and cmp["matched"]:
        ser = pareto_series(s.get("points") or [], "this run", PALETTE[0], vmap)
        i = body.index("<h2>TTFT vs concurrency</h2>")
        body[i:i] = published_block(cmp, [ser], {name: PALETTE[0]})
    return page(f"Run {name}", "".join(body))


def comparison(members: list[tuple[str, Any, list[dict]]]) -> dict | None:
    """launcher.analysis.studies.published_comparison, or None without the dashboard's pandas."""
    try:
        from launcher.analysis import studies
    except ImportError:
        return None
    return studies.published_comparison(members)


def published_series(cmp: dict, colors: dict[str, str]) -> list[dict]:
    """The published curve of each matched configuration, dotted and hollow, in its colour."""
    out = []
    ref = cmp["reference"]
    for label, name in cmp["matched"].items():
        rows = ref[ref["config"] == label].sort_values("concurrency").to_dict("records")
        pts = [(float(r["tokens_per_s_per_user"]), float(r[MEASURE]), "",
                f"published {name} c={r['concurrency']}: {r[MEASURE]:,.0f} tok/s/GPU (±300, "
                f"read off the figure) at {r['tokens_per_s_per_user']:g} tok/s/user")
               for r in rows]
        out.append({"name": f"published {name}", "color": colors.get(label, "#333"),
                    "points": pts, "line": True, "dash": True, "hollow": True})
    return out


def ratio_table(cmp: dict) -> str:
    from launcher.analysis import studies

    rows = []
    for r in cmp["ratios"].to_dict("records"):
        rows.append(f"<td>{esc(r['configuration'])}</td><td>{esc(r['published_as'])}</td>"
                    + cell(r["concurrency"], "published.concurrency")
                    + cell(_nan_none(r["measured"]), "published.measured")
                    + cell(_nan_none(r["measured_per_allocated_gpu"]),
                           "published.measured_per_allocated_gpu")
                    + cell(_nan_none(r["published"]), "published.published")
                    + cell(_nan_none(r["ratio"]), "published.ratio", 2)
                    + f"<td>{esc(r['ratio_range'])}</td>"
                    + cell(_nan_none(r["measured_tokens_per_s_per_user"]),
                           "published.measured_tokens_per_s_per_user", 1)
                    + cell(_nan_none(r["published_tokens_per_s_per_user"]),
                           "published.published_tokens_per_s_per_user", 1)
                    + f"<td>{esc(r['note'])}</td>")
    return table(list(studies.RATIO_COLUMNS.values()), rows, "ratios wrap")


def _nan_none(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def published_block(cmp: dict, measured: list[dict], colors: dict[str, str]) -> list[str]:
    """The measured curves beside the published ones, and the ratio per point."""
    from launcher.run import published

    src = f"{published.precision_text()}; {published.source_text()}"
    out = ["<h2>Against the published Pareto</h2>"]
    if cmp["simulated"]:
        out.append('<p class="sim"><b>SIMULATION</b>: the measured side of these ratios is the '
                   "launcher's simulated engine (a speed model), not a GB200 measurement; they "
                   "check the comparison, not performance.</p>")
    out += [svg_chart(measured + published_series(cmp, colors), x_title=X_TITLE,
                      y_title=MEASURE_TITLE, title="Measured and published Pareto"),
            f'<p class="note">Solid: measured. Dotted with hollow points: the published Pareto, '
            f"{esc(src)}. Ratio = measured total tok/s per working GPU ÷ published total "
            "tok/s/GPU at the same configuration and max concurrency, on the GPUs of the "
            "prefill and decode endpoints (which denominator the published figure used is not "
            "known: srt-slurm v1.0.32 divided by the allocated GPUs, v1.0.39 on by the working "
            "ones; the per-allocated-GPU figure is in the table); no interpolation: where the "
            "figure has no point at a concurrency the row says so. The range is the ratio over the reading "
            "precision.</p>"]
    if cmp["not_comparable"]:
        out.append('<p class="note">Not compared: ' + esc("; ".join(
            f"{k}: {v}" for k, v in cmp["not_comparable"].items())) + "</p>")
    from launcher.analysis import studies

    grid = studies.ratio_grid(cmp["ratios"])
    out.append(table(list(grid.columns), ["".join(
        f'<td class="n">{esc(v)}</td>' if str(k).startswith("c=") else f"<td>{esc(v)}</td>"
        for k, v in r.items()) for r in grid.to_dict("records")], "grid"))
    out.append('<p class="note">Measured ÷ published total tok/s per working GPU per '
               "configuration and max concurrency; <i>no published point</i>: the figure has "
               "none there; <i>not measured</i>: this run did not run it.</p>")
    out.append(f"<details><summary>Every point: measured, published, ratio and its range "
               f"({len(cmp['ratios'])} rows)</summary>{ratio_table(cmp)}</details>")
    return out


def render_study(path: Path) -> str:
    study = listing.entries(Path(path))[0]
    assert isinstance(study, listing.Study)
    from launcher.analysis import studies

    configs = studies.configs(study)
    data = []
    for k, (label, rpath) in enumerate(configs):
        rd = RunDir(rpath)
        s, source = run_summary(rd)
        vmap, why = verdicts(rd)
        data.append((label, rd, s, source, vmap, why, PALETTE[k % len(PALETTE)]))
    axes = ", ".join(f"{k} = {', '.join(map(str, v))}" for k, v in study.axes.items())
    simulated = any(d[2].get("simulated") for d in data)
    CHART_MARK.set("SIMULATION" if simulated else "vLLM (CPU): not a GPU measurement"
                   if any(_on_cpu(d[1], d[2]) for d in data) else "")
    body = [f"<h1>Study {esc(study.name)}</h1>"]
    if any(_on_cpu(d[1], d[2]) for d in data):
        body.append('<p class="sim"><b>vLLM (CPU)</b>: these runs use real vLLM on a host '
                    "CPU; the comparison checks the pipeline, not GPU performance.</p>")
    if simulated:
        body.append('<p class="sim"><b>SIMULATION</b>: these runs use the launcher\'s '
                    "simulated engine; the comparison checks the pipeline, not GPU "
                    "performance.</p>")
    rows = []
    for label, rd, s, _src, _v, _w, color in data:
        plan = _plan(rd)
        h = s.get("headline") or {}
        from launcher.run.figures import allocated_gpus
        rows.append(f'<td><i style="display:inline-block;width:10px;height:10px;'
                    f'background:{color}"></i> {esc(label)}</td><td><code>{esc(rd.run_id)}'
                    f"</code></td><td>{esc(rd.status().state)}</td>"
                    f"<td>{esc(plan.topology() if plan else '–')}</td>"
                    + (f"<td>{plan.gpus()} / {allocated_gpus(plan)}</td>" if plan
                       else "<td>–</td>")
                    + cell(h.get(MEASURE), "headline." + MEASURE)
                    + f"<td>c={esc(h.get('max_concurrency', '–'))}</td>"
                    + f"<td>{esc(s.get('verdict'))}</td>")
    body += ["<h2>Identity</h2>", kv_table([
        ("study", f"<code>{esc(study.name)}</code>"),
        ("recipe", esc(study.doc.recipe or "–")),
        ("swept", esc(axes or "–")), ("configurations", str(len(data))),
        *[("damaged", esc(f"{why}: left out")) for why in study.problems()]]),
        table(["configuration", "run", "state", "topology", "GPUs working / allocated",
               "best tok/s per working GPU", "at", "run verdict"], rows),
        "<h2>Allocation</h2>",
        kv_table([(k, esc(v)) for k, v in studies.allocation_facts(study)])]

    all_series, all_pts, flat = [], [], []
    for label, _rd, s, _src, vmap, _w, color in data:
        ser = pareto_series(s.get("points") or [], label, color, vmap)
        all_series.append(ser)
        all_pts += [(x, y) for x, y, *_ in ser["points"]]
        for p in s.get("points") or []:
            c = p.get("max_concurrency")
            flat.append({"config": label, "point": f"c={c}", "status": p.get("status"),
                         "concurrency": c, MEASURE: p.get(MEASURE),
                         studies.X: p.get(studies.X),
                         "verdict": (vmap.get(c) or {}).get("short") or "–"})
    body += ["<h2>Pareto: every configuration</h2>",
             svg_chart(all_series, x_title=X_TITLE, y_title=MEASURE_TITLE,
                       frontier=frontier(all_pts), title="Pareto, all configurations"),
             '<p class="note">One curve per configuration (points labelled with max '
             "concurrency); dashed: the frontier over all of them.</p>"]
    cmp = comparison([(label, _plan(rd), s.get("points") or []) for label, rd, s, *_ in data])
    if cmp is not None:
        if cmp["matched"]:
            body += published_block(cmp, all_series, {d[0]: d[6] for d in data})
        else:
            from launcher.run import published

            body.append('<p class="note">The published Pareto ('
                        + esc(published.precision_text()) + ") is not drawn: no configuration "
                        "of this study is the published workload (" + esc("; ".join(
                            f"{k}: {v}" for k, v in cmp["not_comparable"].items())) + ").</p>")

    body += slo_block(configs, {d[0]: d[6] for d in data})
    body.append("<h2>Best configuration per interactivity band</h2>")
    import pandas as pd

    df = pd.DataFrame(flat)
    if not df.empty:
        df[MEASURE] = pd.to_numeric(df[MEASURE], errors="coerce")
        df[studies.X] = pd.to_numeric(df[studies.X], errors="coerce")
    bands = studies.best_per_band(df, MEASURE) if not df.empty else df
    if bands.empty:
        body.append('<p class="note">No ok point with a tok/s-per-user figure.</p>')
    else:
        brows = [f"<td>≥ {b['at_least']:g} tok/s per user</td><td>{esc(b['config'])}</td>"
                 f"<td>{esc(b['point'])}</td>" + cell(b[MEASURE], MEASURE)
                 + cell(b[studies.X], studies.X, 1) + f"<td>{esc(b['verdict'])}</td>"
                 for b in bands.to_dict("records")]
        body.append(table(["interactivity", "best configuration", "at point",
                           "tok/s per working GPU", "tok/s/user", "verdict there"], brows,
                          "bands"))

    body.append("<h2>P:D recommendation</h2>")
    best = max(((lab, rd, (s.get("headline") or {}).get(MEASURE) or -1) for lab, rd, s, *_
                in data), key=lambda t: t[2], default=None)
    if best is None:
        body.append('<p class="note">No configuration.</p>')
    else:
        rec, why = studies.recommendation(best[1].path)
        if rec is None:
            body.append(f'<p class="note">Not available: {esc(why)}.</p>')
        else:
            adv = studies.advice(rec)
            # a low-confidence advice or one with caveats reads as a warning, never as a fact
            body.append(
                f'<div class="{"good" if adv["good"] else "warn"}">'
                f"<p>From the run of <b>{esc(best[0])}</b>: <b>{esc(adv['head'])}</b>"
                + (f"; confidence <b>{esc(adv['confidence'])}</b>" if adv["confidence"] else "")
                + ".</p>"
                + ("<ul>" + "".join(f"<li>{esc(c)}</li>" for c in adv["caveats"]) + "</ul>"
                   if adv["caveats"] else "") + "</div>"
                + (f"<p>{esc(adv['figures'][0].upper() + adv['figures'][1:])}.</p>"
                   if adv["figures"] else "")
                + "<ul>" + "".join(f"<li>{esc(e)}</li>" for e in rec.get("evidence") or [])
                + "</ul>"
                + (f"<p>Next run: <code>{esc(rec.get('next_command'))}</code></p>"
                   if rec.get("next_command") else ""))

    body.append("<h2>Each configuration</h2>")
    for label, rd, s, source, vmap, why, _color in data:
        body.append(f"<details open><summary>{esc(label)} — {esc(rd.run_id)} "
                    f"({esc(s.get('verdict'))})</summary>"
                    + identity(rd, s, source) + headline(s) + verdict_block(s)
                    + summary_table(s, vmap) + "<h3>Bottleneck per sweep point</h3>"
                    + bottlenecks(vmap, why) + "</details>")
    return page(f"Study {study.name}", "".join(body))


def slo_block(configs: list[tuple[str, Path]], colors: dict[str, str]) -> list[str]:
    """Under benchmark.slo: the answer in one sentence, each configuration's frontier (its
    largest passing and first failing concurrency, its figures there) and, per limit, every
    point against the limit's line (filled: passing; hollow: failing)."""
    from launcher.run import slo, slo_answer

    ans = slo_answer.answer(configs)
    if ans is None:
        return []
    out = ["<h2>SLO: the best configuration under the limits</h2>",
           f'<div class="{"good" if ans.best else "warn"}"><p><b>{esc(ans.sentence)}</b></p>'
           "</div>",
           f'<p class="note">Each configuration searched for the highest concurrency meeting '
           f"every limit of {esc(ans.limits)}: probing up by doubling, then bisecting to "
           f"within {ans.precision:.0%}; a point that failed in any other way never passes "
           "(docs/slo.md).</p>"]
    rows = []
    for f in ans.frontiers:
        b = f.best
        rows.append(f"<td>{esc(f.label)}</td>" + cell(f.passing) + cell(f.failing)
                    + cell(b.per_gpu if b else None) + cell(b.per_allocated_gpu if b else None)
                    + f"<td>{esc(f.excluded or f.outcome)}</td>")
    out.append(table(["configuration", "largest passing concurrency", "first failing",
                      "tok/s per working GPU there", "per allocated GPU", "outcome"], rows,
                     "wrap"))
    for lim in slo.parse(ans.limits):
        series = []
        for f in ans.frontiers:
            color = colors.get(f.label, "#555")
            for passed in (True, False):
                pts = [(float(p.concurrency), float(p.values_ms[lim.name]), f"c={p.concurrency}",
                        f"{f.label} c={p.concurrency}: {lim.name} {p.values_ms[lim.name]:,.1f} "
                        f"ms; {p.why}")
                       for p in f.points if p.passed == passed
                       and isinstance(p.values_ms.get(lim.name), (int, float))]
                series.append({"name": f"{f.label} {'passing' if passed else 'failing'}",
                               "color": color, "points": pts, "line": False,
                               "hollow": not passed})
        out.append(svg_chart(series, x_title="max concurrency (log scale)",
                             y_title=f"{lim.name} (ms)", log2_x=True, height=320,
                             hline=(lim.value_ms, f"SLO {lim.text}"),
                             title=f"{lim.name} against its limit, every configuration"))
    out.append('<p class="note">Filled: a point that meets every limit; hollow: one that '
               "fails (a limit, or any other failure); the dashed red line is the limit.</p>")
    return out


CSV_FIELDS = ("max_concurrency", "status", "total_tokens_per_s_per_gpu",
              "total_tokens_per_s_per_allocated_gpu", "tokens_per_s_per_user",
              "output_throughput", "request_throughput", "ttft_p50_ms", "ttft_p90_ms",
              "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "num_prompts",
              "completed", "failed")


def results_csv(path: Path) -> str:
    """One row per sweep point (per run of a study, with its configuration): the figures
    the report draws, for a spreadsheet or a plot beside the published curve."""
    import csv
    import io

    path = Path(path)
    if listing.is_study(path):
        from launcher.analysis import studies

        study = listing.entries(path)[0]
        members = [(label, RunDir(p)) for label, p in studies.configs(study)]
    else:
        members = [("", RunDir(path))]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["run", "configuration", "engine", *CSV_FIELDS])
    for label, rd in members:
        s, _ = run_summary(rd)
        engine = "sim" if s.get("simulated") else s.get("engine_label") or s.get("engine") or ""
        for p in s.get("points") or []:
            w.writerow([s.get("run_id") or rd.run_id, label, engine,
                        *[p.get(k, "") if p.get(k) is not None else "" for k in CSV_FIELDS]])
    return buf.getvalue()


def write_report(path: Path, out: Path | None = None) -> Path:
    """Write `<run>/report.html` or `<study>/report.html` (or `out`); returns its path."""
    path = Path(path)
    if listing.is_study(path):
        text = render_study(path)
    elif RunDir(path).exists():
        text = render_run(path)
    else:
        raise FileNotFoundError(f"{path} is neither a run directory (plan.json, run.json) "
                                "nor a study (study.json)")
    from launcher.run.rundir import write_atomic

    out = Path(out) if out is not None else path / REPORT
    if out.is_dir():
        out = out / REPORT
    write_atomic(out, text)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m launcher report",
        description="Write one self-contained HTML report of a run or a study "
                    "(<dir>/report.html): identity, summary table, Pareto chart, verdicts.")
    ap.add_argument("path", type=Path, help="a run directory or a study directory")
    a = ap.parse_args(argv)
    try:
        out = write_report(a.path)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
