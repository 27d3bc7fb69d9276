"""Where each prompt token came from, and the health of the KV store behind it.

Pure (pandas over a `derive.SeriesSet`), below the dashboard and the report. The facts it
relies on, with their sources, are in docs/kv-store.md ("Where each prompt token came from"):

- vLLM 0.33 counts every prompt token once in `vllm:prompt_tokens_by_source{source=
  local_compute|local_cache_hit|external_kv_transfer}`; "external" mixes a P->D handoff with
  a store or offload hit. `vllm:prompt_tokens_cached_by_source{source=device|host|p2p|disk|
  external_unspecified}` splits the cached ones by the tier that supplied them: NixlConnector
  labels its tokens p2p, the CPU offload connectors host (disk), and MooncakeStoreConnector
  sets no tier, so its hits are external_unspecified. That counter is the split; without it
  (older vLLM) the external tokens are a handoff only where the run has no store or offload.
- Store traffic: `vllm:mooncake_store_operation_*{operation,status}`; offload traffic in the
  flat 0.33 names (`vllm:kv_offload_store_*` GPU->CPU, `vllm:kv_offload_load_*` CPU->GPU) or
  the deprecated `vllm:kv_offload_total_*{transfer_type}`, which 0.33 still emits beside them
  for the same bytes: one or the other per engine, never both.
- The master: `master_allocated_bytes` against `master_total_capacity_bytes` and its
  `--eviction_high_watermark_ratio` (a flag, not a metric: read from its argv in plan.json),
  evictions, puts refused for space.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from launcher.analysis import derive
from launcher.analysis.diagnose import Thresholds
from launcher.run.plandoc import PlanDoc
from launcher.run.vocab import Kind

SOURCES = ("local_hit", "handoff", "store_hit", "offload_hit", "external", "computed")
SOURCE_TITLES = {
    "local_hit": "local prefix-cache hit",
    "handoff": "P→D handoff",
    "store_hit": "KV store hit",
    "offload_hit": "CPU offload hit",
    "external": "external, not split",
    "computed": "computed",
}
# vLLM 0.33's CacheHitSource values -> ours
CACHED_SOURCE = {"device": "local_hit", "p2p": "handoff", "host": "offload_hit",
                 "disk": "offload_hit", "external_unspecified": "store_hit"}
BY_SOURCE = {"local_compute": "computed", "local_cache_hit": "local_hit",
             "external_kv_transfer": "external"}

BY_SOURCE_NAME = "vllm:prompt_tokens_by_source_total"
# (name, our sources it adds to, sign): computed = queries - hits - external hits
PREFIX_COUNTERS = (("vllm:prefix_cache_queries_total", ("computed",), 1.0),
                   ("vllm:prefix_cache_hits_total", ("local_hit",), 1.0),
                   ("vllm:prefix_cache_hits_total", ("computed",), -1.0),
                   ("vllm:external_prefix_cache_hits_total", ("external",), 1.0),
                   ("vllm:external_prefix_cache_hits_total", ("computed",), -1.0))
CACHED_NAME = "vllm:prompt_tokens_cached_by_source_total"
STORE_OP = "vllm:mooncake_store_operation"
OPERATIONS = ("load_get", "save_put", "lookup_exists", "save_exists")
# (direction, flat 0.33 name, deprecated name's transfer_type)
OFFLOAD = (("gpu_to_cpu", "vllm:kv_offload_store", "GPU_to_CPU"),
           ("cpu_to_gpu", "vllm:kv_offload_load", "CPU_to_GPU"))
WATERMARK_FLAG = "eviction_high_watermark_ratio"
WATERMARK_DEFAULT = 0.9  # mooncake_master 0.3.13.post1 --help
TIER_CONNECTORS = ("MooncakeStoreConnector", "OffloadingConnector",
                   "SimpleCPUOffloadConnector", "--kv-offloading-size")

VERDICTS = {
    "store-full": "KV store full: puts refused",
    "store-evicting": "KV store evicting",
    "store-slow": "KV store slower than recomputing",
    "offload-slow": "CPU offload slower than recomputing",
    "store-failing": "KV store failing keys",
    "offload-full": "CPU offload full: stores refused",
}


# --- the plan -------------------------------------------------------------------------------


def has_tiers(plan: PlanDoc | None) -> bool:
    """Whether a store or a CPU offload tier could have supplied prompt tokens."""
    if plan is None:
        return True  # not known: the external tokens are left unsplit
    if plan.processes_of_kind(Kind.STORE):
        return True
    return any(c in a for p in plan.processes_of_kind(Kind.ENGINE) for a in p.argv
               for c in TIER_CONNECTORS)


def watermark(plan: PlanDoc | None) -> float:
    """The master's eviction watermark: the last value its argv gives (gflags keeps the
    last), else the master's default."""
    found = WATERMARK_DEFAULT
    for p in plan.processes_of_kind(Kind.STORE) if plan else []:
        argv = list(p.argv)
        for i, a in enumerate(argv):
            name, eq, val = a.lstrip("-").partition("=")
            if name != WATERMARK_FLAG or not a.startswith("-"):
                continue
            if not eq:
                val = argv[i + 1] if i + 1 < len(argv) else ""
            try:
                found = float(val)
            except ValueError:
                continue
    return found


# --- tokens by source ------------------------------------------------------------------------


def _by_label(ss: derive.SeriesSet, name: str, key: str, a: float, b: float) -> pd.DataFrame:
    """Counter increase over [a, b] per (engine_key, label value)."""
    sel = ss.select(name)
    if sel.empty:
        return pd.DataFrame(columns=["engine_key", "endpoint", "engine", "role", "label",
                                     "tokens"])
    out = sel[["engine_key", "endpoint", "engine", "role"]].copy()
    out["label"] = ss.label_values(sel.index, key)
    out["tokens"] = ss.increase(sel.index, a, b)
    return out.reset_index(drop=True)


def _totals(ss: derive.SeriesSet, name: str, a: float, b: float) -> pd.DataFrame:
    """Counter increase over [a, b] per engine."""
    sel = ss.select(name)
    out = sel[["engine_key", "endpoint", "engine", "role"]].copy()
    out["tokens"] = ss.increase(sel.index, a, b) if len(sel) else []
    return out.groupby(["engine_key", "endpoint", "engine", "role"], as_index=False,
                       observed=True)["tokens"].sum()


def engine_sources(ss: derive.SeriesSet | None, a: float, b: float,
                   tiers: bool = True) -> pd.DataFrame:
    """Per engine over [a, b]: prompt tokens by where they came from (SOURCES), their total
    and `split`: "tier" when vLLM's cached-by-source counter split them, "handoff" when the
    run has no store or offload (the external tokens can only be a handoff), "none" when the
    external tokens stay unsplit."""
    cols = ["engine_key", "endpoint", "engine", "role", *SOURCES, "total", "split"]
    if ss is None or len(ss) == 0:
        return pd.DataFrame(columns=cols)
    by = _by_label(ss, BY_SOURCE_NAME, "source", a, b)
    cached = _by_label(ss, CACHED_NAME, "source", a, b)
    rows: dict[str, dict[str, Any]] = {}

    def row(r) -> dict[str, Any]:
        return rows.setdefault(r.engine_key, {
            "engine_key": r.engine_key, "endpoint": r.endpoint, "engine": r.engine,
            "role": r.role, **dict.fromkeys(SOURCES, 0.0)})

    for r in by.itertuples():
        ours = BY_SOURCE.get(r.label)
        if ours is not None:
            row(r)[ours] += float(r.tokens)
    # A vLLM without the by-source counter: the prefix-cache counters say the same of new
    # requests (queries = the prompt, hits = local, external hits = from a connector)
    counted = set(rows)
    for name, ours, sign in PREFIX_COUNTERS:
        for r in _totals(ss, name, a, b).itertuples():
            if r.engine_key not in counted:
                row(r)
                for o in ours:
                    rows[r.engine_key][o] += sign * float(r.tokens)
    tier = {}  # engine_key -> {our tier: tokens vLLM attributed to it}
    for r in cached.itertuples():
        ours = CACHED_SOURCE.get(r.label)
        if ours is not None and ours != "local_hit":  # device: local_cache_hit's tokens
            d = tier.setdefault(r.engine_key, dict.fromkeys(("handoff", "store_hit",
                                                              "offload_hit"), 0.0))
            d[ours] += float(r.tokens)
    for key, d in rows.items():
        named = tier.get(key)
        if named is not None and sum(named.values()) > 0:
            # The external tokens split in the tiers' proportions: the two counters count
            # the same tokens at admission and at prefill's end, so over a window they differ
            # by the requests in flight at its edges; the prompt total stays the one counter's.
            whole = sum(named.values())
            for s, v in named.items():
                d[s] = d["external"] * v / whole
            d["external"], d["split"] = 0.0, "tier"
        elif named is not None:
            d["split"] = "tier"  # vLLM split them; what is left came in at the window's edge
        elif not tiers:
            d["handoff"], d["external"], d["split"] = d["external"], 0.0, "handoff"
        else:
            d["split"] = "none"
        d["computed"] = max(d["computed"], 0.0)
        d["total"] = sum(d[s] for s in SOURCES)
    out = pd.DataFrame(list(rows.values()), columns=cols)
    return out.sort_values("engine_key", key=lambda s: s.map(derive._natural)
                           ).reset_index(drop=True)


def point_sources(points: list[dict], ss: derive.SeriesSet | None,
                  plan: PlanDoc | None) -> pd.DataFrame:
    """Per sweep point and engine: tokens by source over the point's measured window."""
    tiers = has_tiers(plan)
    frames = []
    for p in points:
        w = derive.window_of(p)
        if w is None:
            continue
        f = engine_sources(ss, w.start, w.end, tiers)
        if len(f):
            frames.append(f.assign(point=w.label, concurrency=w.concurrency))
    if not frames:
        return pd.DataFrame(columns=["point", "concurrency", "engine_key", "endpoint", "engine",
                                     "role", *SOURCES, "total", "split"])
    return pd.concat(frames, ignore_index=True)


def first_role(df: pd.DataFrame) -> str | None:
    """The role whose engines first see each prompt: prefill in P/D, else agg."""
    roles = set(df["role"]) if len(df) else set()
    for r in ("prefill", "agg", "decode"):
        if r in roles:
            return r
    return None


def reuse(points: list[dict], ss: derive.SeriesSet | None,
          plan: PlanDoc | None) -> pd.DataFrame:
    """Per point: the share of prompt tokens served from each cache tier on the engines that
    first see the prompts, beside the trace's theoretical hit rate (agentic points)."""
    ps = point_sources(points, ss, plan)
    theo = {derive.point_label(p): derive.prefix_reuse(p)["hit_theoretical"] for p in points}
    rows = []
    for label, g in ps.groupby("point", sort=False):
        role = first_role(g)
        mine = g[g["role"] == role]
        total = float(mine["total"].sum())
        share = {s: (float(mine[s].sum()) / total if total > 0 else float("nan"))
                 for s in SOURCES}
        rows.append({"point": label, "concurrency": float(g["concurrency"].iloc[0]),
                     "role": role, "tokens": total, **{f"{s}_share": v for s, v in share.items()},
                     "achieved": share["local_hit"] + share["store_hit"] + share["offload_hit"],
                     "theoretical": theo.get(label, float("nan"))})
    return pd.DataFrame(rows)


# --- store, offload and master health ---------------------------------------------------------


def _total(ss: derive.SeriesSet, name: str, a: float, b: float, **labels: str) -> float:
    ids = ss.select(name, **labels).index
    return float(ss.increase(ids, a, b).sum()) if len(ids) else float("nan")


def _quantile(ss: derive.SeriesSet, name: str, a: float, b: float, q: float,
              **labels: str) -> float:
    """A histogram's quantile over [a, b], its buckets summed over engines and statuses."""
    ids = ss.select(name, **labels).index
    if len(ids) == 0:
        return float("nan")
    per_le = pd.Series(ss.increase(ids, a, b)).groupby(
        np.array(ss.label_values(ids, "le"))).sum()
    return derive.hist_quantile(list(per_le.index), per_le.to_numpy(), q)


def _gauge_max(ss: derive.SeriesSet, name: str, a: float, b: float) -> float:
    ids = ss.select(name).index
    if len(ids) == 0:
        return float("nan")
    grid = np.linspace(a, b, 50)
    vals = np.concatenate([ss.rows_in(ids, a, b), ss.values_at(ids, grid).ravel()])
    vals = vals[~np.isnan(vals)]
    return float(vals.max()) if len(vals) else float("nan")


def _used_max(ss: derive.SeriesSet, a: float, b: float) -> float:
    """The peak of allocated ÷ capacity (both gauges at the same instants)."""
    al, cap = ss.select("master_allocated_bytes").index, ss.select(
        "master_total_capacity_bytes").index
    if len(al) == 0 or len(cap) == 0:
        return float("nan")
    lo, hi = ss.off[al[0]], ss.off[al[0] + 1]
    t = ss.ts[lo:hi]
    grid = np.unique(np.concatenate([np.linspace(a, b, 50), t[(t >= a) & (t <= b)]]))
    used = np.nansum(ss.values_at(al, grid), axis=0)
    capv = np.nansum(ss.values_at(cap, grid), axis=0)
    ratio = np.where(capv > 0, used / np.where(capv > 0, capv, 1), np.nan)
    return float(np.nanmax(ratio)) if not np.isnan(ratio).all() else float("nan")


def store_health(ss: derive.SeriesSet | None, a: float, b: float,
                 plan: PlanDoc | None = None) -> dict[str, float]:
    """The store's, the offload tier's and the master's figures over [a, b] (NaN: absent)."""
    out: dict[str, float] = {}
    if ss is None or len(ss) == 0:
        return out
    for op in OPERATIONS:
        calls = _total(ss, f"{STORE_OP}_total", a, b, operation=op)
        if math.isnan(calls):
            continue
        t = _total(ss, f"{STORE_OP}_time_seconds_sum", a, b, operation=op)
        n = _total(ss, f"{STORE_OP}_time_seconds_count", a, b, operation=op)
        out[f"{op}_calls"] = calls
        out[f"{op}_keys"] = _total(ss, f"{STORE_OP}_keys_total", a, b, operation=op)
        out[f"{op}_bytes"] = _total(ss, f"{STORE_OP}_bytes_total", a, b, operation=op)
        out[f"{op}_failed_keys"] = _total(ss, f"{STORE_OP}_failed_keys_total", a, b,
                                          operation=op)
        out[f"{op}_errors"] = _total(ss, f"{STORE_OP}_total", a, b, operation=op,
                                     status="error")
        out[f"{op}_time_s"] = t
        out[f"{op}_mean_s"] = t / n if n > 0 else float("nan")
        out[f"{op}_p90_s"] = _quantile(ss, f"{STORE_OP}_time_seconds_bucket", a, b, 0.9,
                                       operation=op)
    flat = any(len(ss.select(f"{base}_bytes_total")) for _, base, _ in OFFLOAD)
    for way, base, ttype in OFFLOAD:
        if flat:
            out[f"offload_{way}_bytes"] = _total(ss, f"{base}_bytes_total", a, b)
            out[f"offload_{way}_s"] = _total(ss, f"{base}_time_total", a, b)
        else:
            out[f"offload_{way}_bytes"] = _total(ss, "vllm:kv_offload_total_bytes_total", a, b,
                                                 transfer_type=ttype)
            out[f"offload_{way}_s"] = _total(ss, "vllm:kv_offload_total_time_total", a, b,
                                             transfer_type=ttype)
    out["offload_refused"] = _total(ss, "vllm:kv_offload_allocation_failure_total", a, b)
    out["master_capacity_bytes"] = _gauge_max(ss, "master_total_capacity_bytes", a, b)
    if not math.isnan(out["master_capacity_bytes"]):
        out["master_allocated_max_bytes"] = _gauge_max(ss, "master_allocated_bytes", a, b)
        out["master_used_max"] = _used_max(ss, a, b)
        out["master_watermark"] = watermark(plan)
        out["master_keys_max"] = _gauge_max(ss, "master_key_count", a, b)
        for key, name in (("evicted_keys", "master_evicted_key_count"),
                          ("evicted_bytes", "master_evicted_size_bytes"),
                          ("evictions", "master_successful_evictions_total"),
                          ("eviction_attempts", "master_attempted_evictions_total"),
                          ("puts", "master_put_start_requests_total"),
                          ("puts_refused", "master_put_start_alloc_failures_total"),
                          ("gets", "total_get_nums_"), ("gets_found", "valid_get_nums_")):
            out[f"master_{key}"] = _total(ss, name, a, b)
    return out


def compute_per_token_s(ss: derive.SeriesSet, sources: pd.DataFrame, a: float, b: float
                        ) -> float:
    """Seconds of prefill per computed token on the engines that compute prompts
    (vllm:request_prefill_time_seconds ÷ their computed tokens)."""
    role = first_role(sources)
    if role is None:
        return float("nan")
    t = float(ss.increase(ss.select("vllm:request_prefill_time_seconds_sum", role).index,
                          a, b).sum())
    computed = float(sources[sources["role"] == role]["computed"].sum())
    return t / computed if computed > 0 and t > 0 else float("nan")


def _gib(x: float) -> str:
    return f"{x / 2**30:,.2f} GiB" if x >= 2**26 else f"{x / 2**20:,.1f} MiB"


def verdicts(health: dict[str, float], sources: pd.DataFrame, compute_s: float,
             th: Thresholds | None = None) -> list[tuple[str, str, list[str]]]:
    """(kind, title, evidence) for a store that is full, evicting, failing keys, or slower
    than recomputing, over one window; [] for a healthy one (or none)."""
    th = th or Thresholds()
    out: list[tuple[str, str, list[str]]] = []
    h = health

    def f(k: str) -> float:
        v = h.get(k)
        return float(v) if isinstance(v, (int, float)) else float("nan")

    used, wm = f("master_used_max"), f("master_watermark")
    fill = (f"capacity used peaked at {used:.0%} of {_gib(f('master_capacity_bytes'))} "
            f"(master_allocated_bytes ÷ master_total_capacity_bytes; eviction watermark "
            f"{wm:.0%})") if not math.isnan(used) else ""
    refused = f("master_puts_refused")
    if refused > 0 or used >= th.store_full_used:
        ev = [x for x in (fill,) if x]
        if refused > 0:
            ev.append(f"{refused:,.0f} of {f('master_puts'):,.0f} puts refused for space "
                      "(master_put_start_alloc_failures_total): evicting could not make room, "
                      "e.g. every object still under its lease (--default_kv_lease_ttl)")
        out.append(("store-full", VERDICTS["store-full"], ev))
    if f("master_evicted_keys") > 0:
        ev = [f"{f('master_evicted_keys'):,.0f} keys ({_gib(f('master_evicted_bytes'))}) "
              f"evicted in {f('master_evictions'):,.0f} evictions (master_evicted_key_count, "
              "master_evicted_size_bytes): prefixes are being dropped to make room"]
        if fill:
            ev.append(fill)
        out.append(("store-evicting", VERDICTS["store-evicting"], ev))
    if f("offload_refused") > 0:
        out.append(("offload-full", VERDICTS["offload-full"], [
            f"{f('offload_refused'):,.0f} offload stores found no room in the CPU tier "
            "(vllm:kv_offload_allocation_failure): what the GPU evicts is lost"]))
    failed = sum(v for k, v in h.items() if k.endswith("_failed_keys") and v == v)
    if failed > 0:
        ev = [f"{h[k]:,.0f} failed keys in {k.removesuffix('_failed_keys')} "
              "(vllm:mooncake_store_operation_failed_keys_total)"
              for k in sorted(h) if k.endswith("_failed_keys") and h[k] > 0]
        out.append(("store-failing", VERDICTS["store-failing"], ev))
    for kind, tok, time_key, what in (
            ("store-slow", "store_hit", "load_get_time_s",
             "load_get time (vllm:mooncake_store_operation_time_seconds)"),
            ("offload-slow", "offload_hit", "offload_cpu_to_gpu_s",
             "CPU→GPU load time (vllm:kv_offload_load_time)")):
        hits = float(sources[tok].sum()) if len(sources) else 0.0
        t = f(time_key)
        if hits > 0 and t > 0 and compute_s > 0:
            per = t / hits
            if per > compute_s * th.store_slower:
                out.append((kind, VERDICTS[kind], [
                    f"{per * 1e3:.3f} ms per token loaded: {what} {t:,.2f} s over "
                    f"{hits:,.0f} hit tokens; recomputing took {compute_s * 1e3:.3f} ms per "
                    "token (vllm:request_prefill_time_seconds ÷ computed tokens)"]))
    return out


def point_health(points: list[dict], ss: derive.SeriesSet | None,
                 plan: PlanDoc | None, th: Thresholds | None = None) -> list[dict]:
    """Per sweep point: tokens by source summed per role, the store's health and its
    verdicts."""
    out = []
    tiers = has_tiers(plan)
    for p in points:
        w = derive.window_of(p)
        if w is None or ss is None:
            continue
        src = engine_sources(ss, w.start, w.end, tiers)
        h = store_health(ss, w.start, w.end, plan)
        comp = compute_per_token_s(ss, src, w.start, w.end) if len(src) else float("nan")
        out.append({"point": w.label, "concurrency": w.concurrency, "health": h,
                    "sources": src, "compute_per_token_s": comp,
                    "verdicts": verdicts(h, src, comp, th)})
    return out


# --- what the dashboard and the report draw ---------------------------------------------------


def sources_long(health: list[dict]) -> pd.DataFrame:
    """point, concurrency, role, source (its title), tokens, share of the role's prompt
    tokens, order: tokens by source per point and role, for stacked bars."""
    rows = []
    for h in health:
        src = h["sources"]
        for role, g in src.groupby("role", sort=False):
            total = float(g["total"].sum())
            for k, s in enumerate(SOURCES):
                v = float(g[s].sum())
                if v > 0:
                    rows.append({"point": h["point"], "concurrency": h["concurrency"],
                                 "role": role, "source": SOURCE_TITLES[s], "tokens": v,
                                 "share": v / total if total > 0 else float("nan"),
                                 "order": k})
    return pd.DataFrame(rows, columns=["point", "concurrency", "role", "source", "tokens",
                                       "share", "order"])


def health_rows(health: list[dict]) -> pd.DataFrame:
    """One row per point: the store's, the offload's and the master's figures that matter,
    in display units (GiB, ms, fractions); absent figures are NaN."""
    rows = []
    for h in health:
        x = h["health"]

        def g(k: str, scale: float = 1.0, x: dict = x) -> float:
            v = x.get(k)
            return float(v) * scale if isinstance(v, (int, float)) else float("nan")

        rows.append({
            "point": h["point"],
            "get_gib": g("load_get_bytes", 2.0**-30), "get_ms": g("load_get_mean_s", 1e3),
            "get_p90_ms": g("load_get_p90_s", 1e3),
            "put_gib": g("save_put_bytes", 2.0**-30), "put_ms": g("save_put_mean_s", 1e3),
            "lookup_ms": g("lookup_exists_mean_s", 1e3),
            "failed_keys": sum(v for k, v in x.items() if k.endswith("_failed_keys")
                               and v == v) if any(k.endswith("_failed_keys") for k in x)
            else float("nan"),
            "offload_out_gib": g("offload_gpu_to_cpu_bytes", 2.0**-30),
            "offload_in_gib": g("offload_cpu_to_gpu_bytes", 2.0**-30),
            "offload_refused": g("offload_refused"),
            "used_max": g("master_used_max"), "watermark": g("master_watermark"),
            "capacity_gib": g("master_capacity_bytes", 2.0**-30),
            "keys_max": g("master_keys_max"), "evicted_keys": g("master_evicted_keys"),
            "puts_refused": g("master_puts_refused"),
            "load_ms_per_token": (g("load_get_time_s", 1e3) / float(h["sources"]["store_hit"]
                                                                      .sum())
                                  if len(h["sources"]) and h["sources"]["store_hit"].sum() > 0
                                  else float("nan")),
            "compute_ms_per_token": h["compute_per_token_s"] * 1e3,
        })
    return pd.DataFrame(rows)


HEALTH_TITLES = {
    "get_gib": "store get GiB", "get_ms": "get ms/call", "get_p90_ms": "get p90 ms", "put_gib": "store put GiB",
    "put_ms": "put ms/call", "lookup_ms": "lookup ms/call", "failed_keys": "failed keys",
    "offload_out_gib": "offload GPU→CPU GiB", "offload_in_gib": "offload CPU→GPU GiB",
    "offload_refused": "offload stores refused",
    "used_max": "master used (peak)", "watermark": "eviction watermark",
    "capacity_gib": "master capacity GiB", "keys_max": "keys (peak)",
    "evicted_keys": "evicted keys", "puts_refused": "puts refused",
    "load_ms_per_token": "store ms per hit token",
    "compute_ms_per_token": "prefill ms per computed token",
}


def healthy_sentence(health: list[dict]) -> str:
    """What a store without verdicts did, in one sentence: only what was measured."""
    hits = sum(float(h["sources"][["store_hit", "offload_hit"]].to_numpy().sum())
               for h in health if len(h["sources"]))
    caps = [h["health"].get("master_capacity_bytes") for h in health]
    master = any(isinstance(c, float) and c == c for c in caps)
    said = ["failed no key"]
    if master:
        said.insert(0, "was never full, never evicted")
    said.append("loaded its hits faster than the prefill recomputes" if hits > 0 else
                "served no hit (nothing to compare with recomputing)")
    return "At every sweep point the store " + ", ".join(said[:-1]) + " and " + said[-1] + "."


# the health table in parts that fit a page's width
HEALTH_GROUPS = (
    ("The store's operations", ("get_gib", "get_ms", "get_p90_ms", "put_gib", "put_ms",
                                "lookup_ms", "failed_keys")),
    ("Loading against recomputing, offload traffic", (
        "load_ms_per_token", "compute_ms_per_token", "offload_out_gib", "offload_in_gib",
        "offload_refused")),
    ("The master", ("used_max", "watermark", "capacity_gib", "keys_max", "evicted_keys",
                    "puts_refused")),
)


def any_tier_data(health: list[dict]) -> bool:
    """Whether the run shows a store, an offload tier or a master at all."""
    return any(v == v for h in health for v in h["health"].values()) or any(
        len(h["sources"]) and (h["sources"][["store_hit", "offload_hit"]].to_numpy().sum() > 0)
        for h in health)
