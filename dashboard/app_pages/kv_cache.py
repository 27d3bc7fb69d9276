"""KV cache: usage per endpoint and engine over time, capacity, waiting by reason,
preemptions, prompt tokens by source, and NIXL transfers."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from launcher.analysis import agentic, derive, diagnose, load
from launcher.run import figures
from launcher.run.rundir import RunDir

info = ui.header("KV cache")
if info is None:
    st.stop()


@st.cache_data(max_entries=16, show_spinner="Binning KV series…")
def page_data(path: str, tel_fp: str, plan_fp: str, t0: float, t1: float,
              step: float) -> dict:
    # The SeriesSet comes from the shared resource cache; this caches the binned frames.
    ss = ui.series_for(path, tel_fp, "kv", plan_fp)
    return derive.kv_page_data(ss, t0, t1, step)


def flat_note(df, what: str, unit: str) -> bool:
    """Say "constant" in words instead of drawing a flat line (srt-slurm's rule)."""
    if df is None or df.empty:
        st.caption(f"{what}: no samples in this range.")
        return True
    lo, hi = float(df["value"].min()), float(df["value"].max())
    if hi - lo < 1e-12:
        st.caption(f"{what}: constant {lo:,.4g} {unit} for the whole range.")
        return True
    return False


def capacity_section(info, ss: derive.SeriesSet, cap) -> None:
    """Predicted (plan.json's capacity estimate) vs observed (vLLM's num_gpu_blocks and the
    requests running when KV usage peaked at the top sweep point) KV capacity."""
    st.subheader("KV capacity: predicted vs observed")
    plan = ui.plan(info)
    if plan is None:
        ui.plan_damaged(info, "The predicted KV capacity")
    pred = derive.predicted_capacity(plan.capacity if plan else [], plan)
    obs = derive.observed_capacity(ss, derive.top_window(ui.bench(info)))
    endpoints = sorted({p["endpoint"] for p in pred} | set(obs["endpoint"]))
    if not endpoints:
        st.info("Neither a prediction (plan.json `capacity` is empty) nor an observation "
                "(no vllm:cache_config_info, no KV usage at the top sweep point) to show.")
        return
    by_pred = {p["endpoint"]: p for p in pred}
    by_obs = {r["endpoint"]: r for r in obs.to_dict("records")}

    def n(v, fmt=",.0f") -> str | None:
        return None if v is None or v != v else format(v, fmt)

    quantities = (  # (row title, value per endpoint from its predicted p and observed o)
        ("concurrent requests, predicted (plan.json)", lambda p, o: n(p.get("per_endpoint"))),
        ("concurrent requests, observed (top sweep point)",
         lambda p, o: n(o.get("per_endpoint"))),
        ("per DP rank, predicted", lambda p, o: n(p.get("per_rank"), ",.1f")),
        ("per DP rank, observed", lambda p, o: n(o.get("per_rank"), ",.1f")),
        ("predicted if every request reaches its max length",
         lambda p, o: n(p.get("per_endpoint_at_max_length"))),
        ("tokens per request the prediction assumes",
         lambda p, o: n(p.get("tokens_per_request"))),
        ("KV blocks per DP rank, predicted", lambda p, o: n(p.get("blocks_per_rank"))),
        ("KV blocks per DP rank, vLLM (num_gpu_blocks)",
         lambda p, o: n(o.get("blocks_per_rank"))),
        ("block size (tokens)", lambda p, o: n(o.get("block_size") or p.get("block_size"))),
        ("KV tokens per DP rank, vLLM", lambda p, o: n(o.get("kv_tokens_per_rank"))),
        ("KV usage peak at the top sweep point", lambda p, o: n(o.get("kv_peak"), ".0%")),
    )
    rows, bars = [], []
    for title, fn in quantities:
        vals = {ep: fn(by_pred.get(ep, {}), by_obs.get(ep, {})) for ep in endpoints}
        if any(v is not None for v in vals.values()):
            rows.append({"": title, **{ep: v or "—" for ep, v in vals.items()}})
    for ep in endpoints:
        for src, v in (("predicted (plan.json)", by_pred.get(ep, {}).get("per_endpoint")),
                       ("observed (top sweep point)", by_obs.get(ep, {}).get("per_endpoint"))):
            if v is not None and v == v:
                bars.append({"endpoint": ep, "source": src, "value": float(v)})
    ui.text_table(pd.DataFrame(rows))
    if bars and len({b["source"] for b in bars}) > 1:
        ui.altair(charts.capacity_bars(pd.DataFrame(bars)))
    notes = []
    if not pred:
        notes.append("No prediction: plan.json's `capacity` list is empty (the planner had "
                     "no model facts to estimate from, e.g. a simulated model).")
    for p in pred:
        if p.get("per_rank_derived"):
            notes.append(f"{p['endpoint']}: predicted per DP rank = the endpoint figure ÷ DP.")
        for a in p.get("assumptions", []):
            notes.append(f"{p['endpoint']} prediction assumes: {a}")
    for o in obs.to_dict("records"):
        if isinstance(o.get("how"), str):
            notes.append(f"{o['endpoint']} observed ({o['source']}): {o['how']}; when KV "
                         f"usage peaked the median DP rank was running "
                         f"{o['running_at_peak']:.0f} requests (the figures above are per "
                         "rank and their sum over the endpoint's ranks).")
    if obs.empty or obs["blocks_per_rank"].isna().all():
        notes.append("vLLM's num_gpu_blocks unknown: vllm:cache_config_info was not scraped "
                     "and no stats-log line gave it.")
    else:
        notes.append("vLLM blocks per rank: num_gpu_blocks of vllm:cache_config_info (the "
                     "engine's own allocation); KV tokens = blocks × block size.")
    for n in notes:
        st.markdown(f"- {n}")


def agentic_point(info, ss: derive.SeriesSet, step: float, clk) -> None:
    """An agentic point on one time axis (docs/agentic.md): the KV use, the prefix-cache hit
    rate of the engines holding the sessions' prefixes and the queue, with the capacity
    cliff's evidence (KV pinned full while hits fall and the queue grows) marked."""
    ag = ui.agentic(info)
    if ag is None:
        return
    points = {derive.point_label(p): p for p in ui.bench(info)
              if isinstance(p.get("agentic"), dict) and derive.window_of(p)}
    if not points:
        return
    st.subheader("Agentic point: KV use, prefix hits and queue")
    cliff = [v.point for v in ui.verdicts(info) if v.kind == diagnose.KV_CLIFF]
    names = list(points)
    pick = st.selectbox("Point", names, key="kv_agentic_point",
                        index=names.index(cliff[0]) if cliff and cliff[0] in names
                        else len(names) - 1)
    p = points[pick]
    offered = figures.offered_hit_rate(p["agentic"])
    th = diagnose.Thresholds()
    tl = agentic.point_timeline(ss, derive.window_of(p), sorted(set(ag.roles.values())),
                                ag.holder, offered, th.kv_full, step)
    if tl["frame"].empty:
        st.info(f"{pick}: no KV, prefix-cache or queue samples inside the point's window "
                "(the telemetry missed it).")
        return
    spans = pd.DataFrame(tl["full_spans"], columns=["start", "end"])
    ui.altair(charts.point_timeline(
        tl["frame"], spans, offered=offered, kv_full=th.kv_full, clock=clk,
        title=f"{pick}: KV use, prefix hits and queue ({tl['bin_s']:g} s bins; shaded: "
              f"{tl['holder']} KV ≥ {th.kv_full:.0%})"))
    said = agentic.timeline_evidence(tl)
    if pick in cliff:
        st.warning(f"{pick}: KV capacity cliff. " + "; ".join(said) + ".")
    elif said:
        st.caption("; ".join(said) + ".")
    else:
        st.caption(f"{tl['holder']} KV stayed under {th.kv_full:.0%} through the point: "
                   "no capacity cliff.")
    st.caption("Over the point's measured window: KV use of the fullest engine per role, the "
               f"prefix-cache hit rate of the {tl['holder']} engines per bin "
               "(Δvllm:prefix_cache_hits ÷ Δqueries), requests waiting per role (right axis, "
               "dashed); dashed rules: the KV-full line and the hit rate the trace offers.")


def body(info) -> None:  # the run as re-read at each live refresh
    if ui.no_telemetry(info, "KV-cache telemetry"):
        if info.state != "empty":  # a planned run still has the planner's estimate
            capacity_section(info, derive.SeriesSet(pd.DataFrame(), ui.plan(info)), None)
        return
    ss = ui.series(info, "kv")
    if len(ss) == 0:
        st.info("Telemetry exists but holds no vLLM /metrics samples: the agents wrote GPU "
                "and host samples only (scrape targets unreachable?). See the gaps on the "
                "GPUs and hosts page and the agent logs.")
        return
    plan = ui.plan(info)
    step = plan.telemetry_interval_s if plan else 1.0
    t0, t1 = ss.t_range
    wins = ui.windows_frame(info)
    choices = {"whole run": (t0, t1)}
    for p in ui.bench(info):
        w = derive.window_of(p)
        if w:
            choices[f"sweep point {w.label}"] = (w.start, w.end)
    pick = st.selectbox("Time range", list(choices), key="kv_range")
    a, b = choices[pick]
    data = page_data(str(info.path), load.telemetry_fingerprint(info.path),
                     load.fingerprint(RunDir(info.path).plan), a, b, step)
    bin_s = data["bin_s"]
    wins = wins if pick == "whole run" else None
    clk = ui.clock(info)
    n_vllm = int(ss.meta["name"].str.startswith("vllm:").sum())
    st.caption(f"{n_vllm:,} vLLM series · drawn in {bin_s:g} s bins (bin means of gauges, "
               "rates of counters) · shaded: the sweep points' measured windows.")

    st.subheader("KV cache usage")
    if "kv_spread" in data:
        by = data.get("kv_spread_by", "endpoint")
        ui.altair(charts.spread(data["kv_spread"], title=f"KV cache usage per {by}: "
                                "min–max band across engines, line = mean (red: 90 %)",
                                y_title="KV cache usage", windows=wins, color_title=by, clock=clk))
        heat = data["kv_heat"]
        role = st.radio("Engines", ["decode", "prefill", "all"], horizontal=True,
                        key="kv_heat_role")
        h = heat if role == "all" else heat[heat["role"] == role]
        if h.empty:
            st.info(f"No {role} engines report KV usage.")
        else:
            ui.altair(charts.heatmap(h, title=f"KV cache usage per engine ({role}), "
                                     f"{bin_s:g} s bins", y="engine_key",
                                     color_title="KV usage", bin_s=bin_s, clock=clk))
    else:
        st.info("No vllm:kv_cache_usage_perc samples (older vLLM names are mapped by the "
                "scraper; none were found).")
    agentic_point(info, ss, step, clk)
    capacity_section(info, ss, data.get("capacity"))

    st.subheader("Scheduler: waiting, running, preemptions")
    c1, c2 = st.columns(2)
    by = data.get("group_by", "endpoint")
    with c1:
        if "waiting" in data:
            if not flat_note(data["waiting"], "Requests waiting", "requests"):
                ui.altair(charts.line(data["waiting"], title="Requests waiting, by role and "
                                      "reason", y_title="requests", color_title="role · reason",
                                      windows=wins, clock=clk))
                st.caption("capacity = no KV room or batch slot; deferred = held back, e.g. "
                           "for a KV transfer")
        else:
            st.info("No waiting-request gauges.")
    with c2:
        if "running" in data and not flat_note(data["running"], "Requests running",
                                                "requests"):
            ui.altair(charts.line(data["running"], title=f"Requests running per {by}",
                                  y_title="requests", color_title=by, windows=wins, clock=clk))
    c3, c4 = st.columns(2)
    with c3:
        if "preempt" in data:
            total = data.get("preempt_total", 0.0)
            if total > 0:
                ui.altair(charts.line(data["preempt"], title=f"Preemptions per second per "
                                      f"{by} ({total:,.0f} in this range)",
                                      y_title="preemptions/s", color_title=by, windows=wins, clock=clk))
            else:
                st.success("No preemptions in this range (vllm:num_preemptions_total constant)"
                           ": KV capacity never forced a request out.")
    with c4:
        if "kv_fetch" in data and not flat_note(data["kv_fetch"], "Decode requests waiting "
                                                 "on KV loads", "requests"):
            ui.altair(charts.line(data["kv_fetch"], title="Decode requests waiting on KV "
                                  "loads, by stage", y_title="requests", color_title="stage",
                                  windows=wins, stacked=True, clock=clk))
        elif "kv_fetch" not in data:
            st.caption("No vllm:num_requests_kv_fetch_by_stage (KV consumer metric) samples.")
    sources = data.get("sources") or {}
    if sources:
        roles = sorted(sources, key=lambda r: r != "prefill")  # prefill first, as P -> D
        for col, role in zip(st.columns(len(roles)), roles, strict=True):
            frame = sources[role]
            with col:
                ui.altair(charts.line(frame, title=f"Prompt tokens by source, {role}",
                                      y_title="tokens/s", color_title="source", windows=wins,
                                      stacked=True, clock=clk))
        st.caption("local_compute = computed here, local_cache_hit = a prefix-cache hit, "
                   "external_kv_transfer = received by KV transfer (a decode's share of the "
                   "prompts the prefill computed)")

    st.subheader("NIXL KV transfer (decode side)")
    if not any(k in data for k in ("nixl_time_ms", "nixl_bytes", "nixl_rate")):
        st.info("No NIXL metrics: this run has no KV transfer (aggregated mode) or the "
                "decode endpoints were not scraped.")
        return
    n1, n2 = st.columns(2)
    with n1:
        if "nixl_time_ms" in data:
            ui.altair(charts.line(data["nixl_time_ms"], title="Mean NIXL transfer time "
                                  "(Δsum/Δcount per bin)", y_title="ms per transfer",
                                  color_title="endpoint", windows=wins, clock=clk))
    with n2:
        if "nixl_bytes" in data:
            ui.altair(charts.line(data["nixl_bytes"], title="NIXL bytes transferred",
                                  y_title="GB/s", color_title="endpoint", windows=wins, clock=clk))
    n3, n4 = st.columns(2)
    with n3:
        if "nixl_rate" in data:
            ui.altair(charts.line(data["nixl_rate"], title="NIXL transfers per second",
                                  y_title="transfers/s", color_title="endpoint", windows=wins, clock=clk))
    with n4:
        fails = data.get("nixl_fail")
        totals = {k.split(":", 1)[1]: v for k, v in data.items() if k.startswith("total:")}
        if fails is not None and sum(totals.values()) > 0:
            # the kinds (failed transfers, expired leases) are the legend's
            ui.altair(charts.line(fails, title="NIXL failures per bin, by kind",
                                  y_title=f"count per {bin_s:g} s",
                                  color_title="kind", windows=wins, clock=clk))
        else:
            st.success("No failed NIXL transfers and no expired KV leases in this range.")
    st.caption("NIXL pools all TP ranks' transfers before observing them: counts are "
               "rank-level (≈ requests × ranks) and the time is per rank-level transfer "
               "(vLLM #41230). Transport failures and KV-lease expiry are different problems "
               "(vLLM #55854): expiry means decode pulled too late.")


ui.live(info, body)
