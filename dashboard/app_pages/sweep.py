"""Sweep: throughput per GPU vs tokens/s per user (Pareto) across points and runs, and
TTFT/TPOT percentiles vs concurrency."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from launcher.analysis import derive
from launcher.run import figures

info = ui.header("Sweep")
if info is None:
    st.stop()

Y_CHOICES = {
    "total_tokens_per_s_per_gpu": "Total tok/s per working GPU (÷ prefill + decode GPUs)",
    "output_tokens_per_s_per_decode_gpu": "Output tok/s per decode GPU (÷ decode GPUs)",
    "input_tokens_per_s_per_prefill_gpu": "Input tok/s per prefill GPU (÷ prefill GPUs)",
}


def run_points(run) -> pd.DataFrame:
    t = ui.points(run)
    if t.empty:
        return t
    t = t.copy()
    mark = run.engine_kind.legend_mark  # short: a run's name is long already
    t["run"] = run.run_id + (f" ({mark})" if mark else "")
    v = {x.point: x.label for x in ui.verdicts(run)}
    t["verdict"] = t["point"].map(v).fillna("—")
    return t


def points_tables(t: pd.DataFrame, energy: list[str]) -> None:
    """One run's points: throughput with the verdict, then latency and energy."""
    num = st.column_config.NumberColumn
    lead = ["point"] + ([] if (t["status"] == "ok").all() else ["status"])
    ui.table(t[lead + ["total_tokens_per_s_per_gpu", "output_tokens_per_s_per_decode_gpu",
                       "input_tokens_per_s_per_prefill_gpu", "tokens_per_s_per_user",
                       "request_rate", "verdict"]], column_config={
        "total_tokens_per_s_per_gpu": num("tok/s/working GPU", format="%.0f",
                                          help="total tok/s ÷ the GPUs of the endpoints "
                                               "(prefill + decode), the published measure"),
        "output_tokens_per_s_per_decode_gpu": num("out/decode GPU", format="%.0f",
                                                  help="output tok/s ÷ decode GPUs"),
        "input_tokens_per_s_per_prefill_gpu": num("in/prefill GPU", format="%.0f",
                                                  help="input tok/s ÷ prefill GPUs"),
        "tokens_per_s_per_user": num("tok/s/user", format="%.1f"),
        "request_rate": num("req/s", format="%.2f"),
    })
    lat = t[["point", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", *energy]].copy()
    for c in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"):
        lat[c] = lat[c] * 1000.0
    ui.table(lat, column_config={
        "ttft_p50_s": num("TTFT p50 ms", format="%.0f"),
        "ttft_p99_s": num("TTFT p99 ms", format="%.0f"),
        "tpot_p50_s": num("TPOT p50 ms", format="%.1f"),
        "tpot_p99_s": num("TPOT p99 ms", format="%.1f"),
        "joules_per_output_token": num("J/output token", format="%.3f",
                                       help="NVML energy of the prefill and decode GPUs over "
                                            "the window ÷ output tokens"),
        "joules_per_request": num("J/request", format="%.1f"),
    })


def body(info) -> None:  # the run as re-read at each live refresh
    if info.study:
        st.page_link("app_pages/study.py", label=f"This run is one configuration of study "
                     f"{info.study}: every configuration on one Pareto chart",
                     icon=":material/compare_arrows:", query_params={"study": info.study})
    others = [i for i in ui.run_infos() if i.run_id != info.run_id and i.points > 0]
    c1, c2 = st.columns([3, 2])
    compare = c1.multiselect(
        "Compare with runs (e.g. the same recipe with 4..8 prefill endpoints)",
        [i.run_id for i in others], key="sweep_compare",
        help="Each run is drawn in its own colour with its own Pareto frontier.")
    y = c2.selectbox("Throughput measure", list(Y_CHOICES), format_func=Y_CHOICES.get,
                     key="sweep_y")
    runs = [info] + [i for i in others if i.run_id in compare]
    table = pd.concat([run_points(r) for r in runs], ignore_index=True) if runs else None
    if table is None or table.empty:
        st.info("No sweep results in bench/ yet: the sweep has not started, or the run ended "
                "before its first point finished.")
        return
    ok = table[table["status"] == "ok"]
    failed = table[table["status"] != "ok"]
    if not failed.empty:
        st.warning("Failed points (left out of the charts):\n" + "\n".join(
            f"- {r.run} {r.point}: {r.failure_reason or 'no completed requests'}"
            for r in failed.itertuples()))
    if ok.empty:
        st.info("Every sweep point failed, so there is nothing to draw.")
        return
    if info.plan_error:
        ui.plan_damaged(info, "Throughput per GPU (its GPU counts)")
    front = pd.concat([derive.pareto_frontier(g, "tokens_per_s_per_user", y).assign(run=r)
                       for r, g in ok.groupby("run")], ignore_index=True)
    ui.altair(charts.pareto(ok, front, y=y, y_title=Y_CHOICES[y]))
    st.caption("x = 1000 ÷ median TPOT (ms), the interactivity one user sees; y names its "
               "denominator. Points are labelled with the max concurrency of the point.")

    lat = []
    for m in ("ttft", "tpot"):
        for q in ("p50", "p90", "p99"):
            col = f"{m}_{q}_s"
            if col in ok:
                lat.append(ok[["run", "concurrency"]].assign(
                    metric=m.upper(), stat=q, value=ok[col] * 1000.0))
    lat_df = pd.concat(lat, ignore_index=True).dropna(subset=["value"]) if lat else None
    l1, l2 = st.columns(2)
    for col, metric in ((l1, "TTFT"), (l2, "TPOT")):
        d = lat_df[lat_df["metric"] == metric] if lat_df is not None else pd.DataFrame()
        with col:
            if d.empty:
                st.info(f"No {metric} percentiles in the bench files.")
            else:
                ui.altair(charts.latency_vs_concurrency(
                    d, metric=metric, title=f"{metric} p50/p90/p99 vs concurrency"))

    energy = [c for c in ("joules_per_output_token", "joules_per_request")
              if c in table and table[c].notna().any()]
    st.caption("Per point: throughput, then latency (ms) and energy; per-GPU figures in "
               "tokens/s."
               + (" Energy from NVML's energy counter of the working GPUs over each "
                  "measured window." if energy else
                  " Energy: no NVML energy counter in this run's telemetry (absent, not 0)."))
    # two tables a run, each fits the page at 1280 px (one of 13 columns did not)
    groups = list(table.groupby("run", sort=False))
    for run, t in groups:
        if len(groups) > 1:
            st.markdown(f"**{run}**")
        points_tables(t, energy)
    speculative(table)
    if not agentic(info):
        lengths_sent(info)


def agentic(info) -> bool:
    """An agentic run's points (benchmark.agentic, docs/agentic.md): live sessions against
    the prefill's prefix-cache hit rate and TTFT, from AIPerf's files and the engines'
    counters. False when the run has none."""
    rows = []
    verdicts = None
    for p in ui.bench(info):
        ag = p.get("agentic")
        if not isinstance(ag, dict) or p.get("status") != "ok":
            continue
        if verdicts is None:
            verdicts = {v.concurrency: v for v in ui.verdicts(info)}
        hit, offered = ag.get("prefix_hit_rate"), figures.offered_hit_rate(ag)
        turns = ag.get("per_turn") or []
        v = verdicts.get(float(ag.get("sessions") or p.get("max_concurrency") or 0))
        tiers = ag.get("tier_hit_rate")
        rows.append({"sessions": ag.get("sessions"),
                     "hit": None if hit is None else hit * 100.0,
                     "tiers": None if tiers is None else tiers * 100.0,
                     "offered": None if offered is None else offered * 100.0,
                     "verdict": v.label if v else None,
                     "ttft_p90": p.get("p90_ttft_ms"),
                     "ttft_first": turns[0].get("mean_ttft_ms") if turns else None,
                     "ttft_later": _mean([t.get("mean_ttft_ms") for t in turns[1:]]),
                     "interactivity": ag.get("interactivity_tok_s"),
                     "requests": p.get("completed"), "turns": len(turns)})
    if not rows:
        return False
    st.subheader("Agentic sessions")
    st.caption("Per point, AIPerf's replay at that many live sessions: the prefills' "
               "prefix-cache hit rate in their own (GPU) KV over the point "
               "(vllm:prefix_cache_hits ÷ queries, the engines' own counters as AIPerf "
               "recorded them; with a KV store or CPU offload, what it served: "
               "vllm:external_prefix_cache_hits ÷ queries) beside the rate the trace "
               "offers (each turn's resent session context over all its prompt tokens), "
               "the point's verdict, TTFT p90, mean TTFT of first "
               "and of later turns (AIPerf's per-request records), interactivity = 1000 ÷ "
               "ITL p90 (ms).")
    t = pd.DataFrame(rows).sort_values("sessions")
    ui.altair(charts.hit_rate_vs_sessions(t))
    for v in verdicts.values():
        if v.kind == "kv-capacity-cliff":
            st.warning(f"c={v.concurrency:g}: {v.title}. " + "; ".join(v.evidence))
    num = st.column_config.NumberColumn
    # two tables: the ten columns in one did not fit the page at 1280 px
    # a store or CPU offload's hits beside the GPU's, where the run has one
    tiers = ["tiers"] if t["tiers"].fillna(0).gt(0).any() else []
    ui.table(t[["sessions", "hit", *tiers, "offered", "verdict", "requests", "turns"]],
             column_config={
        "sessions": num("live sessions", format="%d"),
        "hit": num("GPU prefix hit %", format="%.1f"),
        "tiers": num("store/offload hit %", format="%.1f"),
        "offered": num("the trace offers %", format="%.1f"),
        "verdict": st.column_config.TextColumn("verdict"),
        "requests": num("requests", format="%d"), "turns": num("turns", format="%d")})
    ui.table(t[["sessions", "ttft_p90", "ttft_first", "ttft_later", "interactivity"]],
             column_config={
        "sessions": num("live sessions", format="%d"),
        "ttft_p90": num("TTFT p90 ms", format="%.0f"),
        "ttft_first": num("TTFT first turn ms", format="%.0f"),
        "ttft_later": num("TTFT later turns ms", format="%.0f"),
        "interactivity": num("interactivity tok/s", format="%.1f")})
    st.caption("TTFT against each turn's context: the TTFT breakdown page; KV use, prefix "
               "hits and the queue over a point: the KV cache page.")
    sessions_per_decode(info)
    return True


def sessions_per_decode(info) -> None:
    """How the router spread the sessions over the decode endpoints, per point, from the
    decodes' own per-request lines (a session is its conversation)."""
    ag = ui.agentic(info)
    st.subheader("Sessions per decode endpoint")
    if ag is None or ag.sessions.empty:
        st.info("The decodes logged no per-request line, so how the sessions spread is not "
                "known: the simulator logs one per chat request with --enable-log-requests "
                "(decode.args.enable-log-requests: true); real vLLM's line does not name "
                "the conversation and is not read yet.")
        return
    t = ag.sessions
    ui.altair(charts.sessions_per_endpoint(t))
    split = int(t["split"].sum())
    if split:
        st.warning(f"{split} session(s) had turns on more than one decode endpoint: the router "
                   "did not keep them on one decode (router.decode_policy), so their "
                   "prefixes were transferred again.")
    else:
        st.caption("Every session's turns reached one decode endpoint.")
    num = st.column_config.NumberColumn
    ui.table(t, column_config={
        "endpoint": st.column_config.TextColumn("decode endpoint"),
        "sessions": num("sessions", format="%d"), "requests": num("requests", format="%d"),
        "split": num("also on another decode", format="%d",
                     help="sessions of this point with a turn on another decode endpoint")})


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return sum(xs) / len(xs) if xs else None


def speculative(table: pd.DataFrame) -> None:
    """Speculative decoding (MTP, EAGLE, ...) per point: how much of each draft the target
    accepted, from vLLM's spec_decode counters over the point's window."""
    if "spec_acceptance_rate" not in table or not table["spec_acceptance_rate"].notna().any():
        return
    st.subheader("Speculative decoding")
    st.caption("Per point, over its measured window (vLLM's vllm:spec_decode_* counters of "
               "every engine): accepted ÷ drafted tokens; mean acceptance length = 1 + "
               "accepted ÷ drafts (the target's own token counts); the rate at each draft "
               "position.")
    t = table[table["spec_acceptance_rate"].notna()]
    num = st.column_config.NumberColumn
    cols = (["run"] if t["run"].nunique() > 1 else []) + [
        "point", "spec_acceptance_rate", "spec_mean_acceptance_length", "spec_per_position",
        "tokens_per_s_per_user"]
    rows = t[cols].assign(spec_acceptance_rate=t["spec_acceptance_rate"] * 100.0,
                          spec_per_position=t["spec_per_position"].fillna("—"))
    ui.table(rows, column_config={
        "spec_acceptance_rate": num("acceptance %", format="%.1f"),
        "spec_mean_acceptance_length": num("mean acceptance length", format="%.2f"),
        "spec_per_position": st.column_config.TextColumn("per position"),
        "tokens_per_s_per_user": num("tok/s/user", format="%.1f"),
    })


def lengths_sent(info) -> None:
    """The lengths the requests really had, per point, beside the rule's bounds."""
    plan = ui.plan(info)
    rule = (plan.workload.get("text") if plan else None) or "not recorded (an older plan.json)"
    rows = []
    for p in ui.bench(info):
        got = figures.realized_lengths(p)
        if got:
            rows.append({"point": f"c={p.get('max_concurrency')}", "requests": got["requests"],
                         **{f"{k}_{s}": got[k][s] for k in ("input", "output")
                            for s in ("min", "mean", "max")}})
    st.subheader("Lengths sent")
    st.caption(f"The workload: {rule}. Each point's requests as recorded (input: the "
               "engine's own prompt-token count).")
    if not rows:
        st.info("No point recorded its requests' lengths (a vllm bench serve file without "
                "--save-detailed, from before the launcher asked for it).")
        return
    num = st.column_config.NumberColumn
    ui.table(pd.DataFrame(rows), column_config={
        **{f"{k}_{s}": num(f"{k} {s}", format="%.1f" if s == "mean" else "%d")
           for k in ("input", "output") for s in ("min", "mean", "max")},
        "requests": num("requests", format="%d")})


ui.live(info, body)
