"""TTFT breakdown per sweep point, and the bottleneck verdict with its evidence."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from launcher.analysis import agentic, derive, diagnose

info = ui.header("TTFT breakdown")
if info is None:
    st.stop()


def body(info) -> None:  # the run as re-read at each live refresh
    table = ui.points(info)
    if table.empty:
        st.info("No sweep results in bench/ yet, so there is no client TTFT to split.")
        return
    ok = table[table["status"] == "ok"]
    parts_cols = [f"{c}_s" for c in derive.TTFT_COMPONENTS]
    has_parts = not ok.empty and ok[parts_cols[:-1]].notna().any().any()
    if ok.empty:
        st.info("Every sweep point failed; there is no TTFT to split.")
    elif not has_parts:
        if not info.has_telemetry:
            st.info("No telemetry in this run: only the client TTFT is known, so it cannot "
                    "be split into engine-side parts.")
        else:
            st.info("The telemetry has no vLLM latency histograms inside the sweep points' "
                    "windows (queue, prefill, NIXL): the scrape missed them.")
    else:
        rows = []
        for r in ok.itertuples():
            for k, c in enumerate(derive.TTFT_COMPONENTS):
                v = getattr(r, f"{c}_s")
                if pd.notna(v):
                    rows.append({"point": r.point, "part": derive.COMPONENT_TITLES[c],
                                 "ms": max(float(v), 0.0) * 1000, "order": k,
                                 "share": float(v) / r.ttft_mean_s if r.ttft_mean_s else None})
        client = ok[["point"]].assign(ttft_mean_ms=ok["ttft_mean_s"] * 1000)
        ui.altair(charts.ttft_breakdown(pd.DataFrame(rows), client))
        show = ok[["point", "ttft_mean_s", *parts_cols, "decode_engine_ttft_s",
                   "kv_transfer_p99_s"]].copy()
        short = {"prefill_queue": "P queue", "prefill_compute": "P compute",
                 "kv_transfer": "KV transfer", "decode_admission": "D admission",
                 "remainder": "remainder"}  # short headers, ms in the caption: it fits 1440 px
        ms_cfg = {c: st.column_config.NumberColumn(short.get(c[:-2], c), format="%.0f",
                                                   help=derive.COMPONENT_TITLES.get(c[:-2]))
                  for c in parts_cols}
        for c in show.columns[1:]:
            show[c] = show[c] * 1000.0
        st.caption("Milliseconds, means per request (P = prefill, D = decode).")
        ui.table(show, column_config={
            "ttft_mean_s": st.column_config.NumberColumn(
                "client TTFT", format="%.0f", help="client mean TTFT"),
            "decode_engine_ttft_s": st.column_config.NumberColumn(
                "D TTFT", format="%.0f", help="decode engine's own mean TTFT"),
            "kv_transfer_p99_s": st.column_config.NumberColumn(
                "NIXL p99", format="%.0f", help="NIXL transfer time p99"),
            **ms_cfg})
    per_endpoint(info)
    by_context(info)
    with st.expander("How the split is made, and its caveats", expanded=not has_parts):
        for c in derive.TTFT_CAVEATS:
            st.markdown(f"- {c}")

    st.subheader("Diagnosis per sweep point")
    th = diagnose.Thresholds()
    verdicts = diagnose.diagnose(table.to_dict("records"), th)
    healthy = [v for v in verdicts if v.kind == diagnose.HEALTHY]
    for v in verdicts:
        if v.kind == diagnose.HEALTHY:
            continue
        icon = {"failed": ":red[:material/cancel:]",
                "unknown": ":gray[:material/help:]"}.get(v.kind, ":orange[:material/warning:]")
        with st.container(border=True):
            st.markdown(f"{icon} **{v.point}** — **{v.title}**")
            for e in v.evidence:
                st.markdown(f"- {e}")
            if v.also:
                st.caption("Also: " + "; ".join(v.also))
    if healthy:
        st.markdown(":green[:material/check_circle:] **healthy**: " +
                    ", ".join(v.point for v in healthy) +
                    " — no TTFT part is both ≥ "
                    f"{th.share:.0%} of client TTFT and ≥ {th.min_part_s * 1000:.0f} ms, "
                    "decode KV is not short, TPOT did not grow.")
        ui.verdict_list([(v.point, "healthy", v.evidence) for v in healthy])
    with st.expander("Rules and thresholds"):
        st.markdown(
            f"- **decode KV capacity**: decode KV usage max ≥ {th.kv_full:.0%} and (preemptions"
            f" > 0 or ≥ {th.waiting_capacity:g} request waiting for capacity on average)\n"
            f"- **prefill-bound**: prefill queue ≥ {th.share:.0%} of client TTFT, "
            f"≥ {th.min_part_s * 1000:.0f} ms and ≥ half the prefill compute time\n"
            f"- **KV transfer**: NIXL transfer time ≥ {th.share:.0%} of client TTFT and "
            f"≥ {th.min_part_s * 1000:.0f} ms, or any failed NIXL transfer\n"
            f"- **client/router**: the remainder ≥ {th.remainder_share:.0%} of client TTFT and "
            f"≥ {th.min_remainder_s * 1000:.0f} ms, or ≥ {th.failed_share:.0%} requests failed\n"
            f"- **decode compute**: mean TPOT ≥ {th.tpot_growth:g}× the run's best point while "
            f"KV < {th.kv_full:.0%} and no preemptions\n"
            f"- **DP imbalance**: the hottest decode engine's KV usage exceeds the mean by "
            f"≥ {th.imbalance_gap:.0%} (weakest rule: listed under *Also* when others fire)\n"
            "- the strongest rule wins (KV capacity first, then the largest share of TTFT); "
            "the others are listed under *Also*.")


def per_endpoint(info) -> None:
    """Each decode endpoint's share of the split: with several decodes behind the router
    (1P4D, ...) the point's mean hides the one that admits slowly or runs out of KV."""
    t = ui.decode_endpoints(info)
    if t.empty or t["endpoint"].nunique() < 2:
        return
    st.subheader("Decode admission per endpoint")
    st.caption("Per sweep point and decode endpoint, over the point's window: the requests "
               "it admitted, their mean wait for admission (D admission above is their mean "
               "over every endpoint), the endpoint's own mean TTFT and its peak KV use (its "
               "most used engine).")
    show = t.assign(admission_s=t["admission_s"] * 1000.0,
                    engine_ttft_s=t["engine_ttft_s"] * 1000.0, kv_max=t["kv_max"] * 100.0,
                    requests=t["requests"].round())
    num = st.column_config.NumberColumn
    ui.table(show, column_config={
        "requests": num("requests", format="%d"),
        "admission_s": num("D admission ms", format="%.0f"),
        "engine_ttft_s": num("D TTFT ms", format="%.0f"),
        "kv_max": num("KV max %", format="%.1f"),
    })


MAX_DOTS = 3000  # requests drawn as dots (a sample past that); the lines use every one


def by_context(info) -> None:
    """An agentic run (docs/agentic.md): each request's TTFT against its turn's context, from
    AIPerf's own per-request records, p50/p90 per context bucket, and the prefill compute
    line (a turn's whole context computed at the rate the prefills measured)."""
    ag = ui.agentic(info)
    if ag is None or ag.buckets.empty:
        return
    st.subheader("TTFT against the turn's context (agentic)")
    rec = ag.records
    ok = rec[(rec["phase"] == "profiling") & ~rec["error"]].dropna(subset=["ttft_ms",
                                                                       "context"])
    dots = ok.sample(MAX_DOTS, random_state=0) if len(ok) > MAX_DOTS else ok
    curves = []
    for r in ag.buckets.itertuples():
        curves += [{"point": r.point, "context": r.context_mean, "value": r.ttft_p50_ms,
                    "stat": "TTFT p50"},
                   {"point": r.point, "context": r.context_mean, "value": r.ttft_p90_ms,
                    "stat": "TTFT p90"}]
    for point, slope in ag.ms_per_token.items():
        ctx = ok.loc[ok["point"] == point, "context"]
        if slope and len(ctx):
            curves += [{"point": point, "context": float(c), "value": float(c) * slope,
                        "stat": "prefill compute line"} for c in (ctx.min(), ctx.max())]
    ui.altair(charts.ttft_vs_context(dots[["point", "context", "ttft_ms"]],
                                     pd.DataFrame(curves)))
    st.caption("Each request of each point (AIPerf's profile_export.jsonl: its TTFT and the "
               "server's prompt-token count, the session's history and the turn)"
               + (f", {MAX_DOTS:,} of {len(ok):,} drawn" if len(ok) > MAX_DOTS else "")
               + ". The prefill compute line is the turn's whole context computed at the rate "
               "the prefills measured over the point (vllm:request_prefill_time_seconds ÷ "
               "computed prompt tokens): TTFT well under it is the prefix cache saving work, "
               "TTFT at or over it is a turn computed again or waiting.")
    crossings = agentic.line_crossings(ag.buckets)
    if crossings:
        st.markdown("\n".join(f"- {c}" for c in crossings))
    show = ag.buckets[["point", "bucket", "requests", "context_mean", "ttft_p50_ms",
                       "ttft_p90_ms", "compute_ms", "over_line"]]
    num = st.column_config.NumberColumn
    ui.table(show, column_config={
        "bucket": st.column_config.TextColumn("context tokens"),
        "requests": num("requests", format="%d"),
        "context_mean": num("mean context", format="%.0f"),
        "ttft_p50_ms": num("TTFT p50 ms", format="%.0f"),
        "ttft_p90_ms": num("TTFT p90 ms", format="%.0f"),
        "compute_ms": num("compute line ms", format="%.0f",
                          help="the mean context × the prefills' ms per computed token"),
        "over_line": num("p50 ÷ line", format="%.2f",
                         help="below 1: prefix hits saved prefill work"),
    })


ui.live(info, body)
