"""An agentic run's figures (benchmark.agentic, docs/agentic.md): TTFT against each turn's
context from AIPerf's own per-request records, the prefill compute line from the engines'
counters as AIPerf recorded them, KV use, prefix hits and queue over one point's time from
the run's telemetry, and sessions per decode endpoint from the engines' own request lines.

The readers of the run's files come first; everything below them is pure (frames and dicts
in, frames out), shared by the dashboard and the report.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from launcher.analysis import derive
from launcher.run.plandoc import PlanDoc
from launcher.telemetry import statslog

RECORD_COLUMNS = ["point", "sessions", "phase", "session", "turn", "start", "end", "ttft_ms",
                  "context", "error"]
# the simulator's per-request line (launcher/sim/server.py, with --enable-log-requests)
SIM_REQUEST = "] SIMULATED request "


# --- reading the run's files ----------------------------------------------------------------


def artifacts(run: Path, point: dict) -> Path | None:
    """The folder AIPerf wrote the point's files in (bench/aiperf-cNNNNN)."""
    ag = point.get("agentic")
    name = ag.get("artifacts") if isinstance(ag, dict) else None
    return Path(run) / "bench" / name if isinstance(name, str) else None


def read_records(art: Path, point: str, sessions: int | None) -> pd.DataFrame:
    """AIPerf's per-request records of one point (profile_export.jsonl), one row each: its
    phase, session (x_correlation_id), turn, start and end (unix s), TTFT (ms), the turn's
    context (the server's prompt-token count: the session's history and the turn) and
    whether it failed. A line it was writing when it ended is skipped."""
    rows = []
    try:
        f = open(art / "profile_export.jsonl", encoding="utf-8")
    except OSError:
        return pd.DataFrame(columns=RECORD_COLUMNS)
    with f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            meta, m = rec.get("metadata") or {}, rec.get("metrics") or {}

            def value(*names: str, m=m) -> float:
                for n in names:
                    v = (m.get(n) or {}).get("value") if isinstance(m.get(n), dict) else None
                    if isinstance(v, (int, float)):
                        return float(v)
                return math.nan

            start, end = meta.get("request_start_ns"), meta.get("request_end_ns")
            rows.append((point, sessions, meta.get("benchmark_phase", "profiling"),
                         meta.get("x_correlation_id"), meta.get("turn_index"),
                         start / 1e9 if isinstance(start, int) else math.nan,
                         end / 1e9 if isinstance(end, int) else math.nan,
                         value("time_to_first_token"),
                         value("usage_prompt_tokens", "input_sequence_length"),
                         bool(rec.get("error"))))
    return pd.DataFrame(rows, columns=RECORD_COLUMNS)


def read_server_metrics(art: Path) -> dict | None:
    """AIPerf's scrape of every engine over the profiling phase (server_metrics_export.json)."""
    try:
        obj = json.loads((art / "server_metrics_export.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def metrics_roles(plan: PlanDoc | None) -> dict[str, str]:
    """Each engine front's /metrics URL (what AIPerf scraped, --server-metrics) -> its role."""
    if plan is None:
        return {}
    return {p.metrics_url: str(p.role) for p in plan.processes
            if p.metrics_url and p.role is not None}


@dataclass(frozen=True)
class RequestLine:
    """One chat request as an engine logged it."""

    endpoint: str
    ts: float | None  # the log's wall clock read as this host's zone (see sessions_by_point)
    conversation: str
    prompt_tokens: int | None


def read_request_lines(run: Path, role: str = "decode") -> list[RequestLine]:
    """The per-request lines the engines of `role` logged (the simulator's, with
    --enable-log-requests: `SIMULATED request <id>: conversation <c>, <n> prompt tokens`,
    where <c> is the start of the sha256 of the conversation's first user message)."""
    out = []
    for log in sorted((Path(run) / "logs").glob(f"{role}-*.log")):
        endpoint = log.name.split("@", 1)[0]
        try:
            f = open(log, encoding="utf-8", errors="replace")
        except OSError:
            continue
        with f:
            for line in f:
                if SIM_REQUEST not in line:
                    continue
                rec = statslog.parse_prefix(line)
                tail = line.split(": conversation ", 1)
                if len(tail) < 2:
                    continue
                conv, _, rest = tail[1].partition(",")
                n = rest.strip().split(" ", 1)[0]
                out.append(RequestLine(endpoint, rec.ts if rec else None, conv.strip(),
                                       int(n) if n.isdigit() else None))
    return out


# --- TTFT against the turn's context --------------------------------------------------------

# Bucket bounds (tokens): 1, 1.5, 2, 3, 5, 7 x 10^k, readable and about 1.5x apart.
_STEPS = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)


def bucket_edges(lo: float, hi: float) -> list[float]:
    """Round bounds covering [lo, hi]."""
    lo, hi = max(lo, 1.0), max(hi, lo + 1.0)
    k = math.floor(math.log10(lo))
    edges: list[float] = []
    while not edges or edges[-1] <= hi:
        for s in _STEPS:
            e = s * 10 ** k
            if e <= lo and (not edges or e > edges[-1]):
                edges = [e]
            elif e > lo:
                edges.append(e)
                if e > hi:
                    break
        k += 1
    return edges


def tokens_text(n: float) -> str:
    """1500 -> '1.5k', 142000 -> '142k', 700 -> '700'."""
    if n >= 1e6:
        return f"{n / 1e6:g}M"
    if n >= 1e3:
        return f"{n / 1e3:g}k"
    return f"{n:g}"


def _pct(xs: np.ndarray, q: float) -> float:
    return float(np.percentile(xs, q)) if len(xs) else math.nan


def context_buckets(records: pd.DataFrame) -> pd.DataFrame:
    """Per point and context bucket (profiling phase, successful requests): requests, mean
    context, TTFT p50 and p90 (ms). Buckets are the same for every point of a run."""
    cols = ["point", "sessions", "bucket", "lo", "hi", "requests", "context_mean",
            "ttft_p50_ms", "ttft_p90_ms"]
    ok = records[(records["phase"] == "profiling") & ~records["error"].astype(bool)].dropna(
        subset=["ttft_ms", "context"])
    if ok.empty:
        return pd.DataFrame(columns=cols)
    edges = bucket_edges(float(ok["context"].min()), float(ok["context"].max()))
    idx = np.searchsorted(edges, ok["context"].to_numpy(), side="right") - 1
    rows = []
    for (point, sessions), g in ok.assign(_b=idx).groupby(["point", "sessions"], sort=False):
        for b, gb in g.groupby("_b"):
            lo, hi = edges[b], edges[b + 1]
            t = gb["ttft_ms"].to_numpy(dtype="float64")
            rows.append({"point": point, "sessions": sessions,
                         "bucket": f"{tokens_text(lo)}–{tokens_text(hi)}", "lo": lo, "hi": hi,
                         "requests": len(gb), "context_mean": float(gb["context"].mean()),
                         "ttft_p50_ms": _pct(t, 50), "ttft_p90_ms": _pct(t, 90)})
    return pd.DataFrame(rows, columns=cols).sort_values(["sessions", "lo"]).reset_index(
        drop=True)


def prefix_role(roles: dict[str, str]) -> str | None:
    """The role whose engines hold the sessions' prefixes: the prefills in P/D (a decode
    pulls the prompt's KV and records no hit), else the one role there is."""
    have = set(roles.values())
    return "prefill" if "prefill" in have else (sorted(have)[0] if have else None)


def prefill_ms_per_token(server: dict | None, roles: dict[str, str]) -> float | None:
    """Milliseconds of prefill per computed prompt token over the point, on the engines
    that prefill: vllm:request_prefill_time_seconds' sum over
    vllm:prompt_tokens_by_source{source="local_compute"} (AIPerf's scrape of the engines'
    own counters). `context x this` is the prefill compute line: a turn whose whole context
    is computed again (no prefix hit) at the rate the engines prefilled at."""
    role = prefix_role(roles)
    metrics = (server or {}).get("metrics") or {}
    secs = tokens = 0.0
    for s in (metrics.get("vllm:request_prefill_time_seconds") or {}).get("series") or []:
        v = (s.get("stats") or {}).get("sum")
        if roles.get(s.get("endpoint_url")) == role and isinstance(v, (int, float)):
            secs += v
    for s in (metrics.get("vllm:prompt_tokens_by_source") or {}).get("series") or []:
        v = (s.get("stats") or {}).get("total")
        if roles.get(s.get("endpoint_url")) == role and isinstance(v, (int, float)) and \
                (s.get("labels") or {}).get("source") == "local_compute":
            tokens += v
    return 1000.0 * secs / tokens if secs > 0 and tokens > 0 else None


def with_compute_line(buckets: pd.DataFrame, ms_per_token: dict[Any, float | None]
                      ) -> pd.DataFrame:
    """`buckets` with the prefill compute line at each bucket's mean context (ms) and TTFT
    p50 over it: below 1, prefix hits saved work; above, the turn waited (queue, transfer)
    or was computed again."""
    line = [ms_per_token.get(p) for p in buckets["point"]]
    out = buckets.copy()
    out["compute_ms"] = [c * r if r else math.nan for c, r in zip(out["context_mean"], line,
                                                                    strict=True)]
    out["over_line"] = out["ttft_p50_ms"] / out["compute_ms"]
    return out


def line_crossings(buckets: pd.DataFrame) -> list[str]:
    """Per point, in words, where TTFT p50 leaves the prefill compute line as the context
    grows: the first bucket from which it stays under the line (prefix hits save more than
    the queue and the transfer cost), or that it stays over it everywhere."""
    out = []
    for point, g in buckets.dropna(subset=["over_line"]).groupby("point", sort=False):
        under = (g["over_line"] < 1.0).to_numpy()
        if under.all():
            out.append(f"{point}: TTFT p50 under the compute line at every context")
        elif not under.any():
            out.append(f"{point}: TTFT p50 over the compute line at every context (turns "
                       "computed again or waiting)")
        else:
            j = len(under) - 1  # the start of the last run: where it stays
            while j > 0 and under[j - 1] == under[-1]:
                j -= 1
            where = "under" if under[-1] else "back over"
            out.append(f"{point}: TTFT p50 {where} the compute line from the "
                       f"{g['bucket'].iloc[j]} tokens bucket on")
    return out


# --- KV use, prefix hits and queue on one time axis ----------------------------------------


def point_timeline(ss: derive.SeriesSet, w: derive.Window, roles: list[str],
                   holder: str | None, offered: float | None, kv_full: float = 0.90,
                   step_s: float = 1.0, max_bins: int = 120) -> dict[str, Any]:
    """One point's window in bins: KV use (the fullest engine of each role), the prefix-cache
    hit rate of the engines holding the prefixes (Δhits ÷ Δqueries per bin), requests
    waiting (per role, summed), and the spans where that KV was at or above `kv_full`; with
    what the verdict's evidence reads from them: the hit rate and the queue while the KV was
    full against the rest of the point."""
    bins = derive.Bins.over(w.start, w.end, max_bins)
    parts = []
    for role in roles:
        kv = ss.select("vllm:kv_cache_usage_perc", role)
        if not kv.empty:
            top = np.fmax.reduce(bin_max(ss, kv.index, bins), axis=0)  # NaN: no engine
            g = derive.long_frame(top[None, :], pd.DataFrame({"group": ["x"]}), bins)
            parts.append(g.assign(measure="KV use", series=f"KV use, {role} (fullest engine)",
                                  role=role))
        wt = ss.select("vllm:num_requests_waiting", role)
        if not wt.empty:
            g = derive.grouped_series(ss, wt, lambda r: "x", bins, "gauge", step_s)
            parts.append(g.assign(measure="waiting", series=f"requests waiting, {role}",
                                  role=role))
    h = q = np.zeros(bins.n)
    if holder:
        hits = ss.select("vllm:prefix_cache_hits_total", holder)
        queries = ss.select("vllm:prefix_cache_queries_total", holder)
        if not hits.empty and not queries.empty:
            h = np.nansum(derive.counter_bins(ss, hits.index, bins), axis=0)
            q = np.nansum(derive.counter_bins(ss, queries.index, bins), axis=0)
            with np.errstate(all="ignore"):
                rate = np.where(q > 0, h / q, np.nan)
            parts.append(derive.long_frame(rate[None, :], pd.DataFrame({"group": ["x"]}), bins)
                         .assign(measure="hit rate", series=f"prefix-cache hit rate, {holder}",
                                 role=holder))
    frame = (pd.concat(parts, ignore_index=True).drop(columns="group") if parts else
             pd.DataFrame(columns=["t", "value", "measure", "series", "role"]))
    # each bin drawn at its middle (within the window), where the shaded spans put it
    frame["t"] = (np.clip(unix(frame["t"]) + bins.width / 2, w.start, w.end) if len(frame)
                  else frame["t"].astype("float64"))
    out: dict[str, Any] = {"frame": frame, "bin_s": bins.width, "start": w.start,
                           "end": w.end, "offered": offered, "kv_full": kv_full,
                           "holder": holder}
    kv = frame[(frame["measure"] == "KV use") & (frame["role"] == holder)].sort_values("t")
    starts = unix(pd.Series(bins.times()))
    mids = np.clip(starts + bins.width / 2, w.start, w.end)
    full = kv[kv["value"] >= kv_full]
    spans: list[tuple[float, float]] = []
    for t in full["t"]:
        s0 = starts[np.argmin(np.abs(mids - t))]
        a, b = float(max(s0, w.start)), float(min(s0 + bins.width, w.end))
        if spans and a <= spans[-1][1] + 1e-6:
            spans[-1] = (spans[-1][0], b)
        elif b > a:
            spans.append((a, b))
    out["full_spans"] = spans
    out["full_share"] = (float(sum(b - a for a, b in spans)) / (w.end - w.start)
                         if w.end > w.start else math.nan)
    full_t = set(full["t"])

    def mean_where(measure: str, role: str | None, inside: bool) -> float:
        f = frame[(frame["measure"] == measure) & (frame["role"] == role)]
        f = f[f["t"].isin(full_t) == inside]
        return float(f["value"].mean()) if len(f) else math.nan

    # hits over queries of the bins while full and of the rest (not a mean of bin rates)
    inside = np.isin(mids, list(full_t))
    for key, sel in (("hit_full", inside), ("hit_rest", ~inside)):
        out[key] = float(h[sel].sum() / q[sel].sum()) if q[sel].sum() > 0 else math.nan
    out["waiting_full"], out["waiting_rest"] = (mean_where("waiting", holder, True),
                                                mean_where("waiting", holder, False))
    return out


def bin_max(ss: derive.SeriesSet, ids, bins: derive.Bins) -> np.ndarray:
    """[len(ids), bins.n] the highest value of each gauge in each bin: its stored rows there
    (the telemetry stores changes) and its values at the bin's edges (a peak between two bin
    means is what "pinned near full" is about); NaN where the series has no data."""
    edges = ss.values_at(ids, bins.edges)
    out = np.fmax(edges[:, :-1], edges[:, 1:])
    for k, i in enumerate(ids):
        t, v = ss.ts[ss.off[i]:ss.off[i + 1]], ss.val[ss.off[i]:ss.off[i + 1]]
        j = np.floor((t - bins.t0) / bins.width).astype(np.int64)
        keep = (j >= 0) & (j < bins.n) & ~np.isnan(v)
        row = np.full(bins.n, -np.inf)
        np.maximum.at(row, j[keep], v[keep])
        out[k] = np.fmax(out[k], np.where(np.isinf(row), np.nan, row))
    return out


def unix(t: pd.Series) -> np.ndarray:
    """Bin start times (UTC datetimes) as unix seconds."""
    return (pd.to_datetime(t, utc=True) - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)


def timeline_evidence(tl: dict[str, Any]) -> list[str]:
    """What the timeline shows of a capacity cliff, in words (empty: no KV near full)."""
    spans, holder = tl.get("full_spans") or [], tl.get("holder") or "the engines"
    if not spans:
        return []
    out = [f"{holder} KV at or above {tl['kv_full']:.0%} for {tl['full_share']:.0%} of the "
           f"point ({len(spans)} span{'s' if len(spans) > 1 else ''}, shaded)"]
    hf, hr = tl.get("hit_full"), tl.get("hit_rest")
    if hf is not None and math.isfinite(hf):
        rest = f" against {hr:.0%} the rest of the point" if math.isfinite(hr) else ""
        off = tl.get("offered")
        offered = f" (the trace offers {off:.0%})" if isinstance(off, float) else ""
        out.append(f"prefix-cache hit rate {hf:.0%} while full{rest}{offered}")
    wf, wr = tl.get("waiting_full"), tl.get("waiting_rest")
    if wf is not None and math.isfinite(wf):
        rest = f" against {wr:.1f} the rest of the point" if math.isfinite(wr) else ""
        out.append(f"{wf:.1f} requests waiting on {holder} on average while full{rest}")
    return out


# --- sessions per decode endpoint ------------------------------------------------------------


def point_spans(records: pd.DataFrame, slack_s: float = 2.0) -> list[tuple[str, float, float]]:
    """Each point's time on the engines: from its first request's start to its last
    request's end in AIPerf's records (warm-up included), `slack_s` either side."""
    out = []
    for point, g in records.groupby("point", sort=False):
        a, b = g["start"].min(), g["end"].max()
        if math.isfinite(a) and math.isfinite(b):
            out.append((point, float(a) - slack_s, float(b) + slack_s))
    return sorted(out, key=lambda s: s[1])


def zone_shift(lines: list[RequestLine], spans: list[tuple[str, float, float]]) -> float:
    """Seconds to take off the engine lines' times to put them on AIPerf's clock: the logs
    print the engine host's local time without a zone, read here in this host's; the first
    request line is within seconds of the first point's start, so the gap is the zones'
    difference, rounded to the quarter hour."""
    ts = [ln.ts for ln in lines if ln.ts is not None]
    if not ts or not spans:
        return 0.0
    return round((min(ts) - spans[0][1]) / 900.0) * 900.0


def sessions_per_endpoint(lines: list[RequestLine],
                          spans: list[tuple[str, float, float]]) -> pd.DataFrame:
    """Per point and decode endpoint: the sessions (conversations) whose turns it served,
    its requests, and how many of those sessions also had a turn on another endpoint in the
    same point (0 when the router kept every session on one decode)."""
    cols = ["point", "endpoint", "sessions", "requests", "split"]
    if not lines:
        return pd.DataFrame(columns=cols)
    shift = zone_shift(lines, spans)

    def point_of(ln: RequestLine) -> str:
        if ln.ts is not None:
            t = ln.ts - shift
            for point, a, b in spans:
                if a <= t <= b:
                    return point
        return "outside the points"

    df = pd.DataFrame([{"point": point_of(ln), "endpoint": ln.endpoint,
                        "conversation": ln.conversation} for ln in lines])
    where = df.groupby(["point", "conversation"])["endpoint"].nunique()
    split = set(where[where > 1].index)
    rows = []
    order = {p: i for i, (p, _, _) in enumerate(spans)}
    for (point, ep), g in df.groupby(["point", "endpoint"]):
        convs = set(g["conversation"])
        rows.append({"point": point, "endpoint": ep, "sessions": len(convs),
                     "requests": len(g),
                     "split": sum((point, c) in split for c in convs)})
    rows.sort(key=lambda r: (order.get(r["point"], len(order)), derive._natural(r["endpoint"])))
    return pd.DataFrame(rows, columns=cols)



# --- one run ---------------------------------------------------------------------------------


@dataclass
class AgenticRun:
    """What the dashboard and the report show of an agentic run's points."""

    roles: dict[str, str]            # engine /metrics URL -> role
    records: pd.DataFrame            # AIPerf's per-request records, every point
    buckets: pd.DataFrame            # TTFT by context bucket, with the compute line
    ms_per_token: dict[str, float | None]  # point -> the prefill compute line's slope
    sessions: pd.DataFrame           # per point and decode endpoint

    @property
    def holder(self) -> str | None:
        return prefix_role(self.roles)


def load_run(run: Path, points: list[dict], plan: PlanDoc | None) -> AgenticRun | None:
    """The run's agentic points read from AIPerf's files and the decodes' logs (None when
    no point is agentic)."""
    run = Path(run)
    roles = metrics_roles(plan)
    recs, slope = [], {}
    for p in points:
        art = artifacts(run, p)
        if art is None:
            continue
        label = derive.point_label(p)
        recs.append(read_records(art, label, p["agentic"].get("sessions")))
        slope[label] = prefill_ms_per_token(read_server_metrics(art), roles)
    if not recs:
        return None
    records = pd.concat(recs, ignore_index=True)
    return AgenticRun(roles, records,
                      with_compute_line(context_buckets(records), slope), slope,
                      sessions_per_endpoint(read_request_lines(run), point_spans(records)))
