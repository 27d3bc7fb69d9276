"""Overview of one run: topology, stage timeline, headline figures, accuracy, verdicts."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from dashboard import charts, derive, load, ui
from launcher.run.plandoc import PlanDoc

info = ui.header("Run overview")
if info is None:
    st.stop()


def body() -> None:
    plan = ui.plan(info)
    if plan is None:
        st.info("No plan.json: the launcher never planned this run, so there is no topology "
                "to show." if info.state != "empty" else "Nothing to show yet.")
        return
    table = ui.points(info)
    acc = load.read_accuracy(info.path)

    # Headline: the best point by total tokens/s per GPU (the published figure).
    ok = table[(table["status"] == "ok")] if not table.empty else table
    cols = st.columns(5)
    if not ok.empty and ok["total_tokens_per_s_per_gpu"].notna().any():
        best = ok.loc[ok["total_tokens_per_s_per_gpu"].idxmax()]
        cols[0].metric("Total tok/s per GPU (best point)",
                       ui.num(best["total_tokens_per_s_per_gpu"]),
                       help=derive.HEADLINE_TITLES["total_tokens_per_s_per_gpu"] +
                       f"; denominator: {derive.gpu_count(plan, 'total')} GPUs")
        cols[1].metric("Output tok/s per decode GPU", ui.num(
            best["output_tokens_per_s_per_decode_gpu"]),
            help=f"denominator: {derive.gpu_count(plan, 'decode')} decode GPUs")
        cols[2].metric("tok/s per user at that point", ui.num(best["tokens_per_s_per_user"],
                                                              ",.1f"))
        cols[3].metric("at concurrency", ui.num(best["concurrency"]))
    else:
        cols[0].metric("Total tok/s per GPU", "—")
        cols[1].caption("No successful sweep point yet." if table.empty or ok.empty else "")
    if acc:
        passed = acc.get("passed")
        cols[4].metric("GSM8K accuracy", ui.num(acc.get("accuracy"), ".1%"),
                       delta=f"{'pass' if passed else 'FAIL'} (threshold "
                             f"{ui.num(acc.get('threshold'), '.0%')})",
                       delta_color="normal" if passed else "inverse",
                       help=f"{acc.get('num_questions', '?')} questions")
    else:
        cols[4].metric("GSM8K accuracy", "—", help="accuracy/ has no result (not run yet, "
                                                     "skipped, or the run ended before it)")

    left, right = st.columns([3, 2])
    with left:
        ui.altair(charts.topology(topology_frame(plan)))
    with right:
        st.markdown(f"**{info.topology}**  \nmodel `{plan.model_path}` · "
                    f"mode {plan.mode} · engine {plan.engine}  \n"
                    f"GPUs: prefill {plan.gpus('prefill')}, decode {plan.gpus('decode')}, "
                    f"agg {plan.gpus('agg')}, total {plan.gpus()}")
        eps = pd.DataFrame([{"endpoint": e.name, "role": str(e.role),
                             "DP×TP": f"{e.dp_size}×{e.tp_size}",
                             "GPUs": e.gpus, "nodes": ", ".join(e.nodes),
                             "url": e.url} for e in plan.endpoints])
        st.dataframe(eps, hide_index=True, width="stretch", height=260)

    events = load.read_events(info.path)
    tl = stage_frame(events, info)
    if tl.empty:
        st.info("No stage events in events.jsonl yet.")
    else:
        ui.altair(charts.timeline(tl))

    verdicts = ui.verdicts(info)
    if verdicts:
        st.subheader("Bottleneck per sweep point")
        st.dataframe(pd.DataFrame([{"point": v.point, "verdict": v.title,
                                    "evidence": "; ".join(v.evidence)} for v in verdicts]),
                     hide_index=True, width="stretch")
    with st.expander(f"Events ({len(events)})"):
        if events:
            ev = pd.DataFrame(events)
            ev["time"] = [ui.fmt_time(t) for t in ev["ts"]]
            st.dataframe(ev.drop(columns=["ts"]), hide_index=True, width="stretch")


def topology_frame(plan: PlanDoc) -> pd.DataFrame:
    pinned = {}
    for p in plan.processes:
        for k, g in enumerate(p.gpus):
            pinned[(p.node, g)] = (p, p.dp_ranks[k] if k < len(p.dp_ranks) else None)
    rows = []
    for n in plan.nodes:
        for g in range(n.gpus):
            p, rank = pinned.get((n.name, g), (None, None))
            ep = (p.endpoint if p else None) or ""
            rows.append({"node": n.name, "gpu": g, "endpoint": ep or "free",
                         "process": p.name if p else "",
                         "ranks": "" if rank is None else f"DP rank {rank}",
                         "role": str(p.role) if p and p.role else "free",
                         "short": (ep.replace("prefill-", "P").replace("decode-", "D")
                                   .replace("agg-", "A") + (f"·{rank}" if rank is not None
                                                             else "")) if ep else ""})
    return pd.DataFrame(rows)


def stage_frame(events: list[dict], info: load.RunInfo) -> pd.DataFrame:
    starts: list[tuple[str, float]] = []
    seen = set()
    for e in events:
        st_name, ts = e.get("stage"), e.get("ts")
        if st_name and isinstance(ts, (int, float)) and st_name not in seen:
            seen.add(st_name)
            starts.append((st_name, float(ts)))
    if not starts:
        return pd.DataFrame()
    last_ts = max(float(e["ts"]) for e in events if isinstance(e.get("ts"), (int, float)))
    end_all = info.ended or last_ts
    rows = []
    for k, (name, ts) in enumerate(starts):
        end = starts[k + 1][1] if k + 1 < len(starts) else end_all
        if not math.isfinite(end) or end < ts:
            end = ts
        rows.append({"stage": name, "start": pd.to_datetime(ts, unit="s", utc=True),
                     "end": pd.to_datetime(max(end, ts + 1), unit="s", utc=True),
                     "seconds": end - ts})
    return pd.DataFrame(rows)


ui.live(info, body)
