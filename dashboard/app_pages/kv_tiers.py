"""KV tiers: where each prompt token came from (local hit, P→D handoff, store or offload hit,
computed) per sweep point and engine, the store hit rate against the trace's theoretical one,
and the KV store's and its master's health with the verdicts (docs/kv-store.md)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard import charts, ui
from launcher.analysis import kv_tiers, load
from launcher.run.rundir import RunDir

info = ui.header("KV tiers")
if info is None:
    st.stop()


@st.cache_data(max_entries=16, show_spinner="Reading tokens by source…")
def page_data(path: str, tel_fp: str, plan_fp: str, bench_fp: str) -> dict:
    ss = ui.series_for(path, tel_fp, "tiers", plan_fp)
    plan = load.read_plan_safe(Path(path))[0]
    points = load.load_bench(Path(path))
    health = kv_tiers.point_health(points, ss, plan)
    return {"health": health, "long": kv_tiers.sources_long(health),
            "reuse": kv_tiers.reuse(points, ss, plan), "rows": kv_tiers.health_rows(health),
            "any": kv_tiers.any_tier_data(health)}


def body(info) -> None:  # the run as re-read at each live refresh
    if ui.no_telemetry(info, "tokens-by-source telemetry"):
        return
    ui.series(info, "tiers")  # names any telemetry file it had to leave out
    data = page_data(str(info.path), load.telemetry_fingerprint(info.path),
                     load.fingerprint(RunDir(info.path).plan),
                     load.fingerprint(info.path / "bench"))
    health = data["health"]
    if not health:
        st.info("No sweep point with a measured window yet: tokens are counted over each "
                "point's window.")
        return
    long = data["long"]
    st.subheader("Where each prompt token came from")
    if long.empty:
        st.info("No vllm:prompt_tokens_by_source samples inside the sweep points' windows.")
    else:
        roles = [r for r in ("prefill", "agg", "decode") if r in set(long["role"])]
        for col, role in zip(st.columns(len(roles)), roles, strict=True):
            with col:
                ui.altair(charts.tokens_by_source(long[long["role"] == role], role))
        unsplit = [h["point"] for h in health
                   if len(h["sources"]) and (h["sources"]["split"] == "none").any()
                   and h["sources"]["external"].sum() > 0]
        st.caption("From vLLM's vllm:prompt_tokens_by_source (computed, local hit, external) "
                   "with the external tokens split by vllm:prompt_tokens_cached_by_source: "
                   "p2p = the P→D handoff (NIXL), external_unspecified = the Mooncake store, "
                   "host/disk = CPU offload (docs/kv-store.md).")
        if unsplit:
            st.warning("This vLLM exports no vllm:prompt_tokens_cached_by_source and the run "
                       "has a store or offload tier: its external tokens stay unsplit at "
                       + ", ".join(unsplit) + ".")
        pick = st.selectbox("Per engine at", [h["point"] for h in health],
                            index=len(health) - 1, key="tiers_point")
        src = next(h["sources"] for h in health if h["point"] == pick)
        show = src[["engine_key", "role", *kv_tiers.SOURCES, "total"]]
        ui.table(show, column_config={"engine_key": "engine", **{
            c: st.column_config.NumberColumn(kv_tiers.SOURCE_TITLES.get(c, c), format="%.0f")
            for c in (*kv_tiers.SOURCES, "total")}})
        st.caption("Prompt tokens per engine over the chosen point's window.")

    st.subheader("Hits against the trace's theoretical hit rate")
    reuse = data["reuse"]
    if reuse.empty:
        st.info("No prompt tokens counted in any sweep point's window.")
    else:
        ui.altair(charts.reuse_vs_theoretical(reuse))
        role = reuse["role"].iloc[0]
        theo = ("The tick is the trace's theoretical hit rate (an unbounded cache)."
                if reuse["theoretical"].notna().any() else
                "This run replayed no agentic trace, so there is no theoretical hit rate to "
                "set them against.")
        st.caption(f"On the {role} engines (the first to see each prompt). {theo}")

    st.subheader("KV store and master health")
    rows = data["rows"]
    shown = rows.dropna(axis=1, how="all")
    if not data["any"] or shown.shape[1] <= 1:
        st.info("No KV store or CPU offload in this run: no vllm:mooncake_store_* or "
                "vllm:kv_offload_* series and no mooncake_master scraped.")
        return
    pct = {"used_max", "watermark"}
    for title, cols in kv_tiers.HEALTH_GROUPS:
        cols = [c for c in cols if c in shown.columns]
        if not cols:
            continue
        st.markdown(f"**{title}**")
        ui.table(shown[["point", *cols]], column_config={
            c: st.column_config.NumberColumn(kv_tiers.HEALTH_TITLES.get(c, c),
                                             format="percent" if c in pct else "%.3g")
            for c in cols})
    st.caption("Per sweep point: the engines' vllm:mooncake_store_operation_* (get = "
               "load_get, put = save_put), vllm:kv_offload_* (the flat 0.33 names, else the "
               "deprecated ones, never both), and the master's admin /metrics "
               "(master_allocated_bytes ÷ master_total_capacity_bytes against its "
               "--eviction_high_watermark_ratio).")
    st.subheader("Store verdicts")
    items = [(h["point"], title, ev) for h in health for _, title, ev in h["verdicts"]]
    if items:
        ui.verdict_list(items)
    else:
        st.success(kv_tiers.healthy_sentence(health))


ui.live(info, body)
