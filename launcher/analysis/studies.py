"""A study (`submit --sweep`) as one comparison: every configuration's sweep points with
their verdicts, the best configuration per interactivity band, and the P:D recommendation.

Pure (pandas, no Streamlit): the study page and `launcher.report` both call these.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.run import listing

if TYPE_CHECKING:
    import pandas as pd

# The headline measures a study can be compared on (y of the Pareto chart); x is always
# tokens/s per user. Names and denominators as launcher.run.figures defines them.
MEASURES = {
    "total_tokens_per_s_per_gpu": "Total tok/s per working GPU (input+output ÷ P+D GPUs)",
    "total_tokens_per_s_per_allocated_gpu": "Total tok/s per allocated GPU (input+output ÷ "
                                            "nodes × GPUs per node, idle GPUs included)",
    "output_tokens_per_s_per_decode_gpu": "Output tok/s per decode GPU",
    "input_tokens_per_s_per_prefill_gpu": "Input tok/s per prefill GPU",
}
SHORT = {"total_tokens_per_s_per_gpu": "tok/s/working GPU",
         "total_tokens_per_s_per_allocated_gpu": "tok/s/allocated GPU",
         "output_tokens_per_s_per_decode_gpu": "out tok/s/decode GPU",
         "input_tokens_per_s_per_prefill_gpu": "in tok/s/prefill GPU"}
X = "tokens_per_s_per_user"
# Interactivity thresholds people quote (tok/s per user); a study shows those its points reach.
NICE = (1, 2, 5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 100, 125, 150, 200, 250, 300, 400, 500,
        750, 1000, 1500, 2000, 3000, 5000)


def lead_and_spread(ok: pd.DataFrame, y: str) -> dict[str, Any] | None:
    """How far the best configuration is ahead of the next, against the spread between
    repeated runs of one configuration ("lab (run id)" labels share their base): None with
    fewer than two configurations."""
    if ok.empty or y not in ok:
        return None
    per_run = ok.groupby("config")[y].max().dropna()
    base = {c: re.sub(r" \(\d{8}-\d{6}[^)]*\)$", "", c) for c in per_run.index}
    per_config = per_run.groupby(base).max().sort_values(ascending=False)
    if len(per_config) < 2:
        return None
    spreads = [g.max() / g.min() - 1 for _, g in per_run.groupby(base) if len(g) > 1
               and g.min() > 0]
    best, second = per_config.index[0], per_config.index[1]
    lead = per_config.iloc[0] / per_config.iloc[1] - 1 if per_config.iloc[1] > 0 else None
    spread = max(spreads) if spreads else None
    return {"best": best, "second": second, "lead": lead, "spread": spread,
            "repeated": len(spreads),
            "outside": None if spread is None or lead is None else bool(lead > spread)}


def find_study(runs_dir: Path, name: str | None) -> listing.Study | None:
    for e in listing.entries(Path(runs_dir)):
        if isinstance(e, listing.Study) and (name is None or e.name == name):
            return e
    return None


def allocation_facts(study: listing.Study) -> list[tuple[str, str]]:
    """How the study ran, as (label, text) rows: one job per configuration, or one
    allocation with its job, nodes, time, GPU-hours, engine starts (against the jobs'), time
    loading against measuring, and its order. The Study page and the report show these (and
    a damaged file's sentence, from Study.problems)."""
    if not study.in_one_allocation:
        return [("way", "one job per configuration")]
    planned = study.planned
    rec, why = study.allocation_or_why()
    rows = [("way", "one allocation for every configuration, engines loaded once")]
    if why:
        return rows + [("state", "not known: allocation.json is damaged")]
    if rec is None:
        return rows + [("state", "not started")]
    s = rec.summary
    job = rec.slurm_job_id
    rows += [("job", f"Slurm job {job}" if job else f"local ({rec.host or '?'})"),
             ("state", str(rec.state)),
             ("nodes", f"{rec.nodes} x {rec.gpus_per_node} GPUs")]
    each_loads = planned.estimated_each_loads() if planned is not None else None
    if s is not None:
        rows += [("time", f"{s.wall_s:,.0f} s: {s.loading_s:,.0f} s loading engines, "
                          f"{s.measuring_s:,.0f} s measuring"),
                 ("GPU-hours", f"{s.gpu_hours:,.3f}"),
                 *([("useful GPU time", f"{s.useful_gpu_time:.2f}: GPU-seconds inside the "
                     f"sweep points' measured windows ({s.measured_windows_s:,.0f} s x "
                     f"{s.gpus} GPUs) over the {s.gpu_hours:,.3f} GPU-hours allocated"
                     + useful_estimate(planned))]
                   if s.useful_gpu_time is not None and s.measured_windows_s is not None
                   else []),
                 ("engine starts", f"{s.engine_starts}"
                  + (f" (one job per configuration: {each_loads})" if each_loads else ""))]
    if planned is not None and (gh := planned.estimated_gpu_hours()):
        rows.append(("estimated before", f"{gh[0]:,.2f} GPU-hours in one allocation, "
                                         f"{gh[1]:,.2f} as one job each"))
    order = [f"{i}. {c.run}"
             + (f" at {', '.join(map(str, c.turn['points']))}" if c.turn.get("points") else "")
             + f" ({c.state or 'running'})" for i, c in enumerate(rec.configurations, 1)]
    if order:
        rows.append(("order", "; ".join(order)))
    return rows


def useful_estimate(planned) -> str:
    """The dry-run's useful GPU time beside the measured one, where it made one."""
    u = planned.estimated_useful() if planned is not None else {}
    parts = [f"{u['at_load_time_s']:.2f} at the profile's load_time_s"
             if "at_load_time_s" in u else "",
             f"{u['at_health_timeout']:.2f} at the health timeout"
             if "at_health_timeout" in u else ""]
    parts = [x for x in parts if x]
    return f" (estimated before: {', '.join(parts)})" if parts else ""


def configs(study: listing.Study) -> list[tuple[str, Path]]:
    """(label, run path) per configuration, in study.json's order (then by name)."""
    return study.configurations()


def verdict_columns(table: pd.DataFrame) -> pd.DataFrame:
    """`table` (derive.point_table) with verdict (short), verdict_title, verdict_kind and
    evidence columns from launcher.analysis.diagnose."""
    from launcher.analysis import diagnose

    t = table.copy()
    if t.empty:
        for c in ("verdict", "verdict_title", "verdict_kind", "evidence"):
            t[c] = []
        return t
    vs = {v.point: v for v in diagnose.diagnose(t.to_dict("records"))}
    t["verdict"] = [vs[p].label if p in vs else "—" for p in t["point"]]
    t["verdict_title"] = [vs[p].title if p in vs else "—" for p in t["point"]]
    t["verdict_kind"] = [vs[p].kind if p in vs else "" for p in t["point"]]
    t["evidence"] = ["; ".join(vs[p].evidence) if p in vs else "" for p in t["point"]]
    return t


def run_table(path: Path) -> pd.DataFrame:
    """One run's per-point table with verdicts, read from its directory (no caches)."""
    from launcher.analysis import derive, load

    plan = load.read_plan_safe(path)[0]
    info = load.run_info(path)
    ss = None
    if info.has_telemetry:
        ss = derive.SeriesSet(load.read_telemetry(path, names=load.TTFT_NAMES), plan)
    step = plan.telemetry_interval_s if plan else 1.0
    return verdict_columns(derive.point_table(load.load_bench(path), plan, ss, step_s=step))


def bands(xs: list[float], max_bands: int = 5) -> list[float]:
    """Interactivity thresholds (tok/s per user) for the points' x values: round numbers
    between the lowest and highest x, at most `max_bands`, spread evenly in log scale."""
    xs = sorted(x for x in xs if isinstance(x, (int, float)) and math.isfinite(x) and x > 0)
    if not xs:
        return []
    lo, hi = xs[0], xs[-1]
    cands = [n for n in NICE if lo <= n <= hi]
    floor = max([n for n in NICE if n <= lo], default=0)
    cands = sorted({floor, *cands}) if floor else cands
    if len(cands) <= max_bands:
        return cands
    # keep both ends, evenly spaced in log(x) between them
    logs = [math.log(max(c, 1e-9)) for c in cands]
    want = [logs[0] + (logs[-1] - logs[0]) * k / (max_bands - 1) for k in range(max_bands)]
    picked = sorted({min(range(len(cands)), key=lambda i: abs(logs[i] - w)) for w in want})
    return [cands[i] for i in picked]


def best_per_band(df: pd.DataFrame, y: str, by: str = "config",
                  thresholds: list[float] | None = None) -> pd.DataFrame:
    """For each interactivity threshold, the configuration whose point at ≥ that many
    tok/s per user has the highest `y` (ok points only). Columns: at_least, config, point,
    y, x, verdict, run (when in df)."""
    import pandas as pd

    cols = ["at_least", by, "point", y, X, "verdict"]
    ok = df[(df["status"] == "ok")].dropna(subset=[X, y]) if not df.empty else df
    if ok.empty:
        return pd.DataFrame(columns=cols)
    ths = thresholds if thresholds is not None else bands(list(ok[X]))
    rows = []
    for th in ths:
        cand = ok[ok[X] >= th]
        if cand.empty:
            continue
        best = cand.loc[cand[y].idxmax()]
        row = {"at_least": th, by: best[by], "point": best["point"], y: best[y],
               X: best[X], "verdict": best.get("verdict", "—")}
        if "run" in best.index:
            row["run"] = best["run"]
        rows.append(row)
    return pd.DataFrame(rows)


def envelope(df: pd.DataFrame, y: str) -> pd.DataFrame:
    """The Pareto frontier over every configuration's ok points (max x, max y)."""
    from launcher.analysis import derive

    ok = df[df["status"] == "ok"] if not df.empty else df
    return derive.pareto_frontier(ok, X, y) if not ok.empty else ok


def recommendation(run_path: Path, target: float | None = None,
                   target_ttft_ms: float | None = None) -> tuple[dict | None, str]:
    """`launcher.analysis.recommend.recommend(run_path, target, target_ttft_ms)` or why there
    is none: the module may be missing (it is written in parallel), may fail or may find
    nothing to say."""
    import importlib

    try:
        mod = importlib.import_module("launcher.analysis.recommend")
    except ImportError as e:
        return None, f"launcher.analysis.recommend is not available in this version ({e})"
    fn = getattr(mod, "recommend", None)
    if not callable(fn):
        return None, "launcher.analysis.recommend has no recommend() function in this version"
    try:
        rec = (fn(Path(run_path), target, target_ttft_ms) if target_ttft_ms
               else fn(Path(run_path), target))
    except Exception as e:  # noqa: BLE001 - a recommender bug must not take the page down
        return None, f"recommend() failed on {Path(run_path).name}: {type(e).__name__}: {e}"
    if not rec or not isinstance(rec, dict):
        return None, (f"no recommendation for {Path(run_path).name}: the run lacks what "
                      "the recommender needs (a finished sweep with decode telemetry)")
    return rec, ""


def advice(rec: dict) -> dict[str, Any]:
    """What the Study page and the report show of a recommendation, in the CLI's words:
    the advice, its predicted figures and TTFT, its caveats, and whether it is shown as
    plain good news (confidence high and no caveat; anything else is a warning)."""
    def known(v: Any) -> bool:
        return v is not None and not (isinstance(v, float) and not math.isfinite(v))

    pr = rec.get("predicted") or {}
    head = (f"{rec.get('prefill_endpoints', '?')} prefill : {rec.get('decode_endpoints', '?')}"
            " decode endpoints" + (f" (ratio {rec['ratio']})" if known(rec.get("ratio")) else "")
            + (f", up to concurrency {rec['top_concurrency']}"
               if known(rec.get("top_concurrency")) else ""))
    targets = []
    if rec.get("target_tokens_per_s_per_user"):
        targets.append(f"≥ {rec['target_tokens_per_s_per_user']:g} tok/s per user")
    if rec.get("target_ttft_ms"):
        targets.append(f"TTFT ≤ {rec['target_ttft_ms']:,.0f} ms")
    if targets:
        head += ", for " + " and ".join(targets)
    figures_line = None
    if known(pr.get("total_tokens_per_s_per_gpu")) and known(pr.get("tokens_per_s_per_user")):
        figures_line = (f"predicted {pr['total_tokens_per_s_per_gpu']:,.0f} tok/s/GPU at "
                        f"{pr['tokens_per_s_per_user']:,.1f} tok/s/user"
                        + (f", {pr['bound']}-bound" if pr.get("bound") else ""))
        if {"ttft_floor_s", "prefill_utilisation"} <= set(pr):
            from launcher.analysis.recommend import ttft_text

            figures_line += "; " + ttft_text(pr)
    confidence = rec.get("confidence")
    caveats = [str(c) for c in rec.get("caveats") or []]
    return {"head": head, "figures": figures_line, "confidence": confidence,
            "caveats": caveats, "good": confidence == "high" and not caveats}


# --- the published Pareto beside a study (launcher.run.published) ----------------------------

RATIO_COLUMNS = {
    "configuration": "configuration", "published_as": "published as",
    "concurrency": "max concurrency",
    "measured": "measured tok/s per working GPU",
    "measured_per_allocated_gpu": "measured tok/s per allocated GPU",
    "published": "published tok/s/GPU (read off, ±0.3k)",
    "ratio": "ratio measured ÷ published",
    "ratio_range": "ratio within ±0.3k",
    "measured_tokens_per_s_per_user": "measured tok/s per user",
    "published_tokens_per_s_per_user": "published tok/s per user",
    "note": "note",
}


def points_of_table(t: pd.DataFrame) -> list[dict]:
    """A page's point table (derive.point_table) as summary.json-style points, the shape
    `launcher.run.published.ratios` reads."""
    out = []
    for r in t.to_dict("records"):
        c = r.get("concurrency")
        if not isinstance(c, (int, float)) or not math.isfinite(c):
            continue
        out.append({"max_concurrency": int(c), "status": r.get("status"),
                    "failure_reason": r.get("failure_reason"),
                    **{k: _finite(r.get(k)) for k in (
                        "total_tokens_per_s_per_gpu", "total_tokens_per_s_per_allocated_gpu",
                        "tokens_per_s_per_user")}})
    return out


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) \
        and math.isfinite(v) else None


def published_comparison(members: list[tuple[str, Any, list[dict]]]) -> dict[str, Any]:
    """`members`: (configuration label, PlanDoc or None, its points as summary.json holds
    them). Returns {"matched": {label: published configuration name}, "not_comparable":
    {label: why}, "simulated": bool, "ratios": DataFrame (RATIO_COLUMNS' keys plus
    ratio_low/ratio_high), "reference": DataFrame (config, tokens_per_s_per_user,
    total_tokens_per_s_per_gpu, concurrency, point, published, approximate)}: the published
    curve of each comparable configuration, drawn in the colour of that configuration."""
    import pandas as pd

    from launcher.run import published

    matched, reasons, ratio_rows, ref_rows = {}, {}, [], []
    simulated = False
    for label, plan, points in members:
        m, why = published.comparable(plan)
        if m is None:
            reasons[label] = why
            continue
        matched[label] = m.name
        simulated = simulated or m.simulated
        for r in published.ratios(m.config, points):
            lo, hi = r["ratio_low"], r["ratio_high"]
            r = dict(r, configuration=label, published_as=m.name,
                     ratio_range=(f"{lo:.2f}–{hi:.2f}" if lo is not None and hi is not None
                                  else f"≥ {lo:.2f}" if lo is not None else "—"))
            ratio_rows.append(r)
        for x, y, c in published.series(m.config):
            ref_rows.append({"config": label, "tokens_per_s_per_user": x,
                             "total_tokens_per_s_per_gpu": y, "concurrency": c,
                             "point": f"c={c}", "published": f"{m.name} c={c}"})
    ratios = pd.DataFrame(ratio_rows)
    return {"matched": matched, "not_comparable": reasons, "simulated": simulated,
            "ratios": ratios, "reference": pd.DataFrame(ref_rows)}


def ratio_grid(ratios: pd.DataFrame) -> pd.DataFrame:
    """The ratios as one row per configuration and one column per max concurrency ("c=N"):
    the ratio with 2 decimals, or why there is none (no published point, not measured,
    failed)."""
    import pandas as pd

    if ratios.empty:
        return pd.DataFrame(columns=["configuration", "published as"])
    concs = sorted({int(c) for c in ratios["concurrency"]})
    rows = []
    for (label, name), g in ratios.groupby(["configuration", "published_as"], sort=False):
        row = {"configuration": label, "published as": name}
        by = {int(r["concurrency"]): r for r in g.to_dict("records")}
        for c in concs:
            r = by.get(c)
            ratio = _finite(r["ratio"]) if r else None
            row[f"c={c}"] = (f"{ratio:.2f}" if ratio is not None else "—" if r is None
                             else "no published point" if _finite(r["published"]) is None
                             else "not measured" if r["note"] == "not measured in this run"
                             else "failed")
        rows.append(row)
    return pd.DataFrame(rows)
