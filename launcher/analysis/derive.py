"""Derived metrics: per sweep point (window) and per time bin. Pure pandas/numpy, no Streamlit.

The store keeps *change points* (launcher/telemetry/store.py): a series is written when it
changes, at the last sample of an unchanged run, and at keyframes. Linear interpolation
between consecutive rows of a series gives back every sampled value, so everything here
works on interpolated values, never on "the rows in a bin" (which would over-weight busy
periods):

- the value of a series at t: linear interpolation, NaN before its first row, after its
  last row + `HOLD_S`, and inside a gap longer than `HOLD_S` (agent down);
- counter increase over [a, b]: v(b) - v(a); a negative step is a restart (counted as v(b));
- histogram means over a window: Σ Δsum / Σ Δcount (interval means, not cumulative);
- quantiles over a window: summed bucket deltas, interpolated like Prometheus'
  histogram_quantile;
- ratios whose denominator is 0 are NaN (shown as "no data"), never inf.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from launcher.run import figures
from launcher.run.plandoc import PlanDoc

# A series with no row for this long is "no data", not "unchanged": the store writes a
# keyframe every 60 s while its source is alive.
HOLD_S = 75.0

TTFT_COMPONENTS = ("prefill_queue", "prefill_compute", "kv_transfer", "decode_admission",
                   "remainder")
COMPONENT_TITLES = {
    "prefill_queue": "Prefill queue",
    "prefill_compute": "Prefill compute",
    "kv_transfer": "KV transfer (NIXL)",
    "decode_admission": "Decode admission",
    "remainder": "Remainder (router, first decode step, client)",
}
TTFT_CAVEATS = (
    "Client TTFT (from the bench client) is the truth; the parts are engine-side means over "
    "the point's measured window, i.e. averages over different request populations, and "
    "they do not add up exactly (vLLM #22454, #29474).",
    "Prefill queue and compute: vllm:request_queue_time_seconds and "
    "vllm:request_prefill_time_seconds on the prefill endpoints.",
    "KV transfer: vllm:nixl_xfer_time_seconds on the decode endpoints. NIXL pools the "
    "transfers of all TP ranks (count ≈ requests × ranks), so this is the mean rank-level "
    "transfer time, not a per-request time (vLLM #41230).",
    "Decode admission: vllm:request_queue_time_seconds on the decode endpoints (waiting for "
    "KV room or a batch slot). Whether it also covers the wait for the remote KV is not "
    "verified, so it may overlap with KV transfer.",
    "Remainder = client mean TTFT − the four parts: router hops, the first decode step, "
    "client overhead and any overlap error. A negative remainder means the parts overlap.",
)


# --- plan helpers --------------------------------------------------------------------------


def role_of_name(process: str) -> str:
    base = process.split("@", 1)[0]
    for role in ("prefill", "decode", "agg"):
        if base.startswith(role + "-"):
            return role
    if base in ("router", "bench", "accuracy"):
        return base
    if base.startswith("agent"):
        return "agent"
    return "other"


def process_roles(plan: PlanDoc | None) -> dict[str, tuple[str, str]]:
    """process name -> (endpoint, role); names the plan lacks fall back to the naming rule."""
    out: dict[str, tuple[str, str]] = {}
    for p in plan.processes if plan else []:
        ep = p.endpoint or p.name.split("@", 1)[0]
        out[p.name] = (ep, str(p.role) if p.role else role_of_name(p.name))
    return out


def gpu_count(plan: PlanDoc | None, role: str) -> int:
    return plan.gpus(role) if plan else 0


def parse_labels(s: str) -> dict:
    if not s:
        return {}
    try:
        d = json.loads(s)
    except json.JSONDecodeError:
        return {}
    return d if isinstance(d, dict) else {}


# --- the series set ------------------------------------------------------------------------


class SeriesSet:
    """Telemetry rows regrouped per series: `meta` (one row per series, with endpoint and
    role from the plan) plus each series' (ts, value) arrays, for interpolation."""

    def __init__(self, df: pd.DataFrame, plan: PlanDoc | None) -> None:
        self._selected: dict[tuple, pd.DataFrame] = {}
        if df.empty:
            self.meta = pd.DataFrame(columns=["process", "engine", "name", "labels", "node",
                                              "endpoint", "role", "engine_key"])
            self.ts = np.empty(0)
            self.val = np.empty(0)
            self.off = np.zeros(1, dtype=np.int64)
            return
        if "series" not in df.columns:
            df = df.assign(series=df.groupby(["process", "engine", "name", "labels"],
                                             observed=True, sort=False).ngroup())
            df = df.sort_values(["series", "ts"], kind="stable")
        sid = df["series"].to_numpy()
        self.ts = df["ts"].to_numpy(dtype="float64")
        self.val = df["value"].to_numpy(dtype="float64")
        n = int(sid.max()) + 1 if len(sid) else 0
        self.off = np.searchsorted(sid, np.arange(n + 1)).astype(np.int64)
        first = self.off[:-1]
        meta = pd.DataFrame({c: df[c].to_numpy()[first].astype(str)
                             for c in ("process", "engine", "name", "labels", "node")})
        roles = process_roles(plan)
        meta["endpoint"] = [roles.get(p, (p.split("@", 1)[0], ""))[0] for p in meta["process"]]
        meta["role"] = [roles.get(p, ("", role_of_name(p)))[1] for p in meta["process"]]
        meta["engine_key"] = meta["endpoint"] + "/e" + meta["engine"]
        self.meta = meta

    def __len__(self) -> int:
        return len(self.meta)

    @property
    def t_range(self) -> tuple[float, float]:
        if len(self.ts) == 0:
            return (math.nan, math.nan)
        return float(self.ts.min()), float(self.ts.max())

    def select(self, name: str | tuple[str, ...], role: str | None = None,
               **labels: str) -> pd.DataFrame:
        """The series of `name` (of `role`, with `labels`): rows of `meta`, not to be
        changed. Kept per set: a page asks the same for every sweep point, and each pandas
        filter costs more than the point's arithmetic."""
        names = (name,) if isinstance(name, str) else tuple(name)
        key = (names, role, tuple(sorted(labels.items())))
        sel = self._selected.get(key)
        if sel is None:
            m = self.meta
            sel = m[m["name"].isin(names)]
            if role is not None:
                sel = sel[sel["role"] == role]
            for k, v in labels.items():
                sel = sel[[parse_labels(s).get(k) == v for s in sel["labels"]]]
            self._selected[key] = sel
        return sel

    def label_values(self, ids: pd.Index, key: str) -> list[str]:
        return [str(parse_labels(s).get(key, "")) for s in self.meta.loc[ids, "labels"]]

    def values_at(self, ids, grid: np.ndarray) -> np.ndarray:
        """[len(ids), len(grid)] interpolated values, NaN where the series has no data."""
        grid = np.asarray(grid, dtype="float64")
        out = np.full((len(ids), len(grid)), np.nan)
        for k, i in enumerate(ids):
            a, b = self.off[i], self.off[i + 1]
            t, v = self.ts[a:b], self.val[a:b]
            if len(t) == 0:
                continue
            row = np.interp(grid, t, v)
            bad = (grid < t[0]) | (grid > t[-1] + HOLD_S)
            if len(t) > 1:
                j = np.clip(np.searchsorted(t, grid, side="right"), 1, len(t) - 1)
                bad |= (t[j] - t[j - 1] > HOLD_S) & (grid > t[j - 1] + HOLD_S) & (grid < t[j])
            row[bad] = np.nan
            out[k] = row
        return out

    def increase(self, ids, a: float, b: float) -> np.ndarray:
        """Counter increase over [a, b] per series (0 for a series without data there)."""
        res = np.zeros(len(ids))
        for k, i in enumerate(ids):
            lo, hi = self.off[i], self.off[i + 1]
            t, v = self.ts[lo:hi], self.val[lo:hi]
            if len(t) == 0 or t[0] > b or t[-1] < a:
                continue
            va = np.interp(max(a, t[0]), t, v)
            vb = np.interp(min(b, t[-1]), t, v)
            # Restarts inside the window: add each drop back (the counter began again at 0).
            inside = (t > a) & (t <= b)
            steps = np.diff(v[inside]) if inside.sum() > 1 else np.empty(0)
            drops = -steps[steps < 0].sum() if len(steps) else 0.0
            res[k] = max(vb - va + drops, 0.0)
        return res

    def rows_in(self, ids, a: float, b: float) -> np.ndarray:
        """Every stored value of `ids` inside [a, b] (for exact maxima: changes are rows)."""
        parts = []
        for i in ids:
            lo, hi = self.off[i], self.off[i + 1]
            t = self.ts[lo:hi]
            j0, j1 = np.searchsorted(t, a), np.searchsorted(t, b, side="right")
            parts.append(self.val[lo + j0:lo + j1])
        return np.concatenate(parts) if parts else np.empty(0)


# --- windows -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    label: str
    start: float
    end: float
    concurrency: float | None


def point_label(p: dict) -> str:
    c = p.get("max_concurrency")
    if isinstance(c, (int, float)):
        return f"c={int(c)}"
    r = p.get("request_rate")
    return f"rate={r}" if r is not None else str(p.get("file", "?"))


def window_of(p: dict) -> Window | None:
    ws, we = p.get("window_start"), p.get("window_end")
    if isinstance(ws, (int, float)) and isinstance(we, (int, float)) and we > ws:
        c = p.get("max_concurrency")
        return Window(point_label(p), float(ws), float(we),
                      float(c) if isinstance(c, (int, float)) else None)
    return None


def hist_quantile(les: list[str], counts: np.ndarray, q: float) -> float:
    """Prometheus-style quantile from cumulative bucket counts keyed by `le` strings."""
    if len(les) == 0:
        return float("nan")
    bounds = np.array([math.inf if s in ("+Inf", "inf", "Inf") else float(s) for s in les])
    order = np.argsort(bounds)
    bounds, cum = bounds[order], np.asarray(counts, dtype="float64")[order]
    total = cum[-1]
    if not total > 0:
        return float("nan")
    rank = q * total
    i = min(int(np.searchsorted(cum, rank, side="left")), len(bounds) - 1)
    if math.isinf(bounds[i]):
        return float(bounds[i - 1]) if i > 0 else float("nan")  # last finite bound
    lo_le = bounds[i - 1] if i > 0 else 0.0
    lo_c = cum[i - 1] if i > 0 else 0.0
    width = cum[i] - lo_c
    if width <= 0:
        return float(bounds[i])
    return float(lo_le + (bounds[i] - lo_le) * (rank - lo_c) / width)


# --- headline figures ----------------------------------------------------------------------


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else float("nan")


def headline(point: dict, plan: PlanDoc | None) -> dict[str, float]:
    """Headline figures of one point from `launcher.run.figures` (the one place they are
    computed; named denominators), as floats with NaN for "not applicable"."""
    from launcher.run import figures

    fig = figures.point_figures(point, figures.gpu_denominators(plan),
                                plan.mode if plan else "disagg",
                                figures.allocated_gpus(plan) if plan else None)
    out = {k: _num(fig.get(k)) for k in HEADLINE_TITLES}
    for m in ("ttft", "tpot"):
        for q in (50, 90, 99):
            out[f"{m}_p{q}_s"] = _num(fig.get(f"{m}_p{q}_ms")) / 1000.0
    out["request_rate"] = _num(fig.get("request_throughput"))
    out["total_tok_s"] = _num(fig.get("total_token_throughput"))
    out["output_tok_s"] = _num(fig.get("output_throughput"))
    out["input_tok_s"] = _num(fig.get("input_throughput"))
    return out


HEADLINE_TITLES = {
    "total_tokens_per_s_per_gpu": "Total tok/s per working GPU (input+output ÷ P+D GPUs)",
    "total_tokens_per_s_per_allocated_gpu": "Total tok/s per allocated GPU (input+output ÷ "
                                            "nodes × GPUs per node, idle GPUs included)",
    "output_tokens_per_s_per_decode_gpu": "Output tok/s per decode GPU",
    "input_tokens_per_s_per_prefill_gpu": "Input tok/s per prefill GPU",
    "tokens_per_s_per_user": "tok/s per user (1000 ÷ median TPOT ms)",
}


# --- per sweep point -----------------------------------------------------------------------

EVIDENCE_COLUMNS = (
    "prefill_queue_s", "prefill_compute_s", "kv_transfer_s", "decode_admission_s",
    "decode_engine_ttft_s", "kv_transfer_p99_s", "transfers",
    "decode_kv_max", "decode_kv_mean", "prefill_kv_max",
    "decode_waiting_capacity", "decode_waiting_deferred", "prefill_waiting",
    "decode_running", "preemptions", "nixl_failed", "kv_expired",
    "energy_prefill_j", "energy_decode_j", "energy_agg_j", "energy_j", "energy_allocated_j",
    "spec_acceptance_rate", "spec_mean_acceptance_length", "spec_per_position",
)


def point_table(points: list[dict], plan: PlanDoc | None, ss: SeriesSet | None,
                step_s: float = 1.0) -> pd.DataFrame:
    """One row per sweep point: client figures, headline figures, TTFT parts and the
    engine-side evidence the diagnosis reads. Without telemetry those columns are NaN."""
    rows = []
    for p in points:
        status = p.get("status") or "ok"
        if status == "ok" and not (_num(p.get("completed")) > 0):
            status = "failed"
        r: dict[str, Any] = {
            "point": point_label(p),
            "concurrency": _num(p.get("max_concurrency")),
            "status": status,
            "failure_reason": p.get("failure_reason"),
            "completed": _num(p.get("completed")),
            "failed": _num(p.get("failed")),
            "window_start": _num(p.get("window_start")),
            "window_end": _num(p.get("window_end")),
        }
        for m in ("ttft", "tpot", "itl", "e2el"):
            r[f"{m}_mean_s"] = _num(p.get(f"mean_{m}_ms")) / 1000.0
        r.update(headline(p, plan))
        r.update(window_evidence(window_of(p), ss, step_s))
        r.update(prefix_reuse(p))
        rows.append(r)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    parts = table[[f"{c}_s" for c in TTFT_COMPONENTS[:-1]]].sum(axis=1, min_count=1)
    table["remainder_s"] = table["ttft_mean_s"] - parts
    # energy per output token and per request, from the working GPUs (NaN without NVML:
    # absent, never 0)
    out_tokens = pd.Series([_num(p.get("total_output_tokens")) for p in points],
                           index=table.index)
    table["joules_per_output_token"] = table["energy_j"] / out_tokens.where(out_tokens > 0)
    table["joules_per_request"] = table["energy_j"] / table["completed"].where(
        table["completed"] > 0)
    return table


def prefix_reuse(p: dict) -> dict[str, float]:
    """An agentic point's prefix-cache hit rate achieved (the engines' counters) beside the
    trace's theoretical one, and the peak KV use of the engines that hold the prefixes (the
    prefills in P/D, where the hits are counted; docs/agentic.md). NaN elsewhere."""
    ag = p.get("agentic") if isinstance(p.get("agentic"), dict) else {}
    kv = ag.get("kv_usage_max") if isinstance(ag.get("kv_usage_max"), dict) else {}
    held = kv.get("prefill") if "prefill" in kv else max(kv.values(), default=None)
    return {"hit_achieved": _num(ag.get("prefix_hit_rate")),
            "hit_tiers": _num(ag.get("tier_hit_rate")),
            "hit_theoretical": _num(figures.offered_hit_rate(ag)),
            "prefix_kv_max": _num(held)}


def window_evidence(w: Window | None, ss: SeriesSet | None, step_s: float) -> dict[str, float]:
    """Engine-side numbers over one point's window (NaN where the series are absent)."""
    out = {c: float("nan") for c in EVIDENCE_COLUMNS}
    if w is None or ss is None or len(ss) == 0:
        return out
    a, b = w.start, w.end
    grid = np.arange(a, b + 1e-9, max(step_s, (b - a) / 2000))

    def hist_mean(base: str, role: str) -> float:
        s = ss.select(base + "_sum", role).index
        c = ss.select(base + "_count", role).index
        if len(s) == 0 or len(c) == 0:
            return float("nan")
        cnt = ss.increase(c, a, b).sum()
        return float(ss.increase(s, a, b).sum() / cnt) if cnt > 0 else float("nan")

    def total(name: str, role: str) -> float:
        ids = ss.select(name, role).index
        return float(ss.increase(ids, a, b).sum()) if len(ids) else float("nan")

    def gauge(name: str, role: str, stat: str, **labels: str) -> float:
        ids = ss.select(name, role, **labels).index
        if len(ids) == 0:
            return float("nan")
        if stat == "max":  # exact: every change is a stored row
            vals = ss.rows_in(ids, a, b)
            m = ss.values_at(ids, grid)
            cands = np.concatenate([vals, m[~np.isnan(m)]])
            return float(cands.max()) if len(cands) else float("nan")
        m = ss.values_at(ids, grid)
        if np.isnan(m).all():
            return float("nan")
        if stat == "mean_one":
            return float(np.nanmean(m))
        return float(np.nanmean(np.nansum(m, axis=0)))  # mean over time of the sum

    out["prefill_queue_s"] = hist_mean("vllm:request_queue_time_seconds", "prefill")
    out["prefill_compute_s"] = hist_mean("vllm:request_prefill_time_seconds", "prefill")
    out["kv_transfer_s"] = hist_mean("vllm:nixl_xfer_time_seconds", "decode")
    out["decode_admission_s"] = hist_mean("vllm:request_queue_time_seconds", "decode")
    out["decode_engine_ttft_s"] = hist_mean("vllm:time_to_first_token_seconds", "decode")
    out["transfers"] = total("vllm:nixl_xfer_time_seconds_count", "decode")
    out["decode_kv_max"] = gauge("vllm:kv_cache_usage_perc", "decode", "max")
    out["decode_kv_mean"] = gauge("vllm:kv_cache_usage_perc", "decode", "mean_one")
    out["prefill_kv_max"] = gauge("vllm:kv_cache_usage_perc", "prefill", "max")
    out["decode_waiting_capacity"] = gauge("vllm:num_requests_waiting_by_reason", "decode",
                                           "mean_sum", reason="capacity")
    out["decode_waiting_deferred"] = gauge("vllm:num_requests_waiting_by_reason", "decode",
                                           "mean_sum", reason="deferred")
    out["prefill_waiting"] = gauge("vllm:num_requests_waiting", "prefill", "mean_sum")
    out["decode_running"] = gauge("vllm:num_requests_running", "decode", "mean_sum")
    out["preemptions"] = total("vllm:num_preemptions_total", "decode")
    out["nixl_failed"] = total("vllm:nixl_num_failed_transfers_total", "decode")
    out["kv_expired"] = total("vllm:nixl_num_kv_expired_reqs_total", "prefill")
    # NVML's counter (mJ since driver load) over the window, by the role of each GPU's
    # process; GPUs with no process (idle in the allocation) count for the allocation only
    energy = {r: total("gpu:energy_mj", r) / 1000.0 for r in ("prefill", "decode", "agg")}
    for r, j in energy.items():
        out[f"energy_{r}_j"] = j
    working = [j for j in energy.values() if not math.isnan(j)]
    out["energy_j"] = sum(working) if working else float("nan")
    ids = ss.select("gpu:energy_mj").index
    out["energy_allocated_j"] = (float(ss.increase(ids, a, b).sum()) / 1000.0 if len(ids)
                                 else float("nan"))
    out.update(spec_evidence(ss, a, b))
    ids = ss.select("vllm:nixl_xfer_time_seconds_bucket", "decode").index
    if len(ids):
        les = ss.label_values(ids, "le")
        inc = ss.increase(ids, a, b)
        per_le = pd.Series(inc).groupby(np.array(les)).sum()
        out["kv_transfer_p99_s"] = hist_quantile(list(per_le.index), per_le.to_numpy(), 0.99)
    return out


def decode_endpoints(points: list[dict], ss: SeriesSet | None) -> pd.DataFrame:
    """Per sweep point and decode endpoint: requests it admitted, their mean wait for
    admission (vllm:request_queue_time_seconds there), its own mean TTFT and its peak KV use
    (the most used engine): an endpoint that admits slowly behind the router shows here,
    where the point's mean hides it. Empty without telemetry."""
    cols = ["point", "endpoint", "requests", "admission_s", "engine_ttft_s", "kv_max"]
    if ss is None or len(ss) == 0:
        return pd.DataFrame(columns=cols)
    dec = ss.meta[ss.meta["role"] == "decode"]
    rows = []
    for p in points:
        w = window_of(p)
        if w is None or (p.get("status") or "ok") != "ok":
            continue
        grid = np.arange(w.start, w.end + 1e-9, max(1.0, (w.end - w.start) / 2000))
        for ep in sorted(set(dec["endpoint"]), key=_natural):
            mine = dec[dec["endpoint"] == ep]
            n, admission = _mean_over(ss, mine, "vllm:request_queue_time_seconds", w)
            _, ttft = _mean_over(ss, mine, "vllm:time_to_first_token_seconds", w)
            kv = mine[mine["name"] == "vllm:kv_cache_usage_perc"].index
            vals = np.concatenate([ss.rows_in(kv, w.start, w.end),
                                   ss.values_at(kv, grid).ravel()]) if len(kv) else np.empty(0)
            vals = vals[~np.isnan(vals)]
            rows.append({"point": w.label, "endpoint": ep, "requests": n,
                         "admission_s": admission, "engine_ttft_s": ttft,
                         "kv_max": float(vals.max()) if len(vals) else float("nan")})
    return pd.DataFrame(rows, columns=cols)


def _mean_over(ss: SeriesSet, series: pd.DataFrame, base: str, w: Window
               ) -> tuple[float, float]:
    """(observations, their mean) of a histogram over a window, summed over `series`."""
    def ids(name: str) -> pd.Index:
        return series[series["name"] == name].index

    n = float(ss.increase(ids(base + "_count"), w.start, w.end).sum())
    total = float(ss.increase(ids(base + "_sum"), w.start, w.end).sum())
    return n, (total / n if n > 0 else float("nan"))


def _natural(name: str) -> tuple:
    """decode-2 before decode-10."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def spec_evidence(ss: SeriesSet, a: float, b: float) -> dict[str, Any]:
    """Speculative decoding over a window, as vLLM's SpecDecodingProm defines it: the
    acceptance rate (accepted ÷ drafted tokens), the mean acceptance length (1 + accepted ÷
    drafts: the target's own token counts) and the per-position rates (accepted at each
    draft position ÷ drafts, as text). NaN / None without drafts in the window."""
    def inc(name: str) -> float:
        ids = ss.select(name).index
        return float(ss.increase(ids, a, b).sum()) if len(ids) else float("nan")

    drafts = inc("vllm:spec_decode_num_drafts_total")
    tokens = inc("vllm:spec_decode_num_draft_tokens_total")
    accepted = inc("vllm:spec_decode_num_accepted_tokens_total")
    out: dict[str, Any] = {"spec_acceptance_rate": float("nan"),
                           "spec_mean_acceptance_length": float("nan"),
                           "spec_per_position": None}
    if not drafts > 0:
        return out
    out["spec_acceptance_rate"] = accepted / tokens if tokens > 0 else float("nan")
    out["spec_mean_acceptance_length"] = 1 + accepted / drafts
    ids = ss.select("vllm:spec_decode_num_accepted_tokens_per_pos_total").index
    if len(ids):
        per = pd.Series(ss.increase(ids, a, b)).groupby(
            np.array(ss.label_values(ids, "position"), dtype=int)).sum()
        out["spec_per_position"] = ", ".join(f"{v / drafts:.3f}" for v in per.sort_index())
    return out


# --- time series for drawing ---------------------------------------------------------------


def bin_width(t0: float, t1: float, max_bins: int) -> float:
    """A round bin width (1 s, 2 s, 5 s, 10 s, ...) giving at most `max_bins` bins."""
    span = max(t1 - t0, 1.0)
    for w in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600):
        if span / w <= max_bins:
            return float(w)
    return float(math.ceil(span / max_bins))


@dataclass(frozen=True)
class Bins:
    t0: float
    width: float
    n: int

    @classmethod
    def over(cls, t0: float, t1: float, max_bins: int = 240) -> Bins:
        w = bin_width(t0, t1, max_bins)
        t0 = math.floor(t0 / w) * w
        return cls(t0, w, max(1, int(math.ceil((t1 - t0) / w))))

    @property
    def edges(self) -> np.ndarray:
        return self.t0 + self.width * np.arange(self.n + 1)

    def sub_grid(self, step_s: float) -> tuple[np.ndarray, int]:
        """k evenly spaced points inside each bin (bin means of a gauge)."""
        k = int(max(1, min(8, round(self.width / max(step_s, 1e-3)))))
        offs = (np.arange(k) + 0.5) / k * self.width
        grid = (self.edges[:-1, None] + offs[None, :]).ravel()
        return grid, k

    def times(self) -> pd.DatetimeIndex:
        return pd.to_datetime(self.edges[:-1], unit="s", utc=True)


def gauge_bins(ss: SeriesSet, ids, bins: Bins, step_s: float = 1.0) -> np.ndarray:
    """[len(ids), bins.n] bin means of gauges (interpolated, so quiet periods count)."""
    grid, k = bins.sub_grid(step_s)
    m = ss.values_at(ids, grid).reshape(len(ids), bins.n, k)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmean(m, axis=2)


def counter_bins(ss: SeriesSet, ids, bins: Bins) -> np.ndarray:
    """[len(ids), bins.n] rates per second of counters (increase per bin ÷ width)."""
    v = ss.values_at(ids, bins.edges)
    d = np.diff(v, axis=1)
    d[d < 0] = np.nan  # a restart: no rate for that bin rather than a negative spike
    return d / bins.width


def long_frame(matrix: np.ndarray, keys: pd.DataFrame, bins: Bins,
               value: str = "value") -> pd.DataFrame:
    """Matrix rows x bins -> tidy rows (key columns, t, value), NaN dropped (for altair)."""
    if matrix.size == 0:
        return pd.DataFrame(columns=[*keys.columns, "t", value])
    n_rows, n_bins = matrix.shape
    df = keys.loc[keys.index.repeat(n_bins)].reset_index(drop=True)
    df["t"] = np.tile(bins.times().to_numpy(), n_rows)
    df[value] = matrix.ravel()
    return df.dropna(subset=[value])


def group_sum(matrix: np.ndarray, groups: list[str]) -> tuple[np.ndarray, list[str]]:
    """Sum matrix rows by group label (NaN when every member is NaN)."""
    labels = sorted(set(groups))
    out = np.full((len(labels), matrix.shape[1] if matrix.ndim == 2 else 0), np.nan)
    g = np.array(groups)
    for i, lab in enumerate(labels):
        rows = matrix[g == lab]
        valid = ~np.isnan(rows).all(axis=0)
        out[i, valid] = np.nansum(rows[:, valid], axis=0)
    return out, labels


def grouped_series(ss: SeriesSet, meta: pd.DataFrame, by: Callable[[pd.Series], str] | str,
                   bins: Bins, kind: str, step_s: float = 1.0,
                   how: str = "sum") -> pd.DataFrame:
    """Tidy (group, t, value): series of `meta` binned (gauge means or counter rates) and
    combined per group (sum, or mean/max/min across members for spreads)."""
    if meta.empty:
        return pd.DataFrame(columns=["group", "t", "value"])
    ids = meta.index
    m = gauge_bins(ss, ids, bins, step_s) if kind == "gauge" else counter_bins(ss, ids, bins)
    groups = ([by(r) for _, r in meta.iterrows()] if callable(by)
              else meta[by].astype(str).tolist())
    if how == "sum":
        agg, labels = group_sum(m, groups)
    else:
        labels = sorted(set(groups))
        g = np.array(groups)
        fn = {"mean": np.nanmean, "max": np.nanmax, "min": np.nanmin}[how]
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            agg = np.vstack([fn(m[g == lab], axis=0) for lab in labels])
    return long_frame(agg, pd.DataFrame({"group": labels}), bins)


def hist_mean_bins(ss: SeriesSet, base: str, role: str | None, by: str, bins: Bins,
                   ) -> pd.DataFrame:
    """Per group and bin: Δsum/Δcount (e.g. mean NIXL transfer time per 30 s)."""
    s = ss.select(base + "_sum", role)
    c = ss.select(base + "_count", role)
    if s.empty or c.empty:
        return pd.DataFrame(columns=["group", "t", "value"])
    ms, ls = group_sum(counter_bins(ss, s.index, bins), s[by].astype(str).tolist())
    mc, lc = group_sum(counter_bins(ss, c.index, bins), c[by].astype(str).tolist())
    common = [lab for lab in ls if lab in lc]
    num = ms[[ls.index(lab) for lab in common]]
    den = mc[[lc.index(lab) for lab in common]]
    with np.errstate(all="ignore"):
        val = np.where(den > 0, num / den, np.nan)
    return long_frame(val, pd.DataFrame({"group": common}), bins)


# --- frontier ------------------------------------------------------------------------------


def pareto_frontier(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Points not beaten on both larger x and larger y (maximise x, maximise y).

    O(n log n): sort by x descending, keep a running maximum of y.
    """
    d = df.dropna(subset=[x, y]).sort_values([x, y], ascending=[False, False])
    keep, best = [], -math.inf
    for idx, yv in zip(d.index, d[y].to_numpy(), strict=True):
        if yv > best:
            keep.append(idx)
            best = yv
    return d.loc[keep].sort_values(x)


# --- capacity ------------------------------------------------------------------------------


def kv_capacity(ss: SeriesSet) -> pd.DataFrame:
    """Per engine: num_gpu_blocks, block_size and KV capacity in tokens, from the labels of
    vllm:cache_config_info (empty when the info metric was not scraped)."""
    sel = ss.select("vllm:cache_config_info")
    cols = ["endpoint", "role", "engine", "num_gpu_blocks", "block_size", "capacity_tokens"]
    if sel.empty:
        return pd.DataFrame(columns=cols)
    labs = [parse_labels(s) for s in sel["labels"]]
    out = pd.DataFrame({
        "endpoint": sel["endpoint"].to_numpy(), "role": sel["role"].to_numpy(),
        "engine": sel["engine"].to_numpy(),
        "num_gpu_blocks": pd.to_numeric([d.get("num_gpu_blocks") for d in labs],
                                        errors="coerce"),
        "block_size": pd.to_numeric([d.get("block_size") for d in labs], errors="coerce"),
    })
    out["capacity_tokens"] = out["num_gpu_blocks"] * out["block_size"]
    return out.drop_duplicates(subset=["endpoint", "engine"]).reset_index(drop=True)[cols]


# --- page data: KV cache -------------------------------------------------------------------


def kv_page_data(ss: SeriesSet, t0: float, t1: float, step_s: float = 1.0,
                 max_bins: int = 240) -> dict[str, Any]:
    """Everything the KV page draws, binned for drawing (≤ max_bins per series)."""
    bins = Bins.over(t0, t1, max_bins)
    out: dict[str, Any] = {"bin_s": bins.width}

    kv = ss.select("vllm:kv_cache_usage_perc")
    if not kv.empty:
        m = gauge_bins(ss, kv.index, bins, step_s)
        keys = kv[["engine_key", "endpoint", "role"]].reset_index(drop=True)
        out["kv_heat"] = long_frame(m, keys, bins)
        # Per endpoint when there are few; per role on big runs (the heatmap has the detail).
        by = "endpoint" if kv["endpoint"].nunique() <= 6 else "role"
        out["kv_spread_by"] = by
        spreads = []
        for how in ("min", "mean", "max"):
            g = grouped_series(ss, kv, by, bins, "gauge", step_s, how=how)
            spreads.append(g.rename(columns={"value": how}).set_index(["group", "t"]))
        out["kv_spread"] = pd.concat(spreads, axis=1).reset_index()
    out["capacity"] = kv_capacity(ss)

    def role_label(r: pd.Series, key: str) -> str:
        return f"{r['role']} · {parse_labels(r['labels']).get(key, '?')}"

    w = ss.select("vllm:num_requests_waiting_by_reason")
    if not w.empty:
        out["waiting"] = grouped_series(ss, w, lambda r: role_label(r, "reason"), bins,
                                        "gauge", step_s)
    else:
        w = ss.select("vllm:num_requests_waiting")
        if not w.empty:
            out["waiting"] = grouped_series(ss, w, lambda r: f"{r['role']} · all", bins,
                                            "gauge", step_s)
    ep_by = "endpoint" if ss.meta["endpoint"].nunique() <= 6 else "role"
    out["group_by"] = ep_by
    run = ss.select("vllm:num_requests_running")
    if not run.empty:
        out["running"] = grouped_series(ss, run, ep_by, bins, "gauge", step_s)
    pre = ss.select("vllm:num_preemptions_total")
    if not pre.empty:
        out["preempt"] = grouped_series(ss, pre, ep_by, bins, "counter")
        out["preempt_total"] = float(ss.increase(pre.index, t0, t1).sum())
    src = ss.select("vllm:prompt_tokens_by_source_total")
    if not src.empty:
        # per role: a prefill's computed tokens are the prompts a decode receives, so one
        # stack over both roles would count every prompt twice
        out["sources"] = {
            role: grouped_series(ss, g, lambda r: parse_labels(r["labels"]).get("source", "?"),
                                 bins, "counter")
            for role, g in src.groupby("role", sort=False) if role in ("prefill", "decode")}
    fetch = ss.select("vllm:num_requests_kv_fetch_by_stage")
    if not fetch.empty:
        out["kv_fetch"] = grouped_series(
            ss, fetch, lambda r: parse_labels(r["labels"]).get("stage", "?"), bins, "gauge",
            step_s)
    x = hist_mean_bins(ss, "vllm:nixl_xfer_time_seconds", None, "endpoint", bins)
    if not x.empty:
        out["nixl_time_ms"] = x.assign(value=x["value"] * 1000.0)
    nb = ss.select("vllm:nixl_bytes_transferred_sum")
    if not nb.empty:
        b = grouped_series(ss, nb, "endpoint", bins, "counter")
        out["nixl_bytes"] = b.assign(value=b["value"] / 1e9)  # GB/s
    nc = ss.select("vllm:nixl_xfer_time_seconds_count")
    if not nc.empty:
        out["nixl_rate"] = grouped_series(ss, nc, "endpoint", bins, "counter")
    for key in ("nixl_bytes", "nixl_rate"):
        # Pull mode fills these on decode only: leave out endpoints that never moved.
        if key in out:
            f = out[key]
            moving = f.groupby("group")["value"].transform(lambda v: v.abs().max() > 0)
            out[key] = f[moving]
    fails = []
    for name, lab in (("vllm:nixl_num_failed_transfers_total", "failed transfers"),
                      ("vllm:nixl_num_kv_expired_reqs_total", "KV expired (lease)")):
        f = ss.select(name)
        if not f.empty:
            g = grouped_series(ss, f, lambda r, lab=lab: lab, bins, "counter")
            fails.append(g.assign(value=g["value"] * bins.width))  # count per bin
            out[f"total:{lab}"] = float(ss.increase(f.index, t0, t1).sum())
    if fails:
        out["nixl_fail"] = pd.concat(fails, ignore_index=True)
    return out


# --- capacity: predicted (plan.json) vs observed (telemetry) -------------------------------

# plan.json's `capacity` entries change shape while the estimator evolves: every field is
# looked up under each of its known names, the first that holds a number wins.
PREDICTED_KEYS: dict[str, tuple[str, ...]] = {
    "endpoint": ("endpoint", "name"),
    "per_endpoint": ("endpoint_at_mean_length", "max_concurrency", "endpoint_max_concurrency",
                     "max_concurrency_per_endpoint", "concurrency"),
    "per_endpoint_at_max_length": ("endpoint_at_max_length",),
    "per_rank": ("per_rank_at_mean_length", "max_concurrency_per_rank",
                 "max_concurrency_per_dp_rank", "per_rank", "per_dp_rank"),
    "per_rank_at_max_length": ("per_rank_at_max_length",),
    "tokens_per_request": ("tokens_per_request", "lengths.mean_total", "mean_total"),
    "blocks_per_rank": ("num_gpu_blocks", "blocks_per_rank"),
    "block_size": ("block_size",),
    "dp": ("dp", "dp_size"),
}
FULL_KV = 0.95  # KV usage that counts as "the cache was full" at the top sweep point


def _lookup(d: dict, key: str) -> Any:
    cur: Any = d
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def predicted_capacity(capacity: list[dict] | None, plan: PlanDoc | None = None,
                       ) -> list[dict[str, Any]]:
    """One dict per plan.json capacity entry: endpoint, per_endpoint, per_rank (÷ DP when
    only the endpoint figure is there), at max length, tokens_per_request, blocks_per_rank,
    block_size and assumptions (list of str). Fields the entry lacks are absent."""
    dp_of = {e.name: e.dp_size for e in plan.endpoints} if plan else {}
    out = []
    for c in capacity or []:
        if not isinstance(c, dict):
            continue
        row: dict[str, Any] = {}
        for field, names in PREDICTED_KEYS.items():
            for n in names:
                v = _lookup(c, n)
                if field == "endpoint" and isinstance(v, str) and v:
                    row[field] = v
                    break
                if field != "endpoint" and isinstance(v, (int, float)) and \
                        not isinstance(v, bool) and math.isfinite(v):
                    row[field] = float(v)
                    break
        if "endpoint" not in row:
            continue
        dp = row.get("dp") or dp_of.get(row["endpoint"])
        if "per_rank" not in row and "per_endpoint" in row and dp:
            row["per_rank"] = row["per_endpoint"] / dp
            row["per_rank_derived"] = True
        if "per_endpoint" not in row and "per_rank" in row and dp:
            row["per_endpoint"] = row["per_rank"] * dp
        a = c.get("assumptions")
        if isinstance(a, str) and a:
            row["assumptions"] = [a]
        elif isinstance(a, (list, tuple)):
            row["assumptions"] = [str(x) for x in a if x]
        if c.get("facts_from"):
            row.setdefault("assumptions", []).append(f"facts from {c['facts_from']}")
        out.append(row)
    return out


def top_window(points: list[dict]) -> Window | None:
    """The measured window of the highest-concurrency ok sweep point."""
    best = None
    for p in points:
        w = window_of(p)
        if w is None or (p.get("status") or "ok") != "ok":
            continue
        if best is None or (w.concurrency or 0) >= (best.concurrency or 0):
            best = w
    return best


def observed_capacity(ss: SeriesSet, window: Window | None) -> pd.DataFrame:
    """Per decode/agg endpoint: vLLM's own num_gpu_blocks × block_size (cache_config_info,
    else the stats log's num_gpu_blocks line) and, at the top sweep point, the requests
    running when KV usage peaked — the stats log's `GPU KV cache usage` and `Running` (else
    /metrics). At ≥ FULL_KV usage that count is what the cache held; below, it is scaled by
    1 ÷ usage (an extrapolation, said so in `how`)."""
    cols = ["endpoint", "role", "engines", "blocks_per_rank", "block_size", "kv_tokens_per_rank",
            "kv_peak", "running_at_peak", "per_rank", "per_endpoint", "how", "source"]
    cap = kv_capacity(ss)
    rows: dict[str, dict[str, Any]] = {}
    for ep, g in cap[cap["role"].isin(["decode", "agg"])].groupby("endpoint"):
        rows[ep] = {"endpoint": ep, "role": g["role"].iloc[0], "engines": len(g),
                    "blocks_per_rank": float(g["num_gpu_blocks"].median()),
                    "block_size": float(g["block_size"].median()),
                    "kv_tokens_per_rank": float(g["capacity_tokens"].median())}
    lb = ss.select("log:num_gpu_blocks")
    for ep, g in lb[lb["role"].isin(["decode", "agg"])].groupby("endpoint"):
        if ep not in rows or not math.isfinite(rows[ep].get("blocks_per_rank", math.nan)):
            vals = [ss.val[ss.off[i + 1] - 1] for i in g.index if ss.off[i + 1] > ss.off[i]]
            if vals:
                rows.setdefault(ep, {"endpoint": ep, "role": g["role"].iloc[0]})
                rows[ep]["blocks_per_rank"] = float(np.median(vals))
    if window is not None:
        for usage_name, run_name, scale, source in (
                ("log:kv_cache_usage_pct", "log:running_reqs", 0.01, "stats log"),
                ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", 1.0, "/metrics")):
            u = ss.select(usage_name)
            u = u[u["role"].isin(["decode", "agg"])]
            r = ss.select(run_name)
            if u.empty or r.empty:
                continue
            r_ids = {(p, e): i for i, p, e in zip(r.index, r["process"], r["engine"],
                                                  strict=True)}
            per_ep: dict[str, list[tuple[float, float]]] = {}
            for i, proc, eng, ep in zip(u.index, u["process"], u["engine"], u["endpoint"],
                                        strict=True):
                ri = r_ids.get((proc, eng))
                if ri is None:
                    continue
                lo, hi = ss.off[i], ss.off[i + 1]
                t, v = ss.ts[lo:hi], ss.val[lo:hi]
                inside = (t >= window.start) & (t <= window.end)
                if not inside.any():
                    continue
                k = int(np.argmax(np.where(inside, v, -np.inf)))
                peak = float(v[k]) * scale
                running = float(ss.values_at([ri], np.array([t[k]]))[0, 0])
                if math.isfinite(running) and peak > 0:
                    per_ep.setdefault(ep, []).append((peak, running))
            if not per_ep:
                continue
            for ep, pairs in per_ep.items():
                row = rows.setdefault(ep, {"endpoint": ep, "role": str(
                    u.loc[u["endpoint"] == ep, "role"].iloc[0])})
                peaks = np.array([p for p, _ in pairs])
                runs = np.array([x for _, x in pairs])
                # a full cache holds what runs; a fuller one would hold running ÷ usage
                per_rank = np.where(peaks >= FULL_KV, runs, runs / np.maximum(peaks, 1e-9))
                n_full = int((peaks >= FULL_KV).sum())
                at = f"c={window.concurrency:.0f}"
                if n_full == len(peaks):
                    how = (f"KV full (≥ {FULL_KV:.0%}) on every DP rank at {at}: the "
                           "requests running then")
                elif n_full == 0:
                    how = (f"extrapolated: running ÷ KV usage (peak {peaks.max():.0%} at "
                           f"{at})")
                else:
                    how = (f"KV full (≥ {FULL_KV:.0%}) on {n_full} of {len(peaks)} DP ranks "
                           f"at {at} (the requests running then); running ÷ KV usage on the "
                           "others")
                row.update({
                    "engines": row.get("engines") or len(pairs),
                    "kv_peak": float(peaks.max()), "running_at_peak": float(np.median(runs)),
                    # per rank = the endpoint's figure ÷ its ranks, so the two always agree
                    "per_rank": float(per_rank.mean()),
                    "per_endpoint": float(per_rank.sum()),
                    "how": how,
                    "source": source})
            break  # the stats log wins when it has the numbers
    df = pd.DataFrame(list(rows.values()), columns=cols)
    return df.sort_values("endpoint").reset_index(drop=True)
