"""GPUs and hosts: NVML series per GPU, psutil series per host and process, telemetry gaps."""

from __future__ import annotations

import re

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from launcher.analysis import derive, load
from launcher.run.rundir import RunDir

info = ui.header("GPUs and hosts")
if info is None:
    st.stop()

PREFERRED = ("power", "util", "sm_clock", "temp", "memory", "running", "cpu")
# Cumulative psutil/NVML fields drawn as rates (per second), like Prometheus counters.
COUNTER = re.compile(r"(_total$|_s$|^host:net_|ctx_switches|energy_mj$|nvlink_[rt]x_bytes$|"
                     r"violation_\w+_ns$)")


def is_counter(name: str) -> bool:
    return bool(COUNTER.search(name)) and not name.endswith(
        ("_pct", "_tok_s", "_mb_s", "_mib_s", "_kib_s"))


def unit_of(name: str) -> str:
    for suffix, unit in (("_pct", "%"), ("percent", "%"), ("_w", "W"), ("_mhz", "MHz"),
                         ("_c", "°C"), ("_bytes_total", "bytes"), ("_bytes", "bytes"),
                         ("_mib_s", "MiB/s"), ("_kib_s", "KiB/s"), ("_ns", "ns"),
                         ("_total", ""), ("_mj", "mJ"), ("_s", "s")):
        if name.endswith(suffix):
            return unit
    return ""


@st.cache_data(max_entries=16, show_spinner="Binning…")
def binned(path: str, tel_fp: str, plan_fp: str, family: str, name: str,
           step: float) -> pd.DataFrame:
    ss = ui.series_for(path, tel_fp, family, plan_fp)
    sel = ss.select(name)
    if sel.empty:
        return pd.DataFrame()
    t0, t1 = ss.t_range
    bins = derive.Bins.over(t0, t1, 240)
    kind = "counter" if is_counter(name) else "gauge"
    m = (derive.counter_bins(ss, sel.index, bins) if kind == "counter"
         else derive.gauge_bins(ss, sel.index, bins, step))
    keys = sel[["node", "process", "engine", "labels", "role"]].reset_index(drop=True)
    labels = [derive.parse_labels(s) for s in keys["labels"]]

    def label(n: str, p: str, e: str, d: dict) -> str:
        if "index" in d:
            return f"{n} · GPU {d['index']}"
        extra = " · ".join(f"{v}" for k, v in sorted(d.items()) if k != "uuid")
        head = f"{n} · {p}" if p else n
        return " · ".join(x for x in (head, f"e{e}" if e else "", extra) if x)

    keys["series"] = [label(n, p, e, d) for n, p, e, d in
                      zip(keys["node"], keys["process"], keys["engine"], labels, strict=True)]
    keys["role"] = [r if p else "free" for r, p in zip(keys["role"], keys["process"], strict=True)]
    out = derive.long_frame(m, keys[["series", "node", "role"]], bins)
    out.attrs["bin_s"] = bins.width
    return out


def family_section(family: str, what: str, plan_fp: str, step: float) -> None:
    ss = ui.series(info, family)
    if len(ss) == 0:
        st.info(f"No {what} samples (`{family}*`) in this run's telemetry." +
                (" Why: the agent notices on the **Gaps and agent notes** tab of this page "
                 "(e.g. NVML not found on the node)." if family == "gpu:" else ""))
        return
    names = sorted(ss.meta["name"].unique())
    default = next((i for p in PREFERRED for i, n in enumerate(names) if p in n), 0)
    name = st.selectbox(f"{what} metric", names, index=default, key=f"metric_{family}")
    df = binned(str(info.path), load.telemetry_fingerprint(info.path), plan_fp, family, name,
                step)
    if df.empty:
        st.info(f"{name} has no samples.")
        return
    bin_s = df.attrs.get("bin_s", 60.0)
    unit = unit_of(name)
    if is_counter(name):
        unit = f"{unit}/s" if unit and not unit.endswith("/s") else (unit or "per s")
        st.caption(f"{name} is cumulative: drawn as its rate per second.")
    if df["value"].max() == df["value"].min():
        st.info(f"{name} is constant at {df['value'].iloc[0]:,.4g} {unit} for the whole run.")
        return
    n_series = df["series"].nunique()
    if family == "gpu:" or n_series > 12:
        lo, hi = float(df["value"].min()), float(df["value"].max())
        ui.altair(charts.heatmap(df, title=f"{name} per {'GPU' if family == 'gpu:' else 'series'}"
                                 f" ({unit or 'value'}), {bin_s:g} s bins", y="series",
                                 color_title=unit or name, color_format=",.0f",
                                 domain=(lo, hi), bin_s=bin_s, clock=ui.clock(info)))
        by_role = df.groupby(["role", "t"], as_index=False)["value"].mean().rename(
            columns={"role": "group"})
        ui.altair(charts.line(by_role, title=f"{name}: mean per role", y_title=unit or name,
                              color_title="role", windows=ui.windows_frame(info),
                              clock=ui.clock(info)))
    else:
        ui.altair(charts.line(df.rename(columns={"series": "group"}), title=name,
                              y_title=unit or name, color_title="series",
                              windows=ui.windows_frame(info), clock=ui.clock(info)))


def body(info) -> None:  # the run as re-read at each live refresh
    ui.run_notes(info, about="telemetry of")
    if ui.no_telemetry(info, "GPU or host telemetry"):
        return
    plan = ui.plan(info)
    step = plan.telemetry_interval_s if plan else 1.0
    plan_fp = load.fingerprint(RunDir(info.path).plan)
    tab_gpu, tab_host, tab_proc, tab_log, tab_gaps = st.tabs(
        ["GPUs (NVML)", "Hosts", "Processes", "vLLM stats log", "Gaps and agent notes"])
    with tab_gpu:
        family_section("gpu:", "GPU", plan_fp, step)
    with tab_host:
        family_section("host:", "Host", plan_fp, step)
    with tab_proc:
        family_section("proc:", "Process", plan_fp, step)
    with tab_log:
        st.caption("Parsed from the engines' periodic stats lines (`Engine NNN: ...`, "
                   "`KV Transfer metrics: ...`): the fallback when /metrics was not scraped. "
                   "NIXL figures are pooled across TP ranks.")
        family_section("log:", "Stats-log", plan_fp, step)
    with tab_gaps:
        gaps = load.read_gaps(info.path)
        if gaps is None or len(gaps) == 0:
            st.success("No telemetry gaps recorded: every source answered every interval.")
        else:
            g = gaps.copy()
            g["start"] = [ui.fmt_time(t) for t in g["start"]]
            g["end"] = [ui.fmt_time(t) if t == t else "still open" for t in g["end"]]
            ui.table(g)
        agents = load.read_agent_info(info.path) or {}
        notes = [(n, x) for n, a in sorted(agents.items()) for x in (a.get("notices") or [])]
        if notes:
            st.markdown("**Agent notices**")
            ui.text_table(pd.DataFrame(notes, columns=["node", "notice"]))


ui.live(info, body)
