"""Overview of one run: topology, stage timeline, headline figures, accuracy, verdicts."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from launcher.analysis import derive, load
from launcher.run.plandoc import PlanDoc

info = ui.header("Run overview")
if info is None:
    st.stop()


def body(info) -> None:  # the run as re-read at each live refresh
    ui.progress_panel(info)
    ui.run_notes(info)
    plan = ui.plan(info)
    if plan is None and not info.plan_error:
        st.info("No plan.json: the launcher never planned this run, so there is no topology "
                "to show." if info.state != "empty" else "Nothing to show yet.")
        return
    table = ui.points(info)
    acc = load.read_accuracy(info.path)

    # Headline: the best point by total tokens/s per GPU (the published figure).
    ok = table[(table["status"] == "ok")] if not table.empty else table
    cols = st.columns(4)  # four fit their labels at 1280 px; the point is the first's delta
    if not ok.empty and ok["total_tokens_per_s_per_gpu"].notna().any():
        best = ok.loc[ok["total_tokens_per_s_per_gpu"].idxmax()]
        cols[0].metric("tok/s per working GPU, best", ui.num(best["total_tokens_per_s_per_gpu"]),
                       delta=f"at {best['point']}", delta_color="off", delta_arrow="off",
                       help=derive.HEADLINE_TITLES["total_tokens_per_s_per_gpu"] +
                       f"; denominator: {derive.gpu_count(plan, 'total')} GPUs; the best "
                       "sweep point by this measure")
        cols[1].metric("out tok/s per decode GPU", ui.num(
            best["output_tokens_per_s_per_decode_gpu"]),
            help=f"Output tokens/s ÷ {derive.gpu_count(plan, 'decode')} decode GPUs, at the "
                 "same point")
        cols[2].metric("tok/s per user", ui.num(best["tokens_per_s_per_user"], 1),
                       help="1000 ÷ median TPOT (ms) at the same point")
    else:
        cols[0].metric("Total tok/s per working GPU", "—")
        cols[1].caption("No successful sweep point yet." if table.empty or ok.empty else "")
    if acc:
        from launcher.run.figures import accuracy_line, harness_of

        passed = acc.get("passed")
        cols[3].metric(f"GSM8K accuracy ({harness_of(acc)})", ui.pct(acc.get("accuracy")),
                       delta=f"{'pass' if passed else 'FAIL'} (threshold "
                             f"{ui.pct(acc.get('threshold'), 0)})",
                       delta_color="normal" if passed else "inverse",
                       help=f"{acc.get('num_questions', '?')} questions, scored by the "
                            f"{harness_of(acc)} harness")
        # which harness and figure the verdict used; the published figure only beside its own
        st.caption(accuracy_line(acc))
    else:
        cols[3].metric("GSM8K accuracy", "—", help="accuracy/ has no result (not run yet, "
                                                     "skipped, or the run ended before it)")

    if plan is None:
        ui.plan_damaged(info, "The topology (nodes, GPUs, endpoints)")
    else:
        topology_panel(info, plan)
    if info.study:
        st.page_link("app_pages/study.py", label=f"This run is one configuration of study "
                     f"{info.study}: compare them all on the Study page",
                     icon=":material/compare_arrows:", query_params={"study": info.study})

    events = load.read_events(info.path)
    tl = stage_frame(events, info)
    if tl.empty:
        st.info("No stage events in events.jsonl yet.")
    else:
        ui.altair(charts.timeline(tl, clock=ui.clock(info)))
        from launcher.run import figures
        from launcher.run.rundir import RunDir

        rd = RunDir(info.path)
        cost = figures.lifecycle_line(figures.lifecycle(
            rd, plan, figures.allocated_gpus(plan) if plan else None))
        if cost:
            st.caption(f"Cost: {cost}")
        summary = load.read_json_safe(rd.summary)
        sig = figures.signals_line(summary.get("log_signals") if isinstance(summary, dict) else None)
        st.caption(f"Log signals: {sig}" if sig else
                   "Log signals (crashes, CUDA OOM, NCCL, KV transfer failures, tracebacks, "
                   "preemptions) are counted from the process logs when the run ends.")

    verdicts = ui.verdicts(info)
    if verdicts:
        st.subheader("Bottleneck per sweep point")
        ui.verdict_list([(v.point, v.title, v.evidence + ([f"also: {'; '.join(v.also)}"]
                                                          if v.also else []))
                         for v in verdicts])
    ui.report_panel(info.path, "run")
    with st.expander(f"Events ({len(events)}), times as in events.jsonl"):
        if events:
            ui.table(events_frame(events, info))


def topology_panel(info, plan: PlanDoc) -> None:
    left, right = st.columns([3, 2])
    with left:
        ui.altair(charts.topology(topology_frame(plan)))
    with right:
        st.markdown(f"**{info.topology}**  \nmodel `{plan.model_path}` · "
                    f"mode {plan.mode} · engine {plan.engine}  \n"
                    f"GPUs: prefill {plan.gpus('prefill')}, decode {plan.gpus('decode')}, "
                    f"agg {plan.gpus('agg')}, total {plan.gpus()}")
        identity_panel(info)
    # the endpoints, full width: URLs and node lists stay readable
    eps = pd.DataFrame([{"endpoint": e.name, "role": str(e.role), "shape": e.shape,
                         "GPUs": e.gpus, "nodes": ", ".join(e.nodes), "url": e.url}
                        for e in plan.endpoints])
    ui.table(eps)  # columns as wide as their text: the whole table fits at 1280 px


def events_frame(events: list[dict], info: load.RunInfo) -> pd.DataFrame:
    """events.jsonl as a table: local time (as fmt_time everywhere), seconds since the job
    started, the event and its fields."""
    ev = pd.DataFrame(events)
    ts = pd.to_numeric(ev.get("ts"), errors="coerce")
    origin = info.started or (float(ts.min()) if ts.notna().any() else None)
    front = pd.DataFrame({"time": [ui.fmt_time(t) if t == t else "—" for t in ts],
                          "since start": [f"{t - origin:+,.1f} s" if origin and t == t
                                          else "—" for t in ts]})
    rest = ev.drop(columns=["ts"]).astype(object).where(ev.drop(columns=["ts"]).notna(), "")
    return pd.concat([front, rest.astype(str)], axis=1)


def identity_panel(info) -> None:
    """What exactly ran (preflight's findings), and the KV transport UCX chose: a silent
    fall-back to TCP is the first thing to see when transfers are slow."""
    ident = info.identity
    if not ident:
        return
    from launcher.run.figures import fingerprint_lines
    from launcher.run.rundir import RunDir

    bits = [f"**{k}**: {v}" for k, v in
            fingerprint_lines(ident, RunDir(info.path).read_submission().launcher)]
    if ident.get("slurm_job_id"):
        bits.append(f"**Slurm job**: {ident['slurm_job_id']}")
    if bits:
        st.markdown("  \n".join(bits))
    transport = ident.get("kv_transport") or {}
    if transport:
        cfgs = sorted({c for v in transport.values() for c in v})
        tcp = [c for c in cfgs if c.startswith("tcp/")]
        text = f"KV transfers over {', '.join(cfgs)} ({info.engine_kind.kv_report})"
        (st.warning if tcp else st.caption)(
            text + (": TCP, not NVLink/RDMA, check UCX_TLS" if tcp else ""))


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


ui.live(info, body, panel=True)
